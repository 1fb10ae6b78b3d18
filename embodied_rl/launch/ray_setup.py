"""Ray for a run: start an embedded cluster or join ``ray.address``, place the workers.

A run holds one placement group of one bundle per worker (``devices.bundle``); what the
cluster must offer, and where each rank landed, is asked of it in ``runtime/cluster.py``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from embodied_rl.devices import bundle, device_spec
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.launch.process_tree import (
    StartedProcesses,
    raise_deferred,
    signals_deferred,
    signals_held,
)
from embodied_rl.runtime import cluster
from embodied_rl.runtime.config import section


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

    ``ray.init`` runs to its end before a Ctrl-C or SIGTERM is acted on: cut short while it
    builds its core worker (C++ threads that outlive the Python object that never got made),
    the process crashed with SIGSEGV at exit, after its error line. A second signal stops it
    at once.

    Returns:
        Whether this call started Ray, and the processes it started (an embedded cluster's,
        to ``end()`` after ``ray.shutdown``: ``launch/process_tree.py``).

    Raises:
        RunFailed: ``ray.address`` cannot be reached or joined (the message says the fix).
        KeyboardInterrupt / Terminated: a signal came while Ray started; what had started is
            ended first.
    """
    import ray

    if ray.is_initialized():
        return False, StartedProcesses()
    started = StartedProcesses()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs = ray_init_kwargs(cfg, num_workers, cpus_per_worker)
    joining = kwargs["address"] != "local"
    try:
        if joining:
            cluster.check_reachable(kwargs["address"], section(cfg, "ray").connect_timeout_s)
        with signals_deferred(STOP_DEFERRED) as held, _ray_keeps_sigterm_handler():
            ray.init(**kwargs)
        started.take_list()
        raise_deferred(held, "SIGTERM came while Ray was starting")
    except cluster.ClusterError as err:
        raise RunFailed(str(err)) from None
    except ConnectionError as err:
        raise RunFailed(str(cluster.connect_error(kwargs["address"], err))) from None
    except BaseException:  # a signal: end what was started
        started.take_list()
        with signals_held():
            ray.shutdown()
            started.end()
        raise
    return not joining, started


STOP_DEFERRED = "stopping once Ray has started (a few seconds); press Ctrl-C again to stop now"


@contextmanager
def _ray_keeps_sigterm_handler() -> Iterator[None]:
    """Inside, ``ray.init`` installs no SIGTERM handler of its own (``sys.exit`` wherever it is,
    the driver's node teardown): the caller's stays, ``signals_deferred``'s while Ray starts.
    Ray installs them through this one function of its own (``ray._private.utils``)."""
    from ray._private import utils as ray_utils

    install = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = _install_none
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install


def _install_none(handler: Any) -> None:
    """What ``ray._private.utils.set_sigterm_handler`` does while Ray starts: nothing."""


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
