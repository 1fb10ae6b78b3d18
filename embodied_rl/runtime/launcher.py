"""The driver: start Ray, one DAG worker per device bundle, watch them, report.

The driver never receives batch data: it sends each worker the resolved config, and gets back
only small status and metric records (the newest are kept in ``RunResult.records``, so a test
can check that).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from embodied_rl.devices import actor_options, bundle, device_spec
from embodied_rl.metrics import ProgressBar
from embodied_rl.runtime import cluster
from embodied_rl.runtime.config import section, validate_config
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.memory import worker_process_env
from embodied_rl.runtime.preemption import (
    PREEMPTED_EXIT_CODE,
    Preemption,
    Terminated,
    interrupted_message,
    mark_stopped,
    preempted_message,
    terminated_message,
)
from embodied_rl.runtime.run_folder import (
    check_eval_source,
    eval_output_folder,
    prepare_train_folder,
    record_command,
)
from embodied_rl.trackers.base import FAILED, FINISHED, KILLED
from embodied_rl.trackers.feed import TrackerFeed, open_trackers

_KEPT_RECORDS = 1000  # newest status/result records the driver keeps (RunResult.records)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours a task error's header, even in a log file


class RunFailed(RuntimeError):
    """A worker failed or died, or the cluster cannot run the job; the message names the
    rank, node and step, or what the cluster lacks, and the fix."""

    exit_code = 1  # of the CLI


class RunInterrupted(RunFailed):
    """The user stopped the run (Ctrl-C / SIGINT); the message says what was kept."""

    exit_code = 130  # the shell's code for SIGINT


class RunPreempted(RunInterrupted):
    """SIGTERM stopped the run (a preemption, ``runtime/preemption.py``); the message names
    the newest checkpoint and the resume command."""

    exit_code = PREEMPTED_EXIT_CODE


def _stopped_error(stop: BaseException, run_dir: Path, mode: str) -> RunInterrupted:
    """What the user is told once the workers stopped after Ctrl-C or SIGTERM."""
    if isinstance(stop, Terminated):
        return RunPreempted(terminated_message(run_dir, mode, stop.reason))
    return RunInterrupted(interrupted_message(run_dir, mode))


class _WorkerError(Exception):
    """Internal: worker ``rank`` raised or died with ``error``."""

    def __init__(self, rank: int, error: Exception) -> None:
        super().__init__(rank, error)
        self.rank, self.error = rank, error


@dataclass
class RunResult:
    run_dir: Path
    final_metrics: dict[str, float]
    records: list[Any] = field(default_factory=list)
    trackers: dict[str, Any] = field(default_factory=dict)  # trackers.json: their run ids


def resolve_run_dir(cfg: DictConfig, mode: str = "train") -> Path:
    """Where the run lives.

    ``run_dir`` if set. Otherwise ``resume=true`` (and ``eval``) take the newest run of this
    config that has checkpoints; a new training run gets a fresh timestamped directory (an
    eval with no earlier run gets one too, which ``run_folder.check_eval_source`` refuses).
    """
    if cfg.get("run_dir"):
        return Path(cfg.run_dir).resolve()
    root = Path(cfg.get("output_root") or "outputs").resolve() / str(cfg.name)
    runs = sorted(p for p in root.glob("*") if (p / "checkpoints").is_dir())
    if cfg.get("resume") or mode == "eval":
        if runs:
            return runs[-1]
        if mode != "eval":
            raise ConfigError(
                f"resume=true but no earlier run with checkpoints under {root}",
                "set run_dir=<a run folder with checkpoints/>, or drop resume=true to start a "
                "new run",
            )
    return root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def ray_init_kwargs(cfg: DictConfig, num_workers: int, cpus_per_worker: float) -> dict[str, Any]:
    """The arguments of ``ray.init``: join ``ray.address``, or start an embedded cluster.

    The embedded cluster is always a new one (``address="local"``): a plain ``ray.init()``
    would join a cluster that ``ray start`` left running on this machine, and refuse our
    ``num_cpus``. It runs without the dashboard: anyone who reaches the dashboard can submit
    jobs, i.e. run code. Its host is pinned to 127.0.0.1 as well, in case some Ray version
    starts its HTTP server anyway. A cluster joined through ``ray.address`` keeps the dashboard
    settings it was started with (``ray start --include-dashboard=false`` there).
    Ray's INFO lines ("Started a local Ray instance.") stay off the embedded cluster's console;
    joining a cluster prints one line, with its dashboard address.
    """
    ray_cfg = section(cfg, "ray")
    if ray_cfg.address:
        return {"address": ray_cfg.address, "log_to_driver": True}
    # Over-subscribe logical CPUs when needed: the workers mostly wait on each other.
    need = int(num_workers * cpus_per_worker + 0.999)
    return {
        "address": "local",
        "num_cpus": ray_cfg.num_cpus or max(os.cpu_count() or 1, need),
        "include_dashboard": False,
        "dashboard_host": "127.0.0.1",
        "log_to_driver": True,
        "logging_level": logging.WARNING,
    }


def start_ray(cfg: DictConfig, num_workers: int, cpus_per_worker: float) -> bool:
    """Connect to ``ray.address`` or start an embedded cluster; returns True if we started it.

    Raises:
        RunFailed: ``ray.address`` cannot be reached or joined (the message says the fix).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs = ray_init_kwargs(cfg, num_workers, cpus_per_worker)
    joining = kwargs["address"] != "local"
    try:
        if joining:
            cluster.check_reachable(kwargs["address"], section(cfg, "ray").connect_timeout_s)
        ray.init(**kwargs)
    except cluster.ClusterError as err:
        raise RunFailed(str(err)) from None
    except ConnectionError as err:
        raise RunFailed(str(cluster.connect_error(kwargs["address"], err))) from None
    return not joining


