"""The ``libero`` simulator against the raw LIBERO env: conventions, episode end, chunked
steps, pool parity, memory over task changes (scenes and renderers: ``test_libero_scene.py``).

One module-scoped env of ``libero_common.OPTIONS`` serves most tests that need a built env.
Tests that need LIBERO are marked ``libero`` and skip when it is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest

from embodied_rl.registry import SIMULATORS
from embodied_rl.runtime.memory import worker_process_env
from simulators.base import Obs
from simulators.checker import check_vector_env
from simulators.libero import LiberoConfig, LiberoVectorEnv
from simulators.libero.suites import NOOP_ACTION, LiberoApi, make_suite, quat_to_axis_angle
from tests.simulators.libero_common import INIT, MOVES, OPTIONS, SIZE, TASK, requires_libero

ROOT = Path(__file__).resolve().parents[2]
DRAWER_JOINT = "wooden_cabinet_1_middle_level"  # task 0 succeeds when it is < -0.14 (open)


def _axis_angle(quat: np.ndarray) -> np.ndarray:
    """Rotation vector of an ``(x, y, z, w)`` quaternion, written apart from the package's.

    The half angle is ``atan2(|v|, w)``, so the angle runs over ``[0, 2 pi]`` like robosuite's
    ``2 acos(w)`` (no folding to ``[0, pi]`` for ``w < 0``).
    """
    vector = np.asarray(quat[:3], dtype=np.float64)
    norm = np.linalg.norm(vector)
    if norm == 0:
        return np.zeros(3)
    return vector / norm * (2.0 * np.arctan2(norm, quat[3]))


def _expected_proprio(raw_obs: dict) -> np.ndarray:
    return np.concatenate(
        [
            raw_obs["robot0_eef_pos"],
            _axis_angle(raw_obs["robot0_eef_quat"]),
            raw_obs["robot0_gripper_qpos"],
        ]
    ).astype(np.float32)


@pytest.fixture(scope="module")
def env():
    environment = SIMULATORS.get("libero")(OPTIONS, 1)
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def libero_task():
    """``(task, init_states)`` of libero_goal task 0, read from the benchmark directly."""
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()["libero_goal"]()
    return suite.get_task(TASK), np.asarray(suite.get_task_init_states(TASK))


# --- without LIBERO -------------------------------------------------------------------------


def test_quat_to_axis_angle_matches_an_independent_formula():
    s = np.sqrt(0.5)
    np.testing.assert_allclose(quat_to_axis_angle([0, 0, s, s]), [0, 0, np.pi / 2], atol=1e-12)
    # w < 0: 270 degrees about x stays 3 pi / 2 (robosuite's convention), not -pi / 2.
    half = 0.75 * np.pi
    np.testing.assert_allclose(
        quat_to_axis_angle([np.sin(half), 0, 0, np.cos(half)]), [1.5 * np.pi, 0, 0], atol=1e-12
    )
    np.testing.assert_array_equal(quat_to_axis_angle([0, 0, 0, 1]), np.zeros(3))
    quats = np.random.default_rng(0).normal(size=(20, 4))
    for quat in quats / np.linalg.norm(quats, axis=1, keepdims=True):
        np.testing.assert_allclose(quat_to_axis_angle(quat), _axis_angle(quat), atol=1e-9)


def test_config_validation_says_what_to_change():
    assert LiberoConfig(cameras=["agentview"]).cameras == ("agentview",)  # YAML lists
    assert LiberoConfig(suite="libero_10").episode_steps == 520
    assert LiberoConfig(max_steps=7).episode_steps == 7
    with pytest.raises(ValueError, match="distinct names"):
        LiberoConfig(cameras=["agentview", "frontview"])
    with pytest.raises(ValueError, match="'wrist' needs 'agentview'"):
        LiberoConfig(cameras=["wrist"])
    with pytest.raises(ValueError, match="set max_steps"):
        LiberoConfig(suite="libero_goal_swap")
    with pytest.raises(ValueError, match=r"reset_mode must be one of \['soft', 'hard'\]"):
        LiberoConfig(reset_mode="fast")
    with pytest.raises(ValueError, match="max_cached_tasks must be >= 1"):
        LiberoConfig(max_cached_tasks=0)
    with pytest.raises(ValueError, match="unknown option"):
        SIMULATORS.get("libero")({"suite": "libero_goal", "image_sise": 64}, 1)


def test_building_without_libero_names_the_install_command(monkeypatch):
    for name in [m for m in sys.modules if m == "libero" or m.startswith("libero.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None = "not importable" to Python
    monkeypatch.setitem(sys.modules, "libero", None)
    with pytest.raises(ImportError, match="EMBODIED_RL_EXTRAS=dev,libero bash scripts/install"):
        SIMULATORS.get("libero")({"suite": "libero_goal"}, 1)


def test_make_suite_drops_only_the_task_order_line(capsys):
    class Suite:
        def __init__(self) -> None:
            print("[info] Applying task order index 0 (permutation: [0, 1]) for benchmark 'x'")
            print("[info] using task orders [0, 1]")  # the official LIBERO's line
            print("[warning] something the user should see")

    api = LiberoApi(
        type("Benchmark", (), {"get_benchmark_dict": lambda: {"x": Suite}}), *[None] * 3
    )
    assert isinstance(make_suite(api, "x"), Suite)
    assert capsys.readouterr().out == "[warning] something the user should see\n"


# --- with LIBERO ----------------------------------------------------------------------------

# Building an env in a fresh process: robosuite's import (its macro-file notice) and making the
# suite (LIBERO's task-order line) print nothing; a robosuite warning of another kind shows.
_QUIET_BUILD = """
import logging, sys
sys.path.insert(0, {root!r})
from embodied_rl.registry import SIMULATORS
import simulators
SIMULATORS.get("libero")({options!r}, 1).close()
logging.getLogger("robosuite_logs").warning("a robosuite warning of another kind")
"""


@pytest.mark.libero
@requires_libero
def test_building_an_env_prints_no_library_notices():
    script = _QUIET_BUILD.format(root=str(ROOT), options=OPTIONS)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == ""
    assert "macro" not in out.stderr and "a robosuite warning of another kind" in out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr


@pytest.mark.libero
@requires_libero
def test_suite_specs_follow_the_openvla_conventions():
    expected = {
        "libero_spatial": (220, 10),
        "libero_object": (280, 10),
        "libero_goal": (300, 10),
        "libero_10": (520, 10),
        "libero_90": (400, 90),
    }
    for suite, (max_steps, num_tasks) in expected.items():
        spec = LiberoVectorEnv(LiberoConfig(suite=suite), 2).spec  # builds no robosuite env
        assert (spec.max_steps, spec.num_tasks, spec.num_init_states) == (max_steps, num_tasks, 50)
        assert (spec.state_dim, spec.action_dim, spec.image_shape) == (8, 7, (128, 128, 3))
    spec = LiberoVectorEnv(LiberoConfig(suite="libero_object", max_steps=512, cameras=[]), 1).spec
    assert spec.max_steps == 512 and spec.image_shape is None
    with pytest.raises(ValueError, match="installed benchmark has: .*libero_spatial"):
        LiberoVectorEnv(LiberoConfig(suite="libero_nonexistent", max_steps=5), 1)


@pytest.mark.libero
@requires_libero
def test_observations_and_steps_match_the_raw_env(env, libero_task):
    from libero.libero import get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    task, init_states = libero_task
    raw = OffScreenRenderEnv(
        bddl_file_name=os.path.join(
            get_libero_path("bddl_files"), task.problem_folder, task.bddl_file
        ),
        camera_names=["agentview", "robot0_eye_in_hand"],
        camera_heights=SIZE,
        camera_widths=SIZE,
    )
    try:
        raw.seed(0)
        raw.reset()
        flags = raw.sim._render_context_offscreen.scn.flags  # the wrapper's default: off
        flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        raw_obs = raw.set_init_state(init_states[INIT])
        unsettled = _expected_proprio(raw_obs)
        for _ in range(10):
            raw_obs, _, _, _ = _raw_step(raw, list(NOOP_ACTION))

        obs = env.reset([TASK], [INIT])
        assert obs.wrist_image is not None and obs.wrist_image.shape == (1, *env.spec.wrist_shape)
        assert env.task_descriptions == [task.language] == ["open the middle drawer of the cabinet"]
        _assert_matches_raw(obs, raw_obs)
        assert not np.array_equal(obs.image[0], raw_obs["agentview_image"])  # flip matters
        assert not np.allclose(obs.state[0], unsettled, atol=1e-4)  # the settle steps happened
        _raw_current(raw)
        video = raw.sim.render(camera_name="agentview", width=96, height=96)  # render_size
        np.testing.assert_array_equal(env.render()[0], video[::-1, ::-1])

        # The next no-op is the raw env's 11th: the states differ, so 11 settle steps would
        # have been caught above; the wrapper's first counted step equals it.
        result = env.step(np.array([NOOP_ACTION], np.float32))
        raw_obs, _, _, _ = _raw_step(raw, list(NOOP_ACTION))
        assert not np.allclose(obs.state[0], _expected_proprio(raw_obs), atol=1e-6)
        _assert_matches_raw(result.obs, raw_obs)

        # Out-of-range values act as the bound (the wrapper clips; robosuite would too), the
        # rest reaches the env unchanged (no rescaling, no gripper flip).
        action = np.array([[1.7, -0.4, 0.3, 0.0, 0.05, -2.0, 1.0]], np.float32)
        result = env.step(action)
        raw_obs, _, _, _ = _raw_step(raw, np.clip(action[0], -1, 1).tolist())
        _assert_matches_raw(result.obs, raw_obs)
        assert result.success[0] == raw.check_success() and not result.done[0]
        assert result.reward[0] == 0.0
        # A chunk draws its observation once, at the end: robosuite's after the last step
        # (steps 3 and 4 of max_steps=4).
        chunk = MOVES
        result = env.step_chunk(chunk[None])
        for action in chunk:
            raw_obs, _, _, _ = _raw_step(raw, action.tolist())
        _assert_matches_raw(result.obs, raw_obs)
    finally:
        _close_raw(raw)


def _raw_current(raw) -> None:
    """Make the raw env's GL context current: robosuite draws (camera observations,
    ``sim.render``) with whichever context is current, and our renderers release theirs."""
    raw.sim._render_context_offscreen.gl_ctx.make_current()


def _raw_step(raw, action):
    _raw_current(raw)
    return raw.step(action)


def _close_raw(raw) -> None:
    """Close a raw LIBERO env with its GL context current.

    robosuite frees its render context's GL objects in whichever GL context is current:
    under one of our renderers' contexts it would delete that renderer's textures.
    """
    _raw_current(raw)
    raw.close()


def _assert_matches_raw(obs: Obs, raw_obs: dict) -> None:
    """The wrapper's observation = the raw one rotated by 180 degrees, proprio from it."""
    np.testing.assert_array_equal(obs.image[0], raw_obs["agentview_image"][::-1, ::-1])
    np.testing.assert_array_equal(
        obs.wrist_image[0], raw_obs["robot0_eye_in_hand_image"][::-1, ::-1]
    )
    np.testing.assert_allclose(obs.state[0], _expected_proprio(raw_obs), rtol=0, atol=1e-6)


