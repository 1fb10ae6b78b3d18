"""What runs inside a simulator process, and the shared-memory layout both sides use.

The parent (:mod:`simulators.workers`) spawns :func:`child_main`, which builds a registered
vector env of ``k`` envs in this fresh process (so GL contexts are created here), reports the
env spec, attaches the shared block the parent allocated for it, and then answers
``(command, args)`` messages: ``reset``, ``step_chunk`` (``(k, C, A)`` actions), ``replay``
(re-run an episode after a restart), ``render``, ``progress`` (``privileged_progress``) and
``close``. Observations and frames go into the block, small results over the pipe; an
exception inside a command goes back as an ``("error", traceback)`` reply.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from embodied_rl.registry import SIMULATORS
from simulators.base import EnvSpec, Obs, VectorEnv

# --- shared-memory layout --------------------------------------------------------------------


def _sections(spec: EnvSpec, num_envs: int) -> list[tuple[str, tuple[int, ...], type]]:
    """The arrays of one child's block, in order; float32 first keeps it aligned."""
    sections: list[tuple[str, tuple[int, ...], type]] = [
        ("state", (num_envs, spec.state_dim), np.float32)
    ]
    if spec.image_shape is not None:
        sections.append(("image", (num_envs, *spec.image_shape), np.uint8))
    if spec.wrist_shape is not None:
        sections.append(("wrist", (num_envs, *spec.wrist_shape), np.uint8))
    if spec.render_shape is not None:
        sections.append(("frames", (num_envs, *spec.render_shape), np.uint8))
    return sections


def block_size(spec: EnvSpec, num_envs: int) -> int:
    """Bytes of one child's block."""
    return sum(
        int(np.prod(shape)) * np.dtype(dtype).itemsize
        for _, shape, dtype in _sections(spec, num_envs)
    )


def shared_views(buffer: memoryview, spec: EnvSpec, num_envs: int) -> dict[str, np.ndarray]:
    """Array views into a block: ``state (k, S)``, ``image`` and ``wrist`` (k, H, W, 3),
    ``frames``."""
    views, offset = {}, 0
    for name, shape, dtype in _sections(spec, num_envs):
        views[name] = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset)
        offset += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return views


# --- the child process -------------------------------------------------------------------------


def child_main(
    conn: Connection,
    name: str,
    options: dict[str, Any],
    num_envs: int,
    plugin_modules: Sequence[str],
) -> None:
    """Entry point of a simulator process: build the env, attach the block, serve commands."""
    import embodied_rl  # noqa: F401  (first: the torchvision fix must precede other imports)

    for module in plugin_modules:
        importlib.import_module(module)  # registers the simulator in this fresh process
    env, shm, views = None, None, None
    try:
        try:
            env = SIMULATORS.get(name)(options, num_envs, processes=0)  # in this process
        except Exception:
            conn.send(("error", traceback.format_exc()))
            return
        conn.send(("ok", env.spec))
        command, args = conn.recv()
        if command != "attach":
            return  # the parent is shutting down before we were connected
        shm = SharedMemory(name=args[0])
        views = shared_views(shm.buf, env.spec, num_envs)
        conn.send(("ok", None))
        _serve(conn, env, views)
    except (EOFError, OSError, KeyboardInterrupt):
        pass  # the parent went away or the user interrupted: just exit
    finally:
        views = None  # release the exported buffer before closing the mapping
        if shm is not None:
            shm.close()
        if env is not None:
            env.close()


def _serve(conn: Connection, env: VectorEnv, views: dict[str, np.ndarray]) -> None:
    """Answer ``(command, args)`` messages until ``close``; errors go back as replies."""
    while True:
        command, args = conn.recv()
        if command == "close":
            conn.send(("ok", None))
            return
        try:
            reply = _HANDLERS[command](env, views, *args)
        except Exception:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", reply))


def _write_obs(views: dict[str, np.ndarray], obs: Obs) -> None:
    views["state"][:] = obs.state
    if obs.image is not None:
        views["image"][:] = obs.image
    if obs.wrist_image is not None:
        views["wrist"][:] = obs.wrist_image


def _handle_reset(
    env: VectorEnv, views: dict, tasks: np.ndarray, inits: np.ndarray, active: np.ndarray
) -> list:
    _write_obs(views, env.reset(tasks, inits, active))
    return env.task_descriptions


def _handle_step_chunk(env: VectorEnv, views: dict, actions: np.ndarray) -> tuple:
    result = env.step_chunk(actions)
    _write_obs(views, result.obs)
    return result.reward, result.done, result.success


def _handle_replay(
    env: VectorEnv,
    views: dict,
    tasks: np.ndarray,
    inits: np.ndarray,
    active: np.ndarray,
    actions: np.ndarray,
) -> None:
    """Re-run an episode: reset (the same envs active), then ``actions`` ``(k, T, A)`` as one
    chunk (the same states as the steps and chunks they came in; observed once, at the end)."""
    obs = env.reset(tasks, inits, active)
    if actions.shape[1]:
        obs = env.step_chunk(actions).obs
    _write_obs(views, obs)


def _handle_render(
    env: VectorEnv, views: dict, size: int | None = None, envs: list[int] | None = None
) -> np.ndarray | None:
    """Frames into the block when they are all of its envs at its size (``None`` back), else
    back by pipe."""
    frames = env.render(size, envs)
    everyone = envs is None or list(envs) == list(range(env.num_envs))
    if everyone and "frames" in views and views["frames"].shape == frames.shape:
        views["frames"][:] = frames
        return None
    return frames


def _handle_progress(env: VectorEnv, views: dict) -> np.ndarray | None:
    """``(k,)`` float32 privileged progress, or ``None`` (the simulator has none)."""
    return env.privileged_progress()


_HANDLERS = {
    "reset": _handle_reset,
    "step_chunk": _handle_step_chunk,
    "replay": _handle_replay,
    "render": _handle_render,
    "progress": _handle_progress,
}