def place_workers(cfg: DictConfig, n: int, worker_bundle: dict[str, float]) -> Any:
    """A placement group of one bundle per worker, placed; raises RunFailed if it cannot be."""
    from ray.util.placement_group import placement_group, remove_placement_group

    ray_cfg = section(cfg, "ray")
    try:
        cluster.check_capacity(n, worker_bundle, ray_cfg.placement_strategy)
        group = placement_group([worker_bundle] * n, strategy=ray_cfg.placement_strategy)
    except cluster.ClusterError as err:
        raise RunFailed(str(err)) from None
    try:
        cluster.wait_placed(group, ray_cfg.placement_timeout_s, n, worker_bundle)
    except cluster.ClusterError as err:
        remove_placement_group(group)
        raise RunFailed(str(err)) from None
    return group


def preview_placement(cfg: DictConfig) -> str:
    """Where the ranks of ``cfg`` would run (``embodied-rl plan``).

    With ``ray.address`` the cluster is asked for real: a placement group like the run's is
    placed, read and removed again. The embedded cluster puts every rank on this machine.
    """
    import ray
    from ray.util.placement_group import remove_placement_group

    workers_cfg = section(cfg, "workers")
    n = workers_cfg.num_workers
    if not section(cfg, "ray").address:
        return f"placement: {n} worker(s) on this machine (embedded Ray cluster)"
    connected_before = ray.is_initialized()
    start_ray(cfg, n, workers_cfg.cpus_per_worker)
    try:
        group = place_workers(
            cfg, n, bundle(device_spec(str(cfg.device)), workers_cfg.cpus_per_worker)
        )
        try:
            return cluster.format_placement(cluster.placement(group))
        finally:
            remove_placement_group(group)
    finally:
        if not connected_before:
            ray.shutdown()


def _record_placement(run_dir: Path, rank_nodes: list[str]) -> None:
    """``placement.json``: the Ray node of every rank; logged when the run spans nodes."""
    (run_dir / "placement.json").write_text(json.dumps({"rank_nodes": rank_nodes}, indent=1))
    if len(set(rank_nodes)) > 1:
        print(cluster.format_placement(rank_nodes), flush=True)


