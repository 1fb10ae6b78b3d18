"""Parallel simulator workers: a vector env whose envs live in spawned processes.

:class:`ProcessVectorEnv` runs ``P`` simulator processes, each holding a vector env of a
few envs built by a registered simulator builder *inside* the child, so GL contexts are
created where they are used (processes start with the ``spawn`` method, never ``fork``).

- Commands (reset, step_chunk, render, progress) go to every child over its pipe first and the
  replies are gathered afterwards, so the children simulate in parallel. A chunk of ``C``
  actions per env travels in one message (``step`` sends a chunk of one), so a simulator
  that observes once per chunk (LIBERO) is asked once per chunk.
- Observations and frames come back through one ``SharedMemory`` block per child, allocated
  by the parent once the first child reports the env spec and kept across restarts; the
  child writes into it, the parent copies out of it. Rewards and flags go over the pipe, and
  so do frames of another size than ``spec.render_shape`` or of some envs only (videos).
- Fault tolerance: a child that dies, hangs past its timeout or raises is killed and
  restarted; its episode is re-run from its ``(task, init_state)`` with the actions it
  received since its last reset, as one chunk (identical for a deterministic simulator),
  then the current command is answered. Events are counted (:meth:`ProcessVectorEnv.fault_counts`) and logged;
  after ``max_restarts`` restarts of one child within one call it gives up with an error
  naming the envs of that child.

The pool is an option of every simulator, not a simulator: ``SIMULATORS.get(name)(options,
num_envs, processes=P)`` builds one (:class:`simulators.registry.Simulator`), and each child
builds its envs through the same entry with ``processes=0``.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import secrets
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from embodied_rl.registry import SIMULATORS
from embodied_rl.shm import remove_orphans
from simulators.base import (
    EnvSpec,
    Obs,
    StepResult,
    VectorEnv,
    check_action_chunk,
    check_actions,
    check_active,
    check_env_ids,
    check_reset_ids,
)
from simulators.worker_process import block_size, child_main, shared_views

logger = logging.getLogger(__name__)

SHM_PREFIX = "erl_sim"  # our blocks in /dev/shm: erl_sim_<parent pid>_... (embodied_rl.shm)


class SimulatorWorkerError(RuntimeError):
    """A simulator process could not be started or kept alive."""


@dataclass
class _Failure:
    """Why a child did not answer: ``crash`` (exited), ``timeout`` or ``error`` (raised)."""

    kind: str
    detail: str


class _Child:
    """One simulator process with what must survive its restarts (block, episode history)."""

    def __init__(self, index: int, envs: slice) -> None:
        self.index = index
        self.envs = envs  # which of the N envs this child simulates
        self.num_envs = envs.stop - envs.start
        self.proc: multiprocessing.process.BaseProcess | None = None
        self.conn: Connection | None = None
        self.shm: SharedMemory | None = None
        self.views: dict[str, np.ndarray] = {}
        self.reset_args: tuple[np.ndarray, ...] | None = None  # last reset: tasks, inits, active
        self.actions: list[np.ndarray] = []  # (k, C, A) chunks received since that reset

    def describe(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"simulator process {self.index} (envs {self.envs.start}..{self.envs.stop - 1}, pid {pid})"

    def stop(self) -> None:
        """Kill the process at once (restarts: a hung child would not answer anyway)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc.close()
            self.proc = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _shutdown(children: list[_Child], grace_s: float = 5.0) -> None:
    """Stop every child (politely first, so it can release its GL context) and unlink memory.

    A module-level function holding no reference to the env, so ``weakref.finalize`` can run
    it when the env is collected or the interpreter exits.
    """
    for child in children:
        if child.conn is not None and child.proc is not None and child.proc.is_alive():
            try:
                child.conn.send(("close", ()))
            except OSError:
                pass  # already gone
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.proc is not None:
            child.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        child.stop()
        child.views = {}  # drop the exported buffers before closing the mapping
        if child.shm is not None:
            child.shm.close()
            try:
                child.shm.unlink()
            except FileNotFoundError:
                pass
            child.shm = None


