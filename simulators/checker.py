"""An env checker: runs a vector env through the contract of :mod:`simulators.base`.

``check_vector_env(env)`` resets, steps (single actions and chunks) and, optionally, runs a
full episode, and raises :class:`EnvCheckError` naming the first broken rule: shapes and
dtypes of observations and step results, finished envs that stay latched, reproducible
resets, privileged progress in ``[0, 1]`` and 1 exactly at success.
"""

from __future__ import annotations

import numpy as np

from simulators.base import EnvSpec, Obs, StepResult, VectorEnv

Ids = tuple[np.ndarray, np.ndarray]  # reset's (task_ids, init_state_ids)


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
        _check_progress(env, result, f"{where} step {t + 1}")
        if results:
            _check_latched(results[-1], result, f"{where} step {t + 1}")
        results.append(result)
    return results


def _check_progress(env: VectorEnv, result: StepResult, where: str) -> None:
    """``privileged_progress()``, where the env has one: ``(N,)`` float32 in ``[0, 1]``,
    exactly 1 where the episode succeeded and below 1 where it has not."""
    progress = env.privileged_progress()
    if progress is None:
        return
    shape = (env.num_envs,)
    _expect(
        isinstance(progress, np.ndarray) and progress.dtype == np.float32
        and progress.shape == shape,
        f"{where}: privileged_progress() must be a {shape} float32 array, got "
        f"{getattr(progress, 'dtype', type(progress))} {getattr(progress, 'shape', '')}",
    )  # fmt: skip
    inside = bool(np.all((progress >= 0.0) & (progress <= 1.0)))  # False for NaN too
    _expect(inside, f"{where}: privileged progress outside [0, 1]: {progress}")
    _expect(
        bool(np.all(progress[result.success] == 1.0) and np.all(progress[~result.success] < 1.0)),
        f"{where}: privileged progress must be 1 exactly where the episode succeeded, below 1 "
        f"elsewhere; got {progress} for success {result.success}",
    )


def check_vector_env(
    env: VectorEnv, num_steps: int = 5, seed: int = 0, full_episode: bool = True
) -> None:
    """Check that ``env`` honours the :class:`VectorEnv` contract (like gymnasium's checker).

    Resets to a mix of tasks and init states, steps uniform random actions, and verifies
    shapes, dtypes and ranges of everything returned, the task descriptions, ``render()``,
    ``render(size)`` and ``render(size, envs)``, that a wrong action shape is refused, that
    resetting to the same ``(task, init_state)`` gives the same observation and that the same
    actions then give the same results, that ``step_chunk`` over those actions ends with the
    same observations and flags and the summed rewards, that ``step_filmed`` does too and
    films each env as ``render(size)`` after each single step would, that envs left out of a reset
    (``active``) are done with zero rows and leave the others' episodes unchanged, and
    (``full_episode``) that every env is done after ``spec.max_steps`` steps and stays done;
    after every single step, ``privileged_progress()`` (unless ``None``) is in ``[0, 1]``,
    exactly 1 where the episode succeeded.

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
        _check_render(env, None, None, (num_envs, *spec.render_shape))
        size = spec.render_shape[0] + 8  # another size: what an evaluation's videos ask for
        full = _check_render(env, size, None, (num_envs, size, size, 3))
        some = [num_envs - 1, 0]
        picked = _check_render(env, size, some, (2, size, size, 3))
        _expect(
            np.array_equal(picked, full[some]),
            f"render({size}, envs={some}) must return those envs' frames of render({size})",
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
    if spec.render_shape is not None:
        _check_filmed(env, (tasks, inits), actions.astype(np.float32), results[-1])
    if num_envs >= 2:
        _check_inactive(env, tasks, inits, actions.astype(np.float32), first, results)
    if full_episode:
        _check_full_episode(env, tasks, inits, rng)


def _check_render(
    env: VectorEnv, size: int | None, envs: list[int] | None, expected: tuple[int, ...]
) -> np.ndarray:
    frames = env.render(size, envs)
    call = f"render({size}, envs={envs})"
    _expect(
        isinstance(frames, np.ndarray) and frames.dtype == np.uint8 and frames.shape == expected,
        f"{call} must return a {expected} uint8 array, got "
        f"{getattr(frames, 'dtype', type(frames))} {getattr(frames, 'shape', '')}",
    )
    return frames


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
        _check_chunk_end(result, results[end - 1], env, where)
        summed = np.sum([r.reward for r in results[end - len(part) : end]], axis=0)
        _expect(
            bool(np.allclose(result.reward, summed, rtol=1e-6, atol=1e-6)),
            f"{where}: reward {result.reward} is not the sum of the single steps' {summed}",
        )


def _check_chunk_end(result: StepResult, last: StepResult, env: VectorEnv, where: str) -> None:
    """A chunk's ``result`` is well formed and ends where its last single step ``last`` did."""
    _check_step(result, env.spec, env.num_envs, where)
    _expect(
        _same_obs(result.obs, last.obs)
        and np.array_equal(result.done, last.done)
        and np.array_equal(result.success, last.success),
        f"{where}: the observation or flags differ from the single steps'",
    )