def _clear_status_files(run_dir: Path) -> None:
    """Remove the status files of an earlier attempt (a resumed run reuses its run_dir).

    A worker that dies before it writes its own file must not be blamed on the node an
    earlier process of the same rank died in.
    """
    for path in (run_dir / ".status").glob("rank_*.json"):
        path.unlink(missing_ok=True)


def launch(
    cfg: DictConfig, show_progress: bool = True, mode: str = "train", command: str | None = None
) -> RunResult:
    """Validate, start the workers, run to completion, and return rank 0's final metrics.

    ``mode="eval"`` runs the evaluation DAG once on the run's newest checkpoint and writes
    everything to a new folder ``<run_dir>/<eval.name>_<timestamp>/`` (``RunResult.run_dir``).
    The run folder is checked first (``run_folder.py``: one config per folder, ``resume``,
    ``overwrite``); a refused command has written nothing. ``command`` (the CLI's command
    line) is recorded in the folder's ``command.txt``. The trackers of ``trainer.loggers``
    start before Ray does (one that cannot start stops the command there) and end with the
    run, marked finished, failed or killed.
    """
    validate_config(cfg, mode)
    run_dir = resolve_run_dir(cfg, mode)
    if mode == "eval":
        check_eval_source(cfg, run_dir)
        checkpoints = run_dir / "checkpoints"
        run_dir = eval_output_folder(cfg, run_dir)  # the eval writes only here
    else:
        prepare_train_folder(cfg, run_dir)
        checkpoints = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    _clear_status_files(run_dir)
    config_file = run_dir / ("config.yaml" if mode == "train" else "eval_config.yaml")
    OmegaConf.save(cfg, config_file, resolve=True)
    if command is not None:
        record_command(run_dir, command)
    feed = open_trackers(cfg, run_dir, mode, config_file)
    status = FAILED
    try:
        result = _run_workers(cfg, run_dir, checkpoints, mode, show_progress, feed)
        result.trackers = {} if feed is None else feed.records
        status = FINISHED
        return result
    except (RunInterrupted, KeyboardInterrupt):
        status = KILLED
        raise
    finally:
        if feed is not None:
            feed.close(status)