def _split(num_envs: int, num_processes: int) -> list[slice]:
    """Contiguous, nearly equal env ranges, one per process."""
    sizes = [
        num_envs // num_processes + (i < num_envs % num_processes) for i in range(num_processes)
    ]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _read(child: _Child) -> Any:
    """Read the reply of a child whose pipe or process sentinel became ready."""
    if child.conn.poll():  # a message, or EOF if the child closed its end by dying
        try:
            status, payload = child.conn.recv()
        except (EOFError, OSError):
            child.proc.join(timeout=1.0)
            return _Failure("crash", f"process exited with code {child.proc.exitcode}")
        return payload if status == "ok" else _Failure("error", payload)
    child.proc.join(timeout=1.0)
    return _Failure("crash", f"process exited with code {child.proc.exitcode}")


def _gather(children: Sequence[_Child], deadline: float) -> dict[int, Any]:
    """Wait for one reply from each child until ``deadline`` (``time.monotonic()``).

    Returns:
        child index -> the reply payload, or a :class:`_Failure`.
    """
    pending = {child.index: child for child in children}
    results: dict[int, Any] = {}
    while pending:
        handles = {child.conn: child for child in pending.values()}
        handles.update({child.proc.sentinel: child for child in pending.values()})
        ready = wait(list(handles), timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            for index in pending:
                results[index] = _Failure("timeout", "no reply before the timeout")
            break
        for child in {handles[h].index: handles[h] for h in ready}.values():
            results[child.index] = _read(child)
            del pending[child.index]
    return results


class ProcessVectorEnv(VectorEnv):
    """A vector env whose ``num_envs`` envs run in ``num_processes`` spawned processes.

    Args:
        name: registered simulator name (``SIMULATORS``).
        options: the simulator's options (plain values; they are pickled to the children).
        num_envs: ``N``, split into contiguous, nearly equal chunks over the processes.
        num_processes: ``P`` simulator processes, ``1 <= P <= N``.
        step_timeout_s: a step (each step of a chunk) or render that takes longer counts as
            a hang.
        reset_timeout_s: the same for reset and for re-running an episode after a restart
            (plus ``step_timeout_s`` per re-run step).
        start_timeout_s: how long a process may take to import and build its env.
        max_restarts: restarts of one process within one call before giving up.
        plugin_modules: modules every child imports to register the simulator.
    """

    def __init__(
        self,
        name: str,
        options: Mapping[str, Any] | None,
        num_envs: int,
        num_processes: int,
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 300.0,
        start_timeout_s: float = 300.0,
        max_restarts: int = 3,
        plugin_modules: Sequence[str] = ("simulators",),
    ) -> None:
        if not 1 <= num_processes <= num_envs:
            raise ValueError(
                f"need 1 <= num_processes <= num_envs, got {num_processes}, {num_envs}"
            )
        for module in plugin_modules:
            importlib.import_module(module)
        SIMULATORS.get(name)  # an unknown name fails here, listing the known ones
        self.name = name
        self.options = dict(options or {})
        self.num_envs = num_envs
        self.spec: EnvSpec | None = None  # reported by the first child
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self.plugin_modules = tuple(plugin_modules)
        self._ctx = multiprocessing.get_context("spawn")  # never fork: children make GL contexts
        self._children = [_Child(i, envs) for i, envs in enumerate(_split(num_envs, num_processes))]
        self._counts = {"restarts": 0, "crashes": 0, "timeouts": 0, "errors": 0}
        self._descriptions: list[str] = []
        self._inactive = np.zeros(num_envs, bool)  # left out of the last reset
        self._was_reset = False
        self._finalizer = weakref.finalize(self, _shutdown, self._children)
        remove_orphans(f"{SHM_PREFIX}_")  # blocks of pools whose process was killed
        try:
            for child in self._children:
                self._spawn(child)  # all start importing in parallel ...
            for child in self._children:  # ... then each is connected in turn
                failure = self._handshake(child)
                if failure is not None:
                    raise SimulatorWorkerError(
                        f"{child.describe()} failed to start ({failure.kind}): {failure.detail}"
                    )
        except BaseException:
            self.close()
            raise

    # --- VectorEnv ---------------------------------------------------------------------------

    @property
    def task_descriptions(self) -> list[str]:
        return list(self._descriptions)

    def reset(
        self,
        task_ids: Sequence[int],
        init_state_ids: Sequence[int],
        active: Sequence[bool] | None = None,
    ) -> Obs:
        tasks, inits = check_reset_ids(self.spec, self.num_envs, task_ids, init_state_ids)
        on = check_active(self.num_envs, active)
        self._inactive = ~on
        # Each child leaves its own inactive envs out (a child with none active steps nothing).
        args = {c.index: (tasks[c.envs], inits[c.envs], on[c.envs]) for c in self._children}
        replies = self._call({i: ("reset", a) for i, a in args.items()}, self.reset_timeout_s)
        for child in self._children:
            child.reset_args = tuple(a.copy() for a in args[child.index])
            child.actions = []
        self._descriptions = [d for c in self._children for d in replies[c.index]]
        self._was_reset = True
        return self._read_obs()

    def step(self, actions: np.ndarray) -> StepResult:
        return self.step_chunk(check_actions(self.spec, self.num_envs, actions)[:, None])

    def step_chunk(self, actions: np.ndarray) -> StepResult:
        """Apply ``(N, C, A)`` actions: one message per simulator process."""
        if not self._was_reset:
            raise RuntimeError("ProcessVectorEnv: call reset() before step()")
        chunk = check_action_chunk(self.spec, self.num_envs, actions)
        commands = {c.index: ("step_chunk", (chunk[c.envs],)) for c in self._children}
        replies = self._call(commands, self.step_timeout_s * chunk.shape[1])
        for child in self._children:
            child.actions.append(chunk[child.envs])
        reward, done, success = (
            np.concatenate([replies[c.index][k] for c in self._children]) for k in range(3)
        )
        return StepResult(self._read_obs(), reward, done, success)

    def render(self, size: int | None = None, envs: Sequence[int] | None = None) -> np.ndarray:
        """Frames of ``envs`` (all by default), asked of the processes that hold them: of
        ``spec.render_shape`` for all their envs through the shared blocks, others (an
        evaluation's videos: a few episodes, another size) over the pipes."""
        if size is None and self.spec.render_shape is None:
            raise RuntimeError(f"simulator {self.name!r} cannot render (spec.render_shape is None)")
        ids = check_env_ids(self.num_envs, envs, self._inactive)
        local = {
            c.index: [i - c.envs.start for i in ids if c.envs.start <= i < c.envs.stop]
            for c in self._children
        }
        commands = {
            c.index: ("render", (size, local[c.index])) for c in self._children if local[c.index]
        }
        replies = self._call(commands, self.step_timeout_s)
        frames = {}  # env index -> frame
        for index, reply in replies.items():
            child = self._children[index]
            block = child.views["frames"] if reply is None else reply
            frames.update((child.envs.start + i, frame) for i, frame in zip(local[index], block))
        return np.stack([frames[i] for i in ids])

    def privileged_progress(self) -> np.ndarray | None:
        """Each process's ``privileged_progress``, in env order: ``(N,)`` float32, or
        ``None`` when the simulator has none.
        """
        if not self._was_reset:
            raise RuntimeError("ProcessVectorEnv: call reset() before privileged_progress()")
        commands = {c.index: ("progress", ()) for c in self._children}
        replies = self._call(commands, self.step_timeout_s)
        parts = [replies[c.index] for c in self._children]
        if any(part is None for part in parts):
            return None
        return np.concatenate(parts).astype(np.float32)

    def close(self) -> None:
        self._finalizer()  # runs _shutdown once; later calls do nothing

    # --- inspection (tests, metrics) ---------------------------------------------------------

    def child_pids(self) -> list[int]:
        """Process id of each simulator process, in env order."""
        return [child.proc.pid for child in self._children]

    def fault_counts(self) -> dict[str, int]:
        """Counters since start: ``restarts``, ``crashes``, ``timeouts``, ``errors``."""
        return dict(self._counts)

    # --- internals ---------------------------------------------------------------------------

    def _read_obs(self) -> Obs:
        """Copy the observations out of the blocks (the next command overwrites them)."""
        state = np.concatenate([c.views["state"] for c in self._children])
        image = self._concatenated("image") if self.spec.image_shape is not None else None
        wrist = self._concatenated("wrist") if self.spec.wrist_shape is not None else None
        return Obs(image=image, state=state, wrist_image=wrist)

    def _concatenated(self, view: str) -> np.ndarray:
        """One shared-memory view of every child, in env order (a copy)."""
        return np.concatenate([c.views[view] for c in self._children])

    def _spawn(self, child: _Child) -> None:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=child_main,
            args=(child_end, self.name, self.options, child.num_envs, self.plugin_modules),
            name=f"simulator-{child.index}",
            daemon=True,  # never outlive the parent
        )
        try:
            proc.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()  # only the child holds it now, so its death reads as EOF here
        child.proc, child.conn = proc, parent_end

    def _handshake(self, child: _Child) -> _Failure | None:
        """Receive a new child's spec, give it its block (allocated on first start)."""
        spec = _gather([child], time.monotonic() + self.start_timeout_s)[child.index]
        if isinstance(spec, _Failure):
            return spec
        if self.spec is None:
            self.spec = spec
        elif spec != self.spec:
            return _Failure("error", f"spec changed on restart: {spec} != {self.spec}")
        if child.shm is None:
            child.shm = SharedMemory(
                name=f"{SHM_PREFIX}_{os.getpid()}_{child.index}_{secrets.token_hex(4)}",
                create=True,
                size=max(1, block_size(spec, child.num_envs)),
            )
            child.views = shared_views(child.shm.buf, spec, child.num_envs)
        return self._ask(child, ("attach", (child.shm.name,)), self.start_timeout_s)

    def _ask(self, child: _Child, command: tuple, timeout_s: float) -> Any:
        """Send one command to one child and wait for its reply (or a :class:`_Failure`)."""
        try:
            child.conn.send(command)
        except OSError as exc:
            return _Failure("crash", f"pipe closed ({exc})")
        return _gather([child], time.monotonic() + timeout_s)[child.index]

    def _call(self, commands: dict[int, tuple], timeout_s: float) -> dict[int, Any]:
        """Send each child its command, gather every reply, recover the children that failed.

        Any exception escaping here (gave up, interrupted) closes the env: replies may be in
        flight, so the pipes cannot be trusted anymore.
        """
        if not self._finalizer.alive:
            raise RuntimeError("ProcessVectorEnv is closed")
        try:
            results: dict[int, Any] = {}
            sent = []
            for index, command in commands.items():
                child = self._children[index]
                try:
                    child.conn.send(command)
                    sent.append(child)
                except OSError as exc:
                    results[index] = _Failure("crash", f"pipe closed ({exc})")
            results.update(_gather(sent, time.monotonic() + timeout_s))
            for index, result in results.items():
                if isinstance(result, _Failure):
                    child = self._children[index]
                    results[index] = self._recover(child, commands[index], result, timeout_s)
            return results
        except BaseException:
            self.close()
            raise

    def _recover(self, child: _Child, command: tuple, failure: _Failure, timeout_s: float) -> Any:
        """Restart ``child`` and re-run its episode until ``command`` is answered."""
        kinds = {"crash": "crashes", "timeout": "timeouts", "error": "errors"}
        for attempt in range(self.max_restarts + 1):
            self._counts[kinds[failure.kind]] += 1
            if attempt == self.max_restarts:
                break
            steps = sum(chunk.shape[1] for chunk in child.actions)
            rerun = "" if command[0] == "reset" else f", re-running its {steps} steps"
            logger.warning(
                "%s: %s during %r (%s); restarting it%s",
                child.describe(), failure.kind, command[0], failure.detail.strip(), rerun,
            )  # fmt: skip
            self._counts["restarts"] += 1
            result = self._restart_and_rerun(child, command, timeout_s)
            if not isinstance(result, _Failure):
                return result
            failure = result
        message = (
            f"{child.describe()} failed {self.max_restarts + 1} times during {command[0]!r} "
            f"(gave up after max_restarts={self.max_restarts}); last failure, "
            f"{failure.kind}: {failure.detail}"
        )
        child.stop()  # it may hang: do not let close() wait for it
        raise SimulatorWorkerError(message)

    def _restart_and_rerun(self, child: _Child, command: tuple, timeout_s: float) -> Any:
        child.stop()
        self._spawn(child)
        failure = self._handshake(child)
        if failure is not None:
            return failure
        if command[0] != "reset" and child.reset_args is not None:
            actions = np.zeros((child.num_envs, 0, self.spec.action_dim))
            if child.actions:
                actions = np.concatenate(child.actions, axis=1)  # (k, T, A)
            timeout = self.reset_timeout_s + self.step_timeout_s * actions.shape[1]
            replayed = self._ask(child, ("replay", (*child.reset_args, actions)), timeout)
            if isinstance(replayed, _Failure):
                return replayed
        return self._ask(child, command, timeout_s)
