"""The driver: start Ray, one DAG worker per device bundle, watch them, report.

The driver never receives batch data: it sends each worker the resolved config, and gets back
only small status and metric records (every record is kept in ``RunResult.records`` so a test
can check that).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from embodied_rl.devices import bundle, device_spec
from embodied_rl.metrics import ProgressBar
from embodied_rl.runtime.config import section, validate_config


class RunFailed(RuntimeError):
    """A worker failed or died; the message names the rank, node and step."""


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


def resolve_run_dir(cfg: DictConfig, mode: str = "train") -> Path:
    """Where the run lives.

    ``run_dir`` if set. Otherwise ``resume=true`` (and ``eval``) take the newest run of this
    config that has checkpoints; a new training run (or an eval with no earlier run) gets a
    fresh timestamped directory.
    """
    if cfg.get("run_dir"):
        return Path(cfg.run_dir).resolve()
    root = Path(cfg.get("output_root") or "outputs").resolve() / str(cfg.name)
    runs = sorted(p for p in root.glob("*") if (p / "checkpoints").is_dir())
    if cfg.get("resume") or mode == "eval":
        if runs:
            return runs[-1]
        if mode != "eval":
            raise RunFailed(
                f"resume=true but no earlier run with checkpoints under {root}; set run_dir=..."
            )
    return root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def start_ray(cfg: DictConfig, num_workers: int, cpus_per_worker: float) -> bool:
    """Connect to ``ray.address`` or start an embedded cluster; returns True if we started it."""
    import ray

    ray_cfg = section(cfg, "ray")
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, log_to_driver=True)
        return False
    # Over-subscribe logical CPUs when needed: the workers mostly wait on each other.
    need = int(num_workers * cpus_per_worker + 0.999)
    num_cpus = ray_cfg.num_cpus or max(os.cpu_count() or 1, need)
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    return True


def launch(cfg: DictConfig, show_progress: bool = True, mode: str = "train") -> RunResult:
    """Validate, start the workers, run to completion, and return rank 0's final metrics.

    ``mode="eval"`` runs the evaluation DAG once on the run's newest checkpoint.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from embodied_rl.runtime.worker import DAGWorker

    validate_config(cfg)
    workers_cfg = section(cfg, "workers")
    run_dir = resolve_run_dir(cfg, mode)
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(
        cfg, run_dir / ("config.yaml" if mode == "train" else "eval_config.yaml"), resolve=True
    )
    n = workers_cfg.num_workers
    started_ray = start_ray(cfg, n, workers_cfg.cpus_per_worker)
    spec = device_spec(str(cfg.device))
    group = placement_group([bundle(spec, workers_cfg.cpus_per_worker)] * n, strategy="PACK")
    actors: list[Any] = []
    try:
        ray.get(group.ready(), timeout=120)
        plain_cfg = OmegaConf.to_container(cfg, resolve=True)
        show_progress = show_progress and sys.stderr.isatty()
        if show_progress:  # one display: the driver's bar instead of rank 0's step lines
            plain_cfg["trainer"]["log_to_console"] = False
        actor_cls = ray.remote(DAGWorker)
        for rank in range(n):
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank)
            actors.append(
                actor_cls.options(
                    num_cpus=workers_cfg.cpus_per_worker,
                    num_gpus=1 if spec.type == "cuda" else 0,
                    resources={"NPU": 1} if spec.type == "npu" else None,
                    scheduling_strategy=strategy,
                    max_concurrency=2,  # status() answers while run() works
                ).remote(plain_cfg, rank, n, str(run_dir), mode)
            )
        return _drive(cfg, actors, run_dir, show_progress and mode == "train")
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(group)
        if started_ray:
            ray.shutdown()


def _drive(cfg: DictConfig, actors: list[Any], run_dir: Path, show_progress: bool) -> RunResult:
    """Set the workers up, start their loops, and watch until all finish or one fails."""
    import ray

    records: list[Any] = []
    monitor = _Monitor(actors, records, run_dir)
    try:
        where = monitor.result(0, actors[0].rendezvous_address.remote())
        for rank, ref in enumerate(
            [a.setup.remote(where["address"], where["port"]) for a in actors]
        ):
            monitor.result(rank, ref)
    except _WorkerError as failure:
        raise monitor._explain(failure.rank, failure.error) from None
    total = int(cfg.trainer.total_steps)
    bar = ProgressBar(total=total) if show_progress else None
    pending = {actor.run.remote(): rank for rank, actor in enumerate(actors)}
    results: dict[int, Any] = {}
    poll = float(section(cfg, "ray").poll_interval_s)
    while pending:
        done, _ = ray.wait(list(pending), timeout=poll)
        for ref in done:
            rank = pending.pop(ref)
            try:
                results[rank] = monitor.result(rank, ref)
            except _WorkerError as failure:
                raise monitor.root_cause(failure.rank, failure.error, pending) from None
        monitor.poll_status()
        if bar is not None and monitor.rank0_status:
            status = monitor.rank0_status
            bar.update(int(status.get("completed", 0)), status.get("metrics") or {})
    if bar is not None:
        bar.close()
    return RunResult(run_dir, results[0]["final_metrics"], records)


class _Monitor:
    """Tracks each worker's last reported (step, node) to explain failures."""

    grace_s = 5.0

    def __init__(self, actors: list[Any], records: list[Any], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.actors = actors
        self.records = records
        self.last: dict[int, dict[str, Any]] = {}
        self.rank0_status: dict[str, Any] = {}

    def _explain(self, rank: int, err: Exception) -> RunFailed:
        import ray

        where = self._last_known(rank)
        if isinstance(err, ray.exceptions.RayActorError):
            what = "died (its process exited or was killed)"
        else:
            what = "failed"
        if where.get("node") is not None:
            place = f"node {where['node']!r} at step {where.get('step')}"
        else:
            place = f"{where.get('phase') or 'setup'} (before any node ran)"
        return RunFailed(
            f"worker rank {rank} {what} during {place}; the run was stopped. Cause: {err}"
        )

    def _last_known(self, rank: int) -> dict[str, Any]:
        """The newest of the polled status and the status file the worker left behind."""
        path = self.run_dir / ".status" / f"rank_{rank:05d}.json"
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