@pytest.mark.libero
@requires_libero
def test_success_ends_the_episode_and_max_steps_limits_it(env):
    env.reset([TASK], [INIT])
    scene = env.scene(0)
    for _ in range(2):
        result = env.step(np.zeros((1, 7), np.float32))
        assert not result.done[0] and not result.success[0] and not scene.success()
    scene.env.sim.data.set_joint_qpos(DRAWER_JOINT, -0.155)  # pull the drawer open by hand
    started = scene.data.time
    # Success in the chunk's first step: the other two are skipped (one control step of
    # 0.05 s passes, not three), the reward is 1 and the episode is done.
    result = env.step_chunk(np.array([[np.zeros(7), np.ones(7), np.ones(7)]], np.float32))
    assert scene.success()
    assert scene.data.time == pytest.approx(started + 0.05, abs=1e-9)
    assert result.success[0] and result.done[0] and result.reward[0] == 1.0
    latched = env.step(np.ones((1, 7), np.float32))  # done: ignored until the next reset
    assert latched.done[0] and latched.success[0] and latched.reward[0] == 0.0
    np.testing.assert_array_equal(latched.obs.state, result.obs.state)
    np.testing.assert_array_equal(latched.obs.image, result.obs.image)

    env.reset([TASK], [INIT])  # same task: the built scene is kept (building takes seconds)
    assert env.scene(0) is scene and not scene.success()
    result = env.step_chunk(np.zeros((1, 3, 7), np.float32))
    assert not result.done[0] and result.reward[0] == 0.0
    result = env.step_chunk(np.zeros((1, 3, 7), np.float32))  # max_steps=4: ends mid-chunk
    assert result.done[0] and not result.success[0]
    assert scene.env.timestep == 10 + 4  # settle steps + 4 episode steps, not 6


