"""The vector-env interface every simulator implements, and a checker for it.

A simulator is a *vector* env: ``N`` environments stepped together, like Gymnasium's vector
envs but shaped for robot-policy rollouts:

- ``reset(task_ids, init_state_ids)`` puts env ``i`` into task ``task_ids[i]`` at the fixed,
  reproducible initial state ``init_state_ids[i]`` (LIBERO's official init states, or seeded
  start configurations in the fast MuJoCo task) and returns the first observation;
- ``step(actions)`` advances every env that is not done. An env that finished (success or
  ``max_steps``) stays done until the next reset: its later actions are ignored, its
  observation stays the final one, its reward is 0 and ``done``/``success`` keep their value;
- ``step_chunk(actions)`` applies a chunk of ``C`` actions per env (a policy's action chunk)
  and returns what ``C`` calls of ``step`` would have returned last, with the chunk's rewards
  summed. The default loops ``step``; a simulator whose observations are costly (rendering)
  overrides it to observe once per chunk. An env that finishes mid-chunk skips the rest of
  its chunk and keeps the observation of its final step (the latch above);
- ``task_descriptions`` holds one instruction per env ("reach the red target"), set by reset;
- ``render()`` returns frames for videos, ``close()`` frees processes and GL contexts.

Simulators register a builder ``builder(options: Mapping, num_envs: int) -> VectorEnv`` with
``SIMULATORS.register(name, builder)``; :func:`config_from_options` turns the options mapping
into the simulator's config dataclass with an error that lists the valid options.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

ConfigT = TypeVar("ConfigT")


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
        if min(self.state_dim, self.action_dim, self.max_steps, self.num_tasks) < 1:
            raise ValueError(f"state_dim, action_dim, max_steps and num_tasks must be >= 1: {self}")
        if self.num_init_states < 1:
            raise ValueError(f"num_init_states must be >= 1, got {self.num_init_states}")

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
    """

    image: np.ndarray | None
    state: np.ndarray


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
    def reset(self, task_ids: Sequence[int], init_state_ids: Sequence[int]) -> Obs:
        """Start a new episode in every env.

        Args:
            task_ids: ``(N,)`` task of each env, in ``[0, spec.num_tasks)``.
            init_state_ids: ``(N,)`` initial state of each env, in
                ``[0, spec.num_init_states)``; the same ``(task, init_state)`` always gives
                the same initial observation.

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
        chunk = check_action_chunk(self.spec, self.num_envs, actions)
        reward = np.zeros(self.num_envs, np.float32)
        for c in range(chunk.shape[1]):
            result = self.step(chunk[:, c])
            reward += result.reward
        result.reward = reward
        return result

    @property
    @abc.abstractmethod
    def task_descriptions(self) -> list[str]:
        """The instruction of each env's current task (``N`` strings, set by reset)."""

    @abc.abstractmethod
    def render(self) -> np.ndarray:
        """Return ``(N, H, W, 3)`` uint8 frames of the current states (for videos)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Free processes, GL contexts and memory; idempotent."""

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def config_from_options(
    config_cls: type[ConfigT], options: Mapping[str, Any] | None, simulator: str
) -> ConfigT:
    """Build a simulator's config dataclass from its options mapping.

    Raises:
        ValueError: naming the unknown options and listing the valid ones.
    """
    options = dict(options or {})
    valid = [field.name for field in dataclasses.fields(config_cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for simulator {simulator!r}; "
            f"valid options: {', '.join(valid)}"
        )
    return config_cls(**options)


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


class EnvCheckError(AssertionError):
    """A vector env broke the interface contract (raised by :func:`check_vector_env`)."""


def _expect(condition: bool, message: str) -> None:
    # Not ``assert``: the checker must also work under ``python -O``.
    if not condition:
        raise EnvCheckError(message)


def _check_obs(obs: Obs, spec: EnvSpec, num_envs: int, where: str) -> None:
    _expect(isinstance(obs, Obs), f"{where}: expected an Obs, got {type(obs).__name__}")
    state = obs.state
    _expect(
        isinstance(state, np.ndarray) and state.dtype == np.float32,
        f"{where}: state must be a float32 array, got {getattr(state, 'dtype', type(state))}",
    )
    _expect(
        state.shape == (num_envs, spec.state_dim),
        f"{where}: state shape {state.shape} != {(num_envs, spec.state_dim)}",
    )
    _expect(bool(np.all(np.isfinite(state))), f"{where}: state has NaN or inf")
    if spec.image_shape is None:
        _expect(obs.image is None, f"{where}: spec has no image_shape but obs.image is set")
        return
    image = obs.image
    _expect(
        isinstance(image, np.ndarray) and image.dtype == np.uint8,
        f"{where}: image must be a uint8 array, got {getattr(image, 'dtype', type(image))}",
    )
    expected = (num_envs, *spec.image_shape)
    _expect(image.shape == expected, f"{where}: image shape {image.shape} != {expected}")
    _expect(int(image.max()) > int(image.min()), f"{where}: image is a single flat colour")


def _check_step(result: StepResult, spec: EnvSpec, num_envs: int, where: str) -> None:
    _expect(isinstance(result, StepResult), f"{where}: expected a StepResult")
    _check_obs(result.obs, spec, num_envs, where)
    for name, dtype in (("reward", np.float32), ("done", np.bool_), ("success", np.bool_)):
        value = getattr(result, name)
        _expect(
            isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == (num_envs,),
            f"{where}: {name} must be a ({num_envs},) {np.dtype(dtype).name} array, got "
            f"{getattr(value, 'dtype', type(value))} {getattr(value, 'shape', '')}",
        )
    _expect(bool(np.all(np.isfinite(result.reward))), f"{where}: reward has NaN or inf")
    _expect(
        not np.any(result.success & ~result.done), f"{where}: success is set on an env not done"
    )


def _check_latched(before: StepResult, after: StepResult, where: str) -> None:
    """Envs done before a step must be unchanged by it (final obs, reward 0, same flags)."""
    done = before.done
    _expect(bool(np.all(after.done[done])), f"{where}: an env that was done is not done")
    _expect(
        np.array_equal(after.success[done], before.success[done]),
        f"{where}: success of a done env changed",
    )
    _expect(bool(np.all(after.reward[done] == 0)), f"{where}: a done env got a reward")
    _expect(
        np.array_equal(after.obs.state[done], before.obs.state[done]),
        f"{where}: the state of a done env changed",
    )
    if before.obs.image is not None:
        _expect(
            np.array_equal(after.obs.image[done], before.obs.image[done]),
            f"{where}: the image of a done env changed",
        )


def _same_obs(a: Obs, b: Obs) -> bool:
    same_image = (a.image is None and b.image is None) or (
        a.image is not None and b.image is not None and np.array_equal(a.image, b.image)
    )
    return same_image and np.array_equal(a.state, b.state)


def _check_episode(env: VectorEnv, actions: np.ndarray, where: str) -> list[StepResult]:
    """Step ``actions`` (``(T, N, A)``), checking every result and the done latch."""
    spec, num_envs = env.spec, env.num_envs
    results: list[StepResult] = []
    for t, action in enumerate(actions):
        result = env.step(action)
        _check_step(result, spec, num_envs, f"{where} step {t + 1}")
        if results:
            _check_latched(results[-1], result, f"{where} step {t + 1}")
        results.append(result)
    return results


def check_vector_env(
    env: VectorEnv, num_steps: int = 5, seed: int = 0, full_episode: bool = True
) -> None:
    """Check that ``env`` honours the :class:`VectorEnv` contract (like gymnasium's checker).

    Resets to a mix of tasks and init states, steps uniform random actions, and verifies
    shapes, dtypes and ranges of everything returned, the task descriptions, ``render()``,
    that a wrong action shape is refused, that resetting to the same ``(task, init_state)``
    gives the same observation and that the same actions then give the same results, that
    ``step_chunk`` over those actions ends with the same observations and flags and the
    summed rewards, and (``full_episode``) that every env is done after ``spec.max_steps``
    steps and stays done.

    Raises:
        EnvCheckError: naming the first broken rule.
    """
    spec, num_envs = env.spec, env.num_envs
    _expect(isinstance(spec, EnvSpec), f"env.spec must be an EnvSpec, got {type(spec).__name__}")
    _expect(isinstance(num_envs, int) and num_envs >= 1, f"bad num_envs {num_envs!r}")
    rng = np.random.default_rng(seed)
    index = np.arange(num_envs)
    tasks = index % spec.num_tasks
    inits = (index * 7 + seed) % spec.num_init_states  # spread over the init states
    first = env.reset(tasks, inits)
    _check_obs(first, spec, num_envs, "reset")
    descriptions = env.task_descriptions
    _expect(
        isinstance(descriptions, list)
        and len(descriptions) == num_envs
        and all(isinstance(d, str) and d for d in descriptions),
        f"task_descriptions must be {num_envs} non-empty strings, got {descriptions!r}",
    )
    low, high = spec.action_bounds()
    actions = rng.uniform(low, high, size=(num_steps, num_envs, spec.action_dim))
    results = _check_episode(env, actions.astype(np.float32), "random")
    if spec.render_shape is not None:
        frames = env.render()
        expected = (num_envs, *spec.render_shape)
        _expect(
            isinstance(frames, np.ndarray)
            and frames.dtype == np.uint8
            and frames.shape == expected,
            f"render() must return a {expected} uint8 array, got "
            f"{getattr(frames, 'dtype', type(frames))} {getattr(frames, 'shape', '')}",
        )
    try:
        env.step(np.zeros((num_envs, spec.action_dim + 1), np.float32))
    except ValueError:
        pass
    else:
        raise EnvCheckError("step accepted actions of the wrong shape (expected ValueError)")
    again = env.reset(tasks, inits)
    _expect(_same_obs(first, again), "reset to the same (task, init_state) gave another obs")
    _expect(env.task_descriptions == descriptions, "task descriptions changed on the same reset")
    replay = _check_episode(env, actions.astype(np.float32), "replay")
    for t, (a, b) in enumerate(zip(results, replay)):
        same = _same_obs(a.obs, b.obs) and all(
            np.array_equal(getattr(a, k), getattr(b, k)) for k in ("reward", "done", "success")
        )
        _expect(same, f"the same actions after the same reset differ at step {t + 1}")
    _check_chunks(env, tasks, inits, actions.astype(np.float32), results)
    if full_episode:
        _check_full_episode(env, tasks, inits, rng)


def _check_chunks(
    env: VectorEnv,
    tasks: np.ndarray,
    inits: np.ndarray,
    actions: np.ndarray,
    results: list[StepResult],
) -> None:
    """``step_chunk`` over ``actions`` (``(T, N, A)``, in two chunks) ends where ``step`` did."""
    spec, num_envs = env.spec, env.num_envs
    env.reset(tasks, inits)
    try:
        env.step_chunk(np.zeros((num_envs, spec.action_dim), np.float32))
    except ValueError:
        pass
    else:
        raise EnvCheckError("step_chunk accepted (N, A) actions (expected ValueError)")
    split = max(1, len(actions) // 2)
    parts = [part for part in (actions[:split], actions[split:]) if len(part)]
    end = 0
    for i, part in enumerate(parts):
        result = env.step_chunk(np.swapaxes(part, 0, 1))  # (N, C, A)
        end += len(part)
        where = f"step_chunk {i + 1} (steps {end - len(part) + 1}..{end})"
        _check_step(result, spec, num_envs, where)
        expected = results[end - 1]
        _expect(
            _same_obs(result.obs, expected.obs)
            and np.array_equal(result.done, expected.done)
            and np.array_equal(result.success, expected.success),
            f"{where}: the observation or flags differ from {len(part)} single steps",
        )
        summed = np.sum([r.reward for r in results[end - len(part) : end]], axis=0)
        _expect(
            bool(np.allclose(result.reward, summed, rtol=1e-6, atol=1e-6)),
            f"{where}: reward {result.reward} is not the sum of the single steps' {summed}",
        )


def _check_full_episode(
    env: VectorEnv, tasks: np.ndarray, inits: np.ndarray, rng: np.random.Generator
) -> None:
    spec = env.spec
    env.reset(tasks, inits)
    low, high = spec.action_bounds()
    actions = rng.uniform(low, high, size=(spec.max_steps + 1, env.num_envs, spec.action_dim))
    results = _check_episode(env, actions.astype(np.float32), "full episode")
    _expect(
        bool(np.all(results[spec.max_steps - 1].done)),
        f"not every env is done after max_steps={spec.max_steps} steps",
    )
