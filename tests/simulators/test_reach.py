"""The ``reach`` MuJoCo task: interface contract, determinism, learnability, camera, speed."""

from __future__ import annotations

import math
import time

import mujoco
import numpy as np
import pytest

from embodied_rl.registry import SIMULATORS
from simulators.checker import check_vector_env
from simulators.reach import (
    ARENA_HALF,
    CAMERA_FOVY,
    CAMERA_HEIGHT,
    COLOURS,
    InjectedSimulatorFault,
    ReachConfig,
    build_reach,
    expert_actions,
    init_positions,
    target_positions,
)

# Pixel colour rules for the 64 px top-down camera (lit colours, table grey ~(103, 103, 103)).
COLOUR_RULES = {
    "red": lambda r, g, b: (r > 150) & (g < 70) & (b < 70),
    "green": lambda r, g, b: (g > 140) & (r < 70) & (b < 70),
    "blue": lambda r, g, b: (b > 150) & (r < 70) & (g < 90),
    "yellow": lambda r, g, b: (r > 150) & (g > 140) & (b < 90),
    "white": lambda r, g, b: (r > 170) & (g > 170) & (b > 170),
}


def _run_episodes(env, policy, waves: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Run ``waves`` batches of episodes; return success (E,) and steps taken (E,)."""
    rng = np.random.default_rng(seed)
    successes, lengths = [], []
    spec, n = env.spec, env.num_envs
    for _ in range(waves):
        obs = env.reset(
            rng.integers(0, spec.num_tasks, n), rng.integers(0, spec.num_init_states, n)
        )
        steps = np.zeros(n, np.int64)
        for _ in range(env.spec.max_steps):
            result = env.step(policy(obs.state, rng))
            steps += ~result.done  # counts the steps before the final one
            obs = result.obs
            if result.done.all():
                break
        successes.append(result.success)
        lengths.append(steps + 1)
    return np.concatenate(successes), np.concatenate(lengths)


def test_reach_is_registered_and_rejects_unknown_options():
    assert SIMULATORS.get("reach").build is build_reach  # @register_simulator("reach")
    with pytest.raises(ValueError, match="imge_size") as info:
        build_reach({"imge_size": 64}, 2)
    assert "image_size" in str(info.value) and "debug_hang_at_step" in str(info.value)


def test_state_only_passes_checker_without_any_gl_context(monkeypatch):
    def no_gl(*args, **kwargs):
        raise AssertionError("state-only reach created a GL context")

    monkeypatch.setattr(mujoco, "Renderer", no_gl)
    monkeypatch.setattr(mujoco, "GLContext", no_gl)
    with build_reach({"render_size": 0}, 3) as env:
        assert env.spec.image_shape is None and env.spec.state_dim == 8
        check_vector_env(env, num_steps=4)
        with pytest.raises(RuntimeError, match="render_size"):
            env.render()


def test_image_mode_passes_checker():
    with build_reach({"image_size": 32, "render_size": 48}, 2) as env:
        assert env.spec.image_shape == (32, 32, 3) and env.spec.render_shape == (48, 48, 3)
        check_vector_env(env, num_steps=3)


def test_reset_is_deterministic_and_init_states_are_seeded_per_pair():
    config = ReachConfig()
    starts = init_positions(config)
    targets = target_positions(config.num_tasks)
    assert starts.shape == (4, 50, 2)
    distances = np.linalg.norm(starts - targets[:, None], axis=-1)
    assert distances.min() >= config.min_start_distance
    assert np.abs(starts).max() <= ARENA_HALF
    # A start depends only on (seed, task, init_state), not on how many init states exist.
    np.testing.assert_array_equal(init_positions(ReachConfig(num_init_states=5)), starts[:, :5])
    assert not np.array_equal(init_positions(ReachConfig(seed=1)), starts)

    with build_reach({}, 4) as env, build_reach({}, 4) as other:
        first = env.reset([0, 1, 2, 3], [0, 0, 7, 49])
        env.step(np.ones((4, 2), np.float32))
        again = env.reset([0, 1, 2, 3], [0, 0, 7, 49])
        elsewhere = other.reset([0, 1, 2, 3], [0, 0, 7, 49])
        assert env.task_descriptions == [f"reach the {c} target" for c in list(COLOURS)[:4]]
    for obs in (again, elsewhere):
        np.testing.assert_array_equal(obs.state, first.state)
    np.testing.assert_allclose(first.state[:, 0:2], starts[[0, 1, 2, 3], [0, 0, 7, 49]], atol=1e-6)
    np.testing.assert_array_equal(first.state[:, 2:4], 0.0)  # at rest
    np.testing.assert_allclose(first.state[:, 6:8], targets, atol=1e-6)
    np.testing.assert_allclose(first.state[:, 4:6], targets - first.state[:, 0:2], atol=1e-6)


def test_expert_always_succeeds_and_random_actions_rarely_do():
    with build_reach({}, 16) as env:
        expert, expert_steps = _run_episodes(env, lambda s, rng: expert_actions(s), waves=4)
        random, _ = _run_episodes(
            env, lambda s, rng: rng.uniform(-1, 1, (16, 2)).astype(np.float32), waves=4
        )
    assert expert.mean() == 1.0, expert
    assert expert_steps.max() <= 25, expert_steps  # well inside max_steps=50
    assert random.mean() <= 0.1, random.mean()  # measured: 0.003 over 320 episodes


def test_done_envs_stay_done_and_sparse_reward_marks_success():
    with build_reach({}, 2) as env:
        obs = env.reset([0, 3], [1, 2])
        total = np.zeros(2, np.float32)
        for _ in range(30):
            result = env.step(expert_actions(obs.state))
            total += result.reward
            obs = result.obs
        assert result.done.all() and result.success.all()
        np.testing.assert_array_equal(total, [1.0, 1.0])  # 1 on the success step only
        after = env.step(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(after.obs.state, result.obs.state)
    np.testing.assert_array_equal(after.reward, 0.0)
    assert after.done.all() and after.success.all()


def test_envs_left_out_of_a_reset_are_neither_reset_nor_stepped():
    """A wave of 1 episode on 3 envs: the expert's episode is the one it has alone, the
    2 spare envs are done from the reset with zero rows, keep the physics state of the
    previous episode (never reset, never stepped) and cannot be drawn."""
    with build_reach({"image_size": 16, "render_size": 16}, 1) as alone:
        obs = alone.reset([2], [5])
        expected = [obs]
        for _ in range(30):
            expected.append(alone.step(expert_actions(obs.state)).obs)
            obs = expected[-1]
    with build_reach({"image_size": 16, "render_size": 16}, 3) as env:
        env.reset([0, 1, 3], [0, 1, 2])
        before = env.step(np.full((3, 2), 0.5, np.float32))  # moves every arm off its start
        obs = env.reset([2, 2, 2], [5, 5, 5], active=np.array([True, False, False]))
        assert env.task_descriptions == ["reach the blue target", "", ""]
        assert not obs.state[1:].any() and not obs.image[1:].any()
        for t in range(30):
            np.testing.assert_array_equal(obs.state[0], expected[t].state[0], err_msg=f"{t}")
            np.testing.assert_array_equal(obs.image[0], expected[t].image[0], err_msg=f"{t}")
            result = env.step(np.concatenate([expert_actions(obs.state[:1]), np.ones((2, 2))]))
            obs = result.obs
            assert result.done[1:].all() and not result.success[1:].any()
            assert not result.reward[1:].any() and not obs.state[1:].any()
        assert result.success[0]
        # The spare envs' MjData were left as the step before the reset put them.
        for i in (1, 2):
            np.testing.assert_array_equal(
                env._data[i].qpos.astype(np.float32), before.obs.state[i, :2]
            )
        assert env.render(envs=[0]).shape == (1, 16, 16, 3)
        assert env.render(envs=[]).shape == (0, 16, 16, 3)
        with pytest.raises(ValueError, match=r"envs \[1\] were left out of the last reset"):
            env.render(envs=[0, 1])
        nobody = env.reset([0, 0, 0], [0, 0, 0], active=np.zeros(3, bool))
        assert not nobody.state.any() and env.step(np.zeros((3, 2), np.float32)).done.all()
        for bad in ([True, False], [1, 0, 0]):
            with pytest.raises(ValueError, match="active must be 3 booleans"):
                env.reset([0, 0, 0], [0, 0, 0], active=np.array(bad))


def test_dense_reward_telescopes_to_distance_covered():
    with build_reach({"reward": "dense"}, 1) as env:
        obs = env.reset([2], [5])
        start_distance = np.linalg.norm(obs.state[0, 4:6])
        total = 0.0
        for _ in range(50):
            result = env.step(0.5 * expert_actions(obs.state))
            total += float(result.reward[0])
            obs = result.obs
            if result.done[0]:
                break
    assert result.success[0]
    final_distance = np.linalg.norm(obs.state[0, 4:6])
    assert final_distance < 0.025
    assert total == pytest.approx(start_distance - final_distance + 1.0, abs=1e-5)


def _pixel(x: float, y: float, z: float, size: int) -> np.ndarray:
    """Project a world point on the top-down camera to (row, col) pixel coordinates."""
    half = (CAMERA_HEIGHT - z) * math.tan(math.radians(CAMERA_FOVY / 2))
    col = (x / half + 1) / 2 * size - 0.5
    row = (1 - y / half) / 2 * size - 0.5
    return np.array([row, col])


def _centroid(image: np.ndarray, colour: str) -> tuple[np.ndarray, int]:
    r, g, b = (image[..., k].astype(np.int32) for k in range(3))
    rows, cols = np.nonzero(COLOUR_RULES[colour](r, g, b))
    return np.array([rows.mean(), cols.mean()]) if rows.size else None, rows.size


def test_camera_shows_each_target_and_the_fingertip_where_they_are():
    with build_reach({"image_size": 64}, 2) as env:
        obs = env.reset([0, 2], [3, 4])
        moved = env.step(np.array([[1.0, 0.0], [0.0, -1.0]], np.float32)).obs
    assert obs.image.shape == (2, 64, 64, 3) and obs.image.dtype == np.uint8
    targets = target_positions(4)
    for i in range(2):
        finger = obs.state[i, 0:2]
        for colour, target in zip(["red", "green", "blue", "yellow"], targets):
            if np.linalg.norm(target - finger) < 0.06:
                continue  # the fingertip covers part of this disc
            centre, count = _centroid(obs.image[i], colour)
            assert count >= 20, (colour, count)  # a 0.03 m disc is ~48 pixels at 64 px
            np.testing.assert_allclose(centre, _pixel(*target, 0.001, 64), atol=1.0)
        for image, state in ((obs.image[i], obs.state[i]), (moved.image[i], moved.state[i])):
            centre, count = _centroid(image, "white")
            assert count >= 5
            np.testing.assert_allclose(centre, _pixel(*state[0:2], 0.02, 64), atol=1.0)
    assert not np.array_equal(obs.image, moved.image)


def test_fault_injection_options_fire_at_the_step_and_once(tmp_path):
    once = str(tmp_path / "fault")
    with build_reach({"debug_raise_at_step": 3, "debug_fault_once_path": once}, 2) as env:
        env.reset([0, 1], [0, 0])
        env.step(np.zeros((2, 2), np.float32))
        env.step(np.zeros((2, 2), np.float32))
        with pytest.raises(InjectedSimulatorFault, match="step 3"):
            env.step(np.zeros((2, 2), np.float32))
        env.reset([0, 1], [0, 0])  # the marker file exists now: the fault does not repeat
        for _ in range(4):
            env.step(np.zeros((2, 2), np.float32))


def test_steps_per_second_state_only_and_with_images():
    """Report simulation speed (printed with ``pytest -s``; no timing assertion)."""
    rates = {}
    for label, options in (("state-only", {}), ("64px images", {"image_size": 64})):
        with build_reach(options, 8) as env:
            actions = np.full((8, 2), 0.01, np.float32)  # creep: no episode ends early
            steps, start = 0, time.perf_counter()
            for wave in range(2 if options else 10):
                env.reset(np.arange(8) % 4, np.arange(8) + wave)
                for _ in range(env.spec.max_steps - 1):
                    result = env.step(actions)
                    steps += int((~result.done).sum())
            rates[label] = steps / (time.perf_counter() - start)
        assert steps == (2 if options else 10) * 8 * (env.spec.max_steps - 1)
    print(
        "reach steps/s, 8 envs in one process: "
        + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
    )


def test_render_at_another_size_leaves_the_observations_alone():
    """render(size) draws at any size, larger than the model's offscreen buffer (the 16 px
    of its observations) too; the observations stay those of an env that never did."""
    options = {"image_size": 16, "render_size": 16}
    actions = np.array([[1.0, -0.5], [-0.3, 0.8]], np.float32)
    with build_reach(options, 2) as env, build_reach(options, 2) as plain:
        env.reset([0, 1], [3, 4])
        plain.reset([0, 1], [3, 4])
        big = env.render(64)
        assert big.shape == (2, 64, 64, 3) and big.dtype == np.uint8
        # The same scene: the 64 px frame averaged over 4 x 4 blocks is near the 16 px one.
        pooled = big.reshape(2, 16, 4, 16, 4, 3).mean(axis=(2, 4))
        assert np.abs(pooled - env.render()).mean() < 10
        for _ in range(3):
            mine, theirs = env.step(actions), plain.step(actions)
            np.testing.assert_array_equal(mine.obs.image, theirs.obs.image)
            np.testing.assert_array_equal(env.render(), plain.render())
        assert not np.array_equal(env.render(64), big)  # it draws the current state
        with pytest.raises(ValueError, match="reach render size must be >= 1"):
            env.render(0)


def test_privileged_progress_is_the_share_of_the_start_distance_covered():
    """0 at the reset, ``1 - d / d0`` for a fingertip placed by hand (``d0``: the start
    distance), 0 farther away than at the start, below 1 just inside the success radius
    until a step finds the success, then exactly 1 (kept while done); 0 for an env left out."""
    config = ReachConfig(render_size=0)
    start, target = init_positions(config)[2, 5], target_positions(config.num_tasks)[2]
    d0 = float(np.linalg.norm(start - target))  # at least min_start_distance = 0.12 m
    with build_reach({"render_size": 0}, 2) as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.privileged_progress()
        env.reset([2, 0], [5, 0], active=np.array([True, False]))
        progress = env.privileged_progress()
        assert progress.dtype == np.float32 and progress.shape == (2,)
        np.testing.assert_array_equal(progress, [0.0, 0.0])
        finger = env._data[0].qpos  # the fingertip's (x, y), moved by hand below
        finger[:] = target + 0.25 * (start - target)  # a quarter of the start distance left
        assert env.privileged_progress()[0] == pytest.approx(0.75, abs=1e-6)
        finger[:] = start + 0.5 * (start - target)  # farther than at the start
        assert env.privileged_progress()[0] == 0.0
        finger[:] = target + (start - target) * (0.02 / d0)  # 2 cm away: success not yet seen
        assert env.privileged_progress()[0] == pytest.approx(1 - 0.02 / d0, abs=1e-6)
        assert env.privileged_progress()[0] < 1.0
        result = env.step(np.zeros((2, 2), np.float32))  # at rest: the step finds the success
        assert result.success[0] and env.privileged_progress()[0] == 1.0
        env.step(np.ones((2, 2), np.float32))  # done: ignored, the value kept
        np.testing.assert_array_equal(env.privileged_progress(), [1.0, 0.0])


def test_privileged_progress_of_expert_episodes_rises_to_one():
    with build_reach({"render_size": 0}, 4) as env:
        obs = env.reset([0, 1, 2, 3], [3, 4, 5, 6])
        values = [env.privileged_progress()]
        for _ in range(30):
            result = env.step(expert_actions(obs.state))
            obs = result.obs
            values.append(env.privileged_progress())
    values = np.stack(values)  # (31, 4)
    assert result.success.all()
    np.testing.assert_array_equal(values[0], 0.0)
    np.testing.assert_array_equal(values[-1], 1.0)
    assert np.all(np.diff(values, axis=0) >= 0)  # straight at the target: never back