@pytest.mark.libero
@requires_libero
def test_vector_env_contract(env):
    check_vector_env(env, full_episode=False)  # render() at 96 px and render(104) included


def test_video_frames_are_limited_to_the_offscreen_buffer():
    """Known without LIBERO (config validation asks): LIBERO's models draw at most 480 px."""
    limits = SIMULATORS.get("libero").limits({"suite": "libero_goal"})
    expected = {"max_render_size": 480, "state_dim": 8, "num_tasks": 10, "num_init_states": 50}
    assert limits == expected  # state_dim: eef position, axis-angle, 2 finger joints
    assert SIMULATORS.get("libero").limits({"suite": "x", "max_steps": 9}) == {
        "max_render_size": 480,
        "state_dim": 8,
    }


@pytest.mark.libero
@requires_libero
def test_render_at_a_video_size_draws_the_current_agentview(env):
    env.reset([TASK], [INIT])
    env.step(MOVES[:1])
    big = env.render(192)
    assert big.shape == (1, 192, 192, 3)
    # The same view as render_size's 96 px (flipped alike): near it, 2 x 2 blocks averaged.
    pooled = big.reshape(1, 96, 2, 96, 2, 3).mean(axis=(2, 4))
    assert np.abs(pooled - env.render()).mean() < 12
    # An explicit size draws, also the observation's size (the state now, not the observed).
    assert env.render(SIZE).shape == (1, SIZE, SIZE, 3)
    with pytest.raises(ValueError, match=r"libero render size must be in \[1, 480\]"):
        env.render(481)