def _check_filmed(env: VectorEnv, ids: Ids, actions: np.ndarray, last: StepResult) -> None:
    """``step_filmed`` over ``actions`` (``(T, N, A)``, one chunk) from ``env.reset(*ids)``
    ends where ``T`` single steps did (``last``) and films each chosen env as ``render(size)``
    after each of its single steps."""
    spec, num_envs = env.spec, env.num_envs
    size = spec.render_shape[0] + 8
    filmed = [num_envs - 1, 0] if num_envs >= 2 else [0]
    env.reset(*ids)
    expected: dict[int, list[np.ndarray]] = {i: [] for i in filmed}
    running = list(filmed)
    for step_actions in actions:
        result = env.step(step_actions)
        for i, frame in zip(running, env.render(size, running)):
            expected[i].append(frame)
        running = [i for i in running if not result.done[i]]
    env.reset(*ids)
    result, clips = env.step_filmed(np.swapaxes(actions, 0, 1), size, filmed)
    where = f"step_filmed of {len(actions)} steps"
    _check_chunk_end(result, last, env, where)
    _expect(
        isinstance(clips, list) and len(clips) == len(filmed),
        f"{where} must return one frame array per filmed env ({len(filmed)})",
    )
    for i, clip in zip(filmed, clips):
        frames = np.stack(expected[i])
        _expect(
            isinstance(clip, np.ndarray) and clip.dtype == np.uint8 and clip.shape == frames.shape,
            f"{where}: env {i}'s frames must be a {frames.shape} uint8 array, got "
            f"{getattr(clip, 'dtype', type(clip))} {getattr(clip, 'shape', '')}",
        )
        _expect(
            np.array_equal(clip, frames),
            f"{where}: env {i}'s frames differ from render({size}) after each single step",
        )


def _check_inactive(
    env: VectorEnv,
    tasks: np.ndarray,
    inits: np.ndarray,
    actions: np.ndarray,
    first: Obs,
    results: list[StepResult],
) -> None:
    """Reset with every odd env left out: the even envs replay ``results`` (``actions``,
    ``(T, N, A)``, after the reset that gave ``first``), the odd ones stay done, unsuccessful,
    unrewarded and zero, and cannot be drawn; a full reset brings them back."""
    num_envs = env.num_envs
    on = np.arange(num_envs) % 2 == 0
    obs = env.reset(tasks, inits, on)
    _check_obs(obs, env.spec, num_envs, "reset with active")

    def same_rows(a: Obs, b: Obs, rows: np.ndarray) -> bool:
        same_image = a.image is None or np.array_equal(a.image[rows], b.image[rows])
        return same_image and np.array_equal(a.state[rows], b.state[rows])

    _expect(same_rows(obs, first, on), "envs left active got another first observation")
    zero = not np.any(obs.state[~on]) and (obs.image is None or not np.any(obs.image[~on]))
    _expect(zero, "envs left out of the reset (active=False) must have zero observation rows")
    descriptions = env.task_descriptions
    _expect(
        all((d != "") == o for d, o in zip(descriptions, on)),
        f"task descriptions must be empty exactly for the envs left out, got {descriptions!r}",
    )
    for t, action in enumerate(actions):
        result = env.step(action)
        where = f"step {t + 1} with active"
        _check_step(result, env.spec, num_envs, where)
        expected = results[t]
        same = same_rows(result.obs, expected.obs, on) and all(
            np.array_equal(getattr(result, k)[on], getattr(expected, k)[on])
            for k in ("reward", "done", "success")
        )
        _expect(same, f"{where}: the active envs' results depend on the envs left out")
        _expect(
            bool(np.all(result.done[~on]) and not np.any(result.success[~on]))
            and not np.any(result.reward[~on]),
            f"{where}: an env left out must be done, unsuccessful and get reward 0",
        )
    if env.spec.render_shape is not None:
        try:
            env.render(None, [1])
        except ValueError:
            pass
        else:
            raise EnvCheckError("render() drew env 1, which the last reset left out")
    _expect(_same_obs(env.reset(tasks, inits), first), "a full reset after active= differs")


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
