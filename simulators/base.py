"""The vector-env interface every simulator implements (its checker: :mod:`simulators.checker`).

A simulator is a *vector* env: ``N`` environments stepped together, like Gymnasium's vector
envs but shaped for robot-policy rollouts:

- ``reset(task_ids, init_state_ids)`` puts env ``i`` into task ``task_ids[i]`` at the fixed,
  reproducible initial state ``init_state_ids[i]`` (LIBERO's official init states, or seeded
  start configurations in the fast MuJoCo task) and returns the first observation;
- ``step(actions)`` advances every env that is not done. An env that finished (success or
  ``max_steps``) stays done until the next reset: its later actions are ignored, its
  observation stays the final one, its reward is 0 and ``done``/``success`` keep their value;
- ``reset(..., active)`` with a ``(N,)`` bool mask leaves the envs it marks False out of the
  episode: they are neither reset nor stepped (a wave of fewer episodes than envs, an
  evaluation's padding, costs nothing for its spare envs); such an env is done from the reset
  on, never succeeds, gets reward 0, has all-zero observation rows and an empty task
  description, and cannot be rendered;
- ``step_chunk(actions)`` applies a chunk of ``C`` actions per env (a policy's action chunk)
  and returns what ``C`` calls of ``step`` would have returned last, with the chunk's rewards
  summed. The default loops ``step``; a simulator whose observations are costly (rendering)
  overrides it to observe once per chunk. An env that finishes mid-chunk skips the rest of
  its chunk and keeps the observation of its final step (the latch above);
- ``step_filmed(actions, size, envs)`` is ``step_chunk`` for an evaluation's video: it also
  draws a ``size`` frame of each of ``envs`` (episodes still running) after each of its env
  steps. The default loops ``step`` and ``render``; a simulator whose observations are costly
  overrides it to draw the policy's observation once per chunk there too, so that a video's
  frame costs one drawing, not two;
- ``task_descriptions`` holds one instruction per env ("reach the red target"), set by reset;
- ``privileged_progress()`` returns a number in ``[0, 1]`` per env that follows the task's goal,
  read from simulator state the policy cannot see (exactly 1 at success, below 1 otherwise):
  for logging and oracle rewards, never a policy input. A done env keeps its final value, an
  env left out of the reset has 0. ``None`` from a simulator that has no such measure;
- ``render(size=None, envs=None)`` returns frames of the current states: at
  ``spec.render_shape`` (the SRPO encoder's frames), or square at ``size`` (an evaluation's
  videos, drawn at their own size whatever the policy's image size); of every env, or of
  ``envs`` only; ``close()`` frees processes and GL contexts.

The ``check_*`` helpers validate the arguments of these methods with one message shape for
every simulator. A simulator's builder of such an env is registered through
:mod:`simulators.registry`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embodied_rl.checks import check_fields


@dataclass(frozen=True)
class EnvSpec:
    """Static description of a vector env's observations and actions.

    Attributes:
        image_shape: ``(H, W, 3)`` of the uint8 camera observation, ``None`` when the env
            returns no image.
        state_dim: ``S``, size of the float32 state (proprio) observation.
        action_dim: ``A``, size of one action.
        action_low: lower action bound, one float for every dimension or ``A`` floats.
        action_high: upper action bound, like ``action_low``.
        max_steps: an episode is done after this many steps at the latest.
        num_tasks: valid task ids are ``0 .. num_tasks - 1``.
        num_init_states: valid init-state ids per task are ``0 .. num_init_states - 1``.
        render_shape: ``(H, W, 3)`` of the frames ``render()`` returns, ``None`` when the
            env cannot render.
        wrist_shape: ``(H, W, 3)`` of ``Obs.wrist_image``, ``None`` without a wrist camera.
    """

    image_shape: tuple[int, int, int] | None
    state_dim: int
    action_dim: int
    action_low: float | tuple[float, ...]
    action_high: float | tuple[float, ...]
    max_steps: int
    num_tasks: int
    num_init_states: int
    render_shape: tuple[int, int, int] | None = None
    wrist_shape: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        # Tuples (not arrays) keep the spec hashable, comparable and cheap to pickle.
        for name in ("action_low", "action_high"):
            value = getattr(self, name)
            if not np.isscalar(value):
                object.__setattr__(self, name, tuple(float(v) for v in value))
        low, high = self.action_bounds()
        if low.shape != (self.action_dim,) or high.shape != (self.action_dim,):
            raise ValueError(
                f"action bounds must be floats or {self.action_dim} values each, "
                f"got low={self.action_low!r}, high={self.action_high!r}"
            )
        if not np.all(low < high):
            raise ValueError(f"action_low must be < action_high, got {low} and {high}")
        sizes = ("state_dim", "action_dim", "max_steps", "num_tasks", "num_init_states")
        check_fields(self, sizes, 1)

    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(low, high)``, each ``(A,)`` float32."""
        low = np.broadcast_to(np.asarray(self.action_low, np.float32), (self.action_dim,))
        high = np.broadcast_to(np.asarray(self.action_high, np.float32), (self.action_dim,))
        return low.copy(), high.copy()


