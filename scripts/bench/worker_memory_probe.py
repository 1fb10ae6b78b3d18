"""Plugin for ``scripts/bench/worker_memory.py``: records a DAG worker's RSS around its phases.

Listed in a run's ``plugins`` (with ``scripts/bench`` on ``PYTHONPATH``), it is imported by
every worker and wraps the worker's own functions (nothing else changes):

- ``imports``: the RSS when the worker imports this plugin (after the core, ``policies``,
  ``rollout`` and ``simulators``, and the Ray worker runtime);
- ``model:<name>``: around ``ModelStore._build`` (a model is built on first use);
- ``setup:<dag>``: around ``PlanExecutor.setup_nodes`` (every node's one-time set-up: vector
  envs, LIBERO's import);
- ``node:<dag>:<node>:<step>``: around each node run (``PlanExecutor.run_node``);
- ``walk:<dag>:<step>``: around a whole walk of a DAG (a training step, an evaluation);
- ``scene`` / ``renderer``: around ``LiberoScene.build`` and ``TaskRenderer.__init__``.

Only the classes the worker imports by name can be wrapped: Ray sends the ``DAGWorker`` class
to its processes by value, so its own methods stay out of reach. Each record is
``{"event", "before_mb", "after_mb", "t0_s", "t1_s"}`` (RSS and monotonic time at the start
and the end: an event inside another lies inside its time span), appended as it happens to
``<run_dir>/memory_probe/rank_<rank>.jsonl``. Works on the code of any commit that has these
functions (for before/after comparisons).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

_PROCESS = psutil.Process()
_PENDING: list[dict[str, Any]] = []  # records made before the output file is known
_OUT: list[Path] = []  # the output file, once a DAG of this worker names its run dir


def _rss_mb() -> float:
    return _PROCESS.memory_info().rss / 1024**2


def _record(event: str, before: float, after: float, started: float) -> None:
    _PENDING.append(
        {
            "event": event,
            "before_mb": before,
            "after_mb": after,
            "t0_s": started,
            "t1_s": time.monotonic(),
        }
    )
    if _OUT:
        with open(_OUT[0], "a") as out:
            out.writelines(json.dumps(record) + "\n" for record in _PENDING)
        _PENDING.clear()


def _bind(executor: Any) -> None:
    """Learn the output file from a plan executor's node contexts (run dir and rank)."""
    if _OUT or not executor.contexts:
        return
    ctx = next(iter(executor.contexts.values()))
    path = Path(ctx.run_dir) / "memory_probe" / f"rank_{ctx.rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    _OUT.append(path)


def _measured(name_of: Callable[..., str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a function: record the RSS before and after each call under ``name_of(*args)``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def measured(*args: Any, **kwargs: Any) -> Any:
            before, started = _rss_mb(), time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                _record(name_of(*args, **kwargs), before, _rss_mb(), started)

        return measured

    return wrap


def _executor_event(name_of: Callable[..., str]) -> Callable[..., str]:
    """``name_of`` for a ``PlanExecutor`` method, binding the output file on the way."""

    def named(self: Any, *args: Any, **kwargs: Any) -> str:
        _bind(self)
        return name_of(self, *args, **kwargs)

    return named


def _install() -> None:
    from embodied_rl.runtime import executor, models

    plan = executor.PlanExecutor
    plan.setup_nodes = _measured(_executor_event(lambda self: f"setup:{self.name}"))(
        plan.setup_nodes
    )
    plan.run = _measured(_executor_event(lambda self, step: f"walk:{self.name}:{step}"))(plan.run)
    plan.run_node = _measured(
        _executor_event(lambda self, node_id, step, batch: f"node:{self.name}:{node_id}:{step}")
    )(plan.run_node)
    models.ModelStore._build = _measured(lambda self, name: f"model:{name}")(
        models.ModelStore._build
    )
    try:  # the LIBERO parts, where the simulator is installed
        from simulators.libero import render, scene
    except ImportError:
        return
    scene_build = scene.LiberoScene.build.__func__
    scene.LiberoScene.build = classmethod(_measured(lambda cls, *a, **k: "scene")(scene_build))
    render.TaskRenderer.__init__ = _measured(lambda *a, **k: "renderer")(
        render.TaskRenderer.__init__
    )


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor (a DAG worker). The driver imports plugins too, to
    validate the config, and must stay unwrapped: Ray sends the worker class to the workers by
    value, with whatever the driver's process did to the functions it reaches."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


if _in_ray_actor():
    _record("imports", _rss_mb(), _rss_mb(), time.monotonic())
    _install()