@pytest.mark.libero
@requires_libero
def test_process_pool_gives_the_in_process_episode(env):
    # Both pool envs start from the same init state (one in-process reset to compare with)
    # and then take different actions.
    actions = np.array(
        [[0.5, 0.2, -0.3, 0.0, 0.1, 0.0, 1.0], [-0.6, 0.4, 0.2, 0.1, 0.0, -0.2, -1.0]], np.float32
    )
    chunk = np.stack([actions, actions[::-1]], axis=1)  # (2 envs, 2 steps, 7)
    pool = SIMULATORS.get("libero")(OPTIONS, 2, processes=2)
    try:
        first = pool.reset([TASK, TASK], [INIT, INIT])
        assert pool.task_descriptions == ["open the middle drawer of the cabinet"] * 2
        stepped = pool.step(actions)
        chunked = pool.step_chunk(chunk)  # one message per process
        check_vector_env(pool, num_steps=3, full_episode=False)
    finally:
        pool.close()
    expected = env.reset([TASK], [INIT])
    fields = ("image", "wrist_image", "state")  # the wrist camera too: the pool carries it
    for row in range(2):
        for name in fields:
            np.testing.assert_array_equal(getattr(first, name)[row], getattr(expected, name)[0])
    result = env.step(actions[1:])
    for name in fields:
        np.testing.assert_array_equal(getattr(stepped.obs, name)[1], getattr(result.obs, name)[0])
    assert not np.allclose(stepped.obs.state[0], stepped.obs.state[1], atol=1e-3)
    result = env.step_chunk(chunk[1:])
    for name in fields:
        np.testing.assert_array_equal(getattr(chunked.obs, name)[1], getattr(result.obs, name)[0])


# A rollout loop as a worker runs it, in a process of its own with a worker's allocator
# settings: one env, a new task at every reset (a scene and a renderer built, the last task's
# closed), episodes stepped in a thread (Ray runs actor calls in a pool thread).
_RESET_LOOP = """
import json, os, sys, threading
import numpy as np, psutil
sys.path.insert(0, {root!r})
from embodied_rl.registry import SIMULATORS
import simulators
env = SIMULATORS.get("libero")({options!r}, 1)
rss = []
def loop():
    for k in range({resets}):
        env.reset([k % 3], [k])
        for _ in range(2):
            env.step_chunk(np.zeros((1, 4, 7), np.float32))
        rss.append(psutil.Process().memory_info().rss / 2**20)
    env.close()
thread = threading.Thread(target=loop)
thread.start()
thread.join()
print(json.dumps(rss))
"""
RESET_LOOP_GROWTH_MB = 150.0  # one scene or renderer leaked per reset would exceed it


@pytest.mark.libero
@requires_libero
def test_rollout_loop_rss_stays_bounded_over_task_changes():
    options = {"suite": "libero_goal", "image_size": SIZE, "cameras": ["agentview"],
               "render_size": SIZE, "max_steps": 8}  # fmt: skip
    script = _RESET_LOOP.format(root=str(ROOT), options=options, resets=10)
    env_vars = {**os.environ, **worker_process_env()}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env_vars, capture_output=True, text=True, timeout=400
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    warm = rss[2]  # every one of the 3 tasks built once: the MuJoCo asset cache is full
    print("RSS per reset (MiB):", [round(x) for x in rss])
    assert max(rss[3:]) - warm < RESET_LOOP_GROWTH_MB, rss