def _run_workers(
    cfg: DictConfig,
    run_dir: Path,
    checkpoints: Path,
    mode: str,
    show_progress: bool,
    feed: TrackerFeed | None,
) -> RunResult:
    """Start Ray and the workers, drive them to the end, and take everything down again."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from embodied_rl.runtime.worker import DAGWorker

    workers_cfg = section(cfg, "workers")
    n = workers_cfg.num_workers
    started_ray = start_ray(cfg, n, workers_cfg.cpus_per_worker)
    spec = device_spec(str(cfg.device))
    try:
        group = place_workers(cfg, n, bundle(spec, workers_cfg.cpus_per_worker))
    except RunFailed:
        if started_ray:
            ray.shutdown()
        raise
    actors: list[Any] = []
    # SIGTERM: the workers may finish the step in progress (an evaluation stops at once).
    grace_s = section(cfg, "trainer").preempt_grace_s if mode == "train" else 0.0
    preemption, stop = Preemption(grace_s), None
    try:
        rank_nodes = cluster.placement(group)
        _record_placement(run_dir, rank_nodes)
        plain_cfg = OmegaConf.to_container(cfg, resolve=True)
        show_progress = show_progress and sys.stderr.isatty()
        if show_progress:  # one display: the driver's bar instead of rank 0's step lines
            plain_cfg["trainer"]["log_to_console"] = False
        actor_cls = ray.remote(DAGWorker)
        for rank in range(n):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            actors.append(
                actor_cls.options(
                    **actor_options(spec, workers_cfg.cpus_per_worker),
                    scheduling_strategy=strategy,
                    max_concurrency=2,  # status() answers while run() works
                    # the C allocator settings that keep a worker's memory flat (memory.py)
                    runtime_env={"env_vars": worker_process_env()},
                ).remote(plain_cfg, rank, n, str(run_dir), mode, str(checkpoints))
            )
        try:
            with preemption:
                show = show_progress and mode == "train"
                return _drive(cfg, actors, run_dir, show, rank_nodes, preemption, feed)
        except (KeyboardInterrupt, Terminated) as err:  # reported below, once workers stopped
            stop = err
    finally:
        _close_workers(actors)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)
        if started_ray:
            ray.shutdown()
    mark_stopped(run_dir)  # the workers are gone: none of them is still in a node
    raise _stopped_error(stop, run_dir, mode) from None


def _close_workers(actors: list[Any], timeout_s: float = 30.0) -> None:
    """Let live workers close their simulators before they are killed (best effort: a dead
    or stuck worker is simply killed; its shared memory is removed by the next run)."""
    import ray

    refs = []
    for actor in actors:
        try:
            refs.append(actor.close.remote())
        except Exception:  # noqa: BLE001 - a dead actor cannot be asked; ray.kill follows
            continue
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


def _drive(
    cfg: DictConfig,
    actors: list[Any],
    run_dir: Path,
    show_progress: bool,
    rank_nodes: list[str],
    preemption: Preemption,
    feed: TrackerFeed | None = None,
) -> RunResult:
    """Set the workers up, start their loops, and watch until all finish or one fails.

    After SIGTERM (``preemption``) the workers end after the step in progress, checkpointed;
    that ends the run with :class:`RunPreempted`. ``feed`` sends the trackers what rank 0
    wrote to the run folder, at every poll.
    """
    # Bounded: the driver polls every worker twice a second, for days in a long run.
    records: deque[Any] = deque(maxlen=_KEPT_RECORDS)
    monitor = _Monitor(actors, records, run_dir, rank_nodes)
    poll = float(section(cfg, "ray").poll_interval_s)

    def preempt_tick() -> None:  # SIGTERM during set-up stops at once
        preemption.tick(actors)

    where = monitor.wait_all([actors[0].rendezvous_address.remote()], poll, preempt_tick)[0]
    setups = [a.setup.remote(where["address"], where["port"]) for a in actors]
    ready = monitor.wait_all(setups, poll, preempt_tick)
    if feed is not None:  # rows before the start step were sent by an earlier attempt
        feed.start(int(ready[0]["start_step"]))
    total = int(cfg.trainer.total_steps)
    bar = ProgressBar(total=total) if show_progress else None

    def on_tick() -> None:
        preemption.tick(actors)
        monitor.poll_status()
        if feed is not None:
            feed.poll()
        if bar is not None and monitor.rank0_status:
            status = monitor.rank0_status
            bar.update(int(status.get("completed", 0)), status.get("metrics") or {})

    preemption.running = True
    results = monitor.wait_all([actor.run.remote() for actor in actors], poll, on_tick)
    if bar is not None:
        bar.close()
    if any(result.get("preempted") for result in results):
        raise RunPreempted(preempted_message(run_dir, int(results[0]["steps_done"])))
    return RunResult(run_dir, results[0]["final_metrics"], list(records))


class _Monitor:
    """Tracks each worker's last reported (step, node) to explain failures."""

    grace_s = 5.0
    node_death_wait_s = 45.0  # Ray's default health checks mark a dead node within ~30 s

    def __init__(
        self, actors: list[Any], records: deque[Any], run_dir: Path, rank_nodes: list[str]
    ) -> None:
        self.run_dir = run_dir
        self.rank_nodes = rank_nodes  # the Ray node id of each rank
        self.actors = actors
        self.records = records
        self.last: dict[int, dict[str, Any]] = {}
        self.rank0_status: dict[str, Any] = {}

    def wait_all(
        self,
        refs: list[Any],
        poll_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """The results of one call per rank (``refs[rank]``), in rank order.

        Returns as soon as every call is done, and raises :class:`RunFailed` as soon as one
        fails: the peers of a dead worker may wait in a collective until its timeout
        (minutes), so they are not waited for. ``on_tick`` runs every ``poll_s`` seconds.
        """
        import ray

        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        while pending:
            done, _ = ray.wait(list(pending), timeout=poll_s)
            for ref in done:
                rank = pending.pop(ref)
                try:
                    results[rank] = self.result(rank, ref)
                except _WorkerError as failure:
                    raise self.root_cause(failure.rank, failure.error, pending) from None
            if on_tick is not None:
                on_tick()
        return [results[rank] for rank in range(len(refs))]

    def _explain(self, rank: int, err: Exception) -> RunFailed:
        import ray

        where = self._last_known(rank)
        died = isinstance(err, ray.exceptions.RayActorError)
        what = "died (its process exited or was killed)" if died else "failed"
        if where.get("node") is not None:
            place = f"node {where['node']!r} at step {where.get('step')}"
        elif int(where.get("step", -1)) >= 0:
            place = f"{where.get('phase')} at step {where.get('step')}"
        else:
            place = f"{where.get('phase') or 'setup'} (before any node ran)"
        if where.get("pid") is not None:
            place += f" (pid {where['pid']} on host {where.get('host')})"
        note = self._lost_node_note(rank) if died else ""
        return RunFailed(
            f"worker rank {rank} {what} during {place}; the run was stopped.{note} Cause: "
            + _COLOUR.sub("", str(err))
        )

    def _lost_node_note(self, rank: int) -> str:
        """When the rank's Ray node is gone: which node, which ranks died with it, the fix.

        In a run over several nodes the cluster needs a few seconds (its health checks) to mark
        a crashed node dead, so the driver waits for that before it explains the failure.
        """
        node_id = self.rank_nodes[rank] if rank < len(self.rank_nodes) else None
        if node_id is None or len(set(self.rank_nodes)) < 2:
            return ""  # on one node, the driver's own node: nothing to tell apart
        lost = cluster.wait_for_lost(node_id, self.node_death_wait_s)
        if lost is None:
            return ""
        ranks = [r for r, n in enumerate(self.rank_nodes) if n == node_id]
        return (
            f" Ray node {lost.name} was lost with ranks "
            f"{', '.join(map(str, ranks))}. Fix: restart the node (or give the job a cluster "
            "that holds it) and run again with resume=true to continue from the last checkpoint."
        )

    def _last_known(self, rank: int) -> dict[str, Any]:
        """The newest of the polled status and the status file the worker left behind."""
        from embodied_rl.runtime.worker import status_path

        path = status_path(self.run_dir, rank)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return self.last.get(rank, {})

    def root_cause(self, rank: int, err: Exception, pending: dict[Any, int]) -> RunFailed:
        """When one worker fails, its peers soon fail too (their collectives lose a member).

        Wait briefly for the others and blame a worker that died before one that merely
        raised, so the message names the worker that caused the stop.
        """
        import ray

        failures = {rank: err}
        done = []
        if pending:
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=self.grace_s)
        for ref in done:
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as other:
                failures[pending[ref]] = other
        died = [r for r, e in failures.items() if isinstance(e, ray.exceptions.RayActorError)]
        chosen = (died or [rank])[0]
        return self._explain(chosen, failures[chosen])

    def result(self, rank: int, ref: Any) -> Any:
        import ray

        try:
            value = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            raise _WorkerError(rank, err) from None
        self.records.append(value)
        return value

    def poll_status(self) -> None:
        import ray

        for rank, actor in enumerate(self.actors):
            try:
                status = ray.get(actor.status.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue  # a dead worker keeps its last known status
            self.records.append(status)
            self.last[rank] = status
            if rank == 0:
                self.rank0_status = status
