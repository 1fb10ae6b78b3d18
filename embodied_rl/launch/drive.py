"""Drive a run's workers: start one ``DAGWorker`` actor per placed bundle, take them through
rendezvous, ``setup`` and ``run`` while the progress bar, the trackers and SIGTERM are
served at every status poll, and take everything down again however the run ends."""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from embodied_rl.devices import DeviceSpec, actor_options, bundle, device_spec
from embodied_rl.launch.monitor import Monitor
from embodied_rl.launch.outcome import RunPreempted, RunResult, starting_stopped, stopped_error
from embodied_rl.launch.process_tree import signals_held, sigterm_raises
from embodied_rl.launch.ray_setup import place_workers, record_placement, start_ray
from embodied_rl.metrics import ProgressBar
from embodied_rl.runtime import cluster
from embodied_rl.runtime.config import section
from embodied_rl.runtime.memory import worker_process_env
from embodied_rl.runtime.preemption import Preemption, Terminated, mark_stopped, preempted_message
from embodied_rl.trackers.feed import TrackerFeed

_KEPT_RECORDS = 1000  # newest status/result records the driver keeps (RunResult.records)


def run_workers(
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

    workers_cfg = section(cfg, "workers")
    n = workers_cfg.num_workers
    try:
        with sigterm_raises():
            started_ray, ray_processes = start_ray(cfg, n, workers_cfg.cpus_per_worker)
            spec = device_spec(str(cfg.device))
            try:
                group = place_workers(cfg, n, bundle(spec, workers_cfg.cpus_per_worker))
            except BaseException:  # RunFailed, or a signal while the workers are placed
                with signals_held():
                    if started_ray:
                        ray.shutdown()
                    ray_processes.end()
                raise
    except (KeyboardInterrupt, Terminated) as err:
        raise starting_stopped(err, run_dir) from None
    actors: list[Any] = []
    # SIGTERM: the workers may finish the step in progress (an evaluation stops at once).
    grace_s = section(cfg, "trainer").preempt_grace_s if mode == "train" else 0.0
    preemption, stop = Preemption(grace_s), None
    try:
        rank_nodes = cluster.placement(group)
        record_placement(run_dir, rank_nodes)
        plain_cfg = OmegaConf.to_container(cfg, resolve=True)
        show_progress = show_progress and sys.stderr.isatty()
        if show_progress:  # one display: the driver's bar instead of rank 0's step lines
            plain_cfg["trainer"]["log_to_console"] = False
        _start_workers(actors, plain_cfg, group, spec, run_dir, mode, checkpoints)
        try:
            with preemption:
                show = show_progress and mode == "train"
                return _drive(cfg, actors, run_dir, show, rank_nodes, preemption, feed)
        except (KeyboardInterrupt, Terminated) as err:  # reported below, once workers stopped
            stop = err
    finally:
        with signals_held():  # a second Ctrl-C must not leave Ray's processes running
            _close_workers(actors)
            for actor in actors:
                ray.kill(actor, no_restart=True)
            remove_placement_group(group)
            if started_ray:
                ray.shutdown()
            ray_processes.end()
    mark_stopped(run_dir)  # the workers are gone: none of them is still in a node
    raise stopped_error(stop, run_dir, mode) from None


def _start_workers(
    actors: list[Any],
    plain_cfg: dict[str, Any],
    group: Any,
    spec: DeviceSpec,
    run_dir: Path,
    mode: str,
    checkpoints: Path,
) -> None:
    """Start one ``DAGWorker`` actor per bundle of ``group`` (rank ``r`` on bundle ``r``).

    Each is appended to ``actors`` as soon as it exists, so that when a later one cannot be
    started, the caller still kills the ones that were.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from embodied_rl.runtime.worker import DAGWorker

    workers_cfg = section(plain_cfg, "workers")
    n = workers_cfg.num_workers
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
    monitor = Monitor(actors, records, run_dir, rank_nodes)
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
