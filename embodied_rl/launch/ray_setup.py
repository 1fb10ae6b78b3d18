"""Ray for a run: start an embedded cluster or join ``ray.address``, place the workers.

A run holds one placement group of one bundle per worker (``devices.bundle``); what the
cluster must offer, and where each rank landed, is asked of it in ``runtime/cluster.py``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from embodied_rl.devices import bundle, device_spec
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.launch.process_tree import StartedProcesses, signals_held
from embodied_rl.runtime import cluster
from embodied_rl.runtime.config import section
from embodied_rl.runtime.preemption import Terminated


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


def start_ray(
    cfg: DictConfig, num_workers: int, cpus_per_worker: float
) -> tuple[bool, StartedProcesses]:
    """Connect to ``ray.address`` or start an embedded cluster.

    Returns:
        Whether this call started Ray, and the processes it started (an embedded cluster's,
        to ``end()`` after ``ray.shutdown``: ``launch/process_tree.py``).

    Raises:
        RunFailed: ``ray.address`` cannot be reached or joined (the message says the fix).
        KeyboardInterrupt / Terminated: a signal cut the start short; what had started is
            ended first.
    """
    import ray

    if ray.is_initialized():
        return False, StartedProcesses()
    started = StartedProcesses()
    handler = signal.getsignal(signal.SIGTERM)  # ray.init puts its own in (sys.exit(15))
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
    except BaseException as err:  # a signal in the middle of it: end what was started
        started.take_list()
        with signals_held():
            ray.shutdown()
            started.end()
        if isinstance(err, SystemExit) and err.code == signal.SIGTERM:  # Ray's handler
            raise Terminated("SIGTERM came while Ray was starting") from None
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)
    started.take_list()
    return not joining, started


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


def record_placement(run_dir: Path, rank_nodes: list[str]) -> None:
    """``placement.json``: the Ray node of every rank; logged when the run spans nodes."""
    (run_dir / "placement.json").write_text(json.dumps({"rank_nodes": rank_nodes}, indent=1))
    if len(set(rank_nodes)) > 1:
        print(cluster.format_placement(rank_nodes), flush=True)