@dataclass
class Obs:
    """A batch of observations.

    Attributes:
        image: ``(N, H, W, 3)`` uint8 camera images, ``None`` when the env has no camera.
        state: ``(N, S)`` float32 state (proprio) vector.
        wrist_image: ``(N, H, W, 3)`` uint8 wrist camera images (``EnvSpec.wrist_shape``),
            ``None`` when the env has no wrist camera (LIBERO has one).
    """

    image: np.ndarray | None
    state: np.ndarray
    wrist_image: np.ndarray | None = None


@dataclass
class StepResult:
    """What ``VectorEnv.step`` returns.

    Attributes:
        obs: observations after the step (the final one for envs that are done).
        reward: ``(N,)`` float32, 0 for envs that were done before this step.
        done: ``(N,)`` bool, True from the step an episode ends until the next reset.
        success: ``(N,)`` bool, whether the episode succeeded (kept once done).
    """

    obs: Obs
    reward: np.ndarray
    done: np.ndarray
    success: np.ndarray


class VectorEnv(abc.ABC):
    """``num_envs`` environments that reset and step together (see the module docstring)."""

    num_envs: int
    spec: EnvSpec

    @abc.abstractmethod
    def reset(
        self,
        task_ids: Sequence[int],
        init_state_ids: Sequence[int],
        active: Sequence[bool] | None = None,
    ) -> Obs:
        """Start a new episode in every env (every active env).

        Args:
            task_ids: ``(N,)`` task of each env, in ``[0, spec.num_tasks)``.
            init_state_ids: ``(N,)`` initial state of each env, in
                ``[0, spec.num_init_states)``; the same ``(task, init_state)`` always gives
                the same initial observation.
            active: ``(N,)`` bool, ``None`` = all. An inactive env is not reset nor stepped
                until the next reset: done and not successful from now on, reward 0, zero
                observation rows, description ``""`` (:func:`check_active`). Its ids are
                still checked. Active envs' episodes are the same whatever the mask.

        Returns:
            The first observations.
        """

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` (``(N, A)``, within the spec's bounds) to the envs not done."""

    def step_chunk(self, actions: np.ndarray) -> StepResult:
        """Apply a chunk of actions, ``(N, C, A)``: ``C`` steps of ``step``, in order.

        Returns:
            The result after the chunk: the last observations (an env that finished
            mid-chunk keeps the one of its final step), ``reward`` summed over the chunk,
            ``done``/``success`` after the chunk.
        """
        return self.step_filmed(actions, 0, [])[0]  # the same loop, nothing filmed

    def step_filmed(
        self, actions: np.ndarray, size: int, envs: Sequence[int]
    ) -> tuple[StepResult, list[np.ndarray]]:
        """``step_chunk(actions)`` plus a frame of each of ``envs`` after every env step it takes.

        Args:
            actions: ``(N, C, A)``, as for ``step_chunk``.
            size: side of the square frames (``render(size)``'s).
            envs: the envs to film, each with its episode running (not done).

        Returns:
            ``step_chunk``'s result, and per env of ``envs`` its ``(K, size, size, 3)`` uint8
            frames: one after each of the ``K`` env steps it took (``K < C`` when its episode
            ended mid-chunk).
        """
        chunk = check_action_chunk(self.spec, self.num_envs, actions)
        filming = [int(i) for i in envs]
        frames: dict[int, list[np.ndarray]] = {i: [] for i in filming}
        reward = np.zeros(self.num_envs, np.float32)
        for c in range(chunk.shape[1]):
            result = self.step(chunk[:, c])
            reward += result.reward
            if filming:
                for i, frame in zip(filming, self.render(size, filming)):
                    frames[i].append(frame)
                filming = [i for i in filming if not result.done[i]]
        result.reward = reward
        return result, [stack_frames(frames[int(i)], size) for i in envs]

    @property
    @abc.abstractmethod
    def task_descriptions(self) -> list[str]:
        """The instruction of each env's current task (``N`` strings, set by reset)."""

    def privileged_progress(self) -> np.ndarray | None:
        """Privileged task progress of each env's current state (see the module docstring).

        Call it after ``reset``, ``step`` or ``step_chunk``; the value of an env whose episode
        ended stays its value at the end, so reading it once all envs are done gives each
        episode's final progress.

        Returns:
            ``(N,)`` float32 in ``[0, 1]``: 1.0 exactly where the task succeeded, below 1
            elsewhere, 0 for envs left out of the last reset; ``None`` when this simulator
            has no privileged progress (the default).
        """
        return None

    @abc.abstractmethod
    def render(self, size: int | None = None, envs: Sequence[int] | None = None) -> np.ndarray:
        """Return frames of the current states (videos, the SRPO encoder).

        Args:
            size: side of square frames drawn at this size; ``None`` = ``spec.render_shape``.
            envs: the envs to draw, in this order (:func:`check_env_ids`); ``None`` = all.
                A few episodes replayed on a wider vector env draw only theirs. An env
                made inactive by the last reset cannot be drawn (ValueError).

        Returns:
            ``(len(envs) or N, H, W, 3)`` uint8: ``spec.render_shape`` or ``(size, size, 3)``.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Free processes, GL contexts and memory; idempotent."""

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def distance_fraction(remaining: float, initial: float) -> float:
    """The share of a distance covered: ``clip(1 - remaining / initial, 0, 1)``.

    Privileged progress terms: ``remaining`` is a distance now, ``initial`` the same distance
    at the episode's start (metres). Moving farther than at the start counts 0, not less. An
    initial distance of 0 (already there) gives 1 while ``remaining`` is 0, else 0.
    """
    if initial <= 0.0:
        return 1.0 if remaining <= 0.0 else 0.0
    return float(np.clip(1.0 - remaining / initial, 0.0, 1.0))


def check_reset_ids(
    spec: EnvSpec, num_envs: int, task_ids: Sequence[int], init_state_ids: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Validate reset arguments; return them as two ``(N,)`` int64 arrays."""
    tasks = np.asarray(task_ids, dtype=np.int64).reshape(-1)
    inits = np.asarray(init_state_ids, dtype=np.int64).reshape(-1)
    if tasks.shape != (num_envs,) or inits.shape != (num_envs,):
        raise ValueError(
            f"reset needs {num_envs} task ids and {num_envs} init-state ids, "
            f"got {tasks.size} and {inits.size}"
        )
    if tasks.min() < 0 or tasks.max() >= spec.num_tasks:
        raise ValueError(f"task ids must be in [0, {spec.num_tasks}), got {tasks.tolist()}")
    if inits.min() < 0 or inits.max() >= spec.num_init_states:
        raise ValueError(
            f"init-state ids must be in [0, {spec.num_init_states}), got {inits.tolist()}"
        )
    return tasks, inits


def check_active(num_envs: int, active: Sequence[bool] | None) -> np.ndarray:
    """``reset``'s ``active``: a ``(N,)`` bool array (``None``: every env is active)."""
    if active is None:
        return np.ones(num_envs, bool)
    mask = np.asarray(active)
    if mask.dtype != np.bool_ or mask.shape != (num_envs,):
        raise ValueError(
            f"reset's active must be {num_envs} booleans (one per env), got "
            f"{mask.dtype} of shape {mask.shape}"
        )
    return mask.copy()


def stack_frames(frames: list[np.ndarray], size: int) -> np.ndarray:
    """``(K, size, size, 3)`` uint8 from ``K`` frames (``K`` may be 0)."""
    return np.stack(frames) if frames else np.zeros((0, size, size, 3), np.uint8)


def check_env_ids(
    num_envs: int, envs: Sequence[int] | None, inactive: np.ndarray | None = None
) -> list[int]:
    """``render``'s ``envs``: the env indices as a list (``None``: all ``num_envs``).

    Args:
        inactive: ``(N,)`` bool, the envs the last reset left out: asking for one of them
            is refused (they hold no episode to draw).
    """
    ids = list(range(num_envs)) if envs is None else [int(i) for i in envs]
    if any(not 0 <= i < num_envs for i in ids):
        raise ValueError(f"env indices must be in [0, {num_envs}), got {ids}")
    if inactive is not None:
        left_out = [i for i in ids if inactive[i]]
        if left_out:
            raise ValueError(
                f"envs {left_out} were left out of the last reset (active=False): nothing to "
                f"draw; pass the active envs' indices as envs="
            )
    return ids


def check_actions(spec: EnvSpec, num_envs: int, actions: np.ndarray) -> np.ndarray:
    """Validate a batch of actions; return it as an ``(N, A)`` float64 array (a copy)."""
    array = np.array(actions, dtype=np.float64)
    if array.shape != (num_envs, spec.action_dim):
        raise ValueError(
            f"actions must have shape ({num_envs}, {spec.action_dim}), got {array.shape}"
        )
    if not np.all(np.isfinite(array)):
        raise ValueError("actions contain NaN or inf")
    return array


def check_action_chunk(spec: EnvSpec, num_envs: int, actions: np.ndarray) -> np.ndarray:
    """Validate a chunk of actions; return it as an ``(N, C, A)`` float64 array (a copy)."""
    array = np.array(actions, dtype=np.float64)
    if array.ndim != 3 or array.shape[0] != num_envs or array.shape[2] != spec.action_dim:
        raise ValueError(
            f"an action chunk must have shape ({num_envs}, C, {spec.action_dim}), "
            f"got {array.shape}; a single step takes ({num_envs}, {spec.action_dim})"
        )
    if array.shape[1] < 1:
        raise ValueError("an action chunk needs at least one step (C >= 1)")
    if not np.all(np.isfinite(array)):
        raise ValueError("actions contain NaN or inf")
    return array
