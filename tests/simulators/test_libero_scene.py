"""The ``libero`` simulator's scenes and renderers: soft resets that are bit for bit hard
resets, env steps that are bit for bit robosuite's (with and without the lean substeps), scenes kept by task around a shared renderer, one GL context per task and per thread,
scene models without texture pixels.

One module-scoped env of ``libero_common.OPTIONS`` serves most tests (its reset mode is
switched for a while where a test compares the two). Every test needs LIBERO: marked
``libero``, skipped when it is not installed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib

import mujoco
import numpy as np
import pytest

from embodied_rl.registry import SIMULATORS
from simulators.libero.lean_substeps import ArmSubsteps, ObservableClock
from simulators.libero.render import outside_view
from simulators.libero.scene import (
    step_with_split_substeps,
    with_shared_textures,
    without_texture_pixels,
)
from tests.simulators.libero_common import INIT, MOVES, OPTIONS, SIZE, TASK, requires_libero

# Sparse-Jacobian structure arrays: scratch memory MuJoCo leaves unwritten when the Jacobian
# is dense (asserted where they are skipped), so they hold whatever the arena held before.
SPARSE_SCRATCH = {"efc_J_rownnz", "efc_J_rowsuper", "efc_J_colind"}


@pytest.fixture(scope="module")
def env():
    environment = SIMULATORS.get("libero")(OPTIONS, 1)
    yield environment
    environment.close()


def _arrays(struct, skip=frozenset()) -> dict[str, np.ndarray]:
    """Copies of every array field of an ``mjData``/``mjModel`` (and ``time``)."""
    out = {}
    for name in dir(struct):
        value = getattr(struct, name, None) if not name.startswith("_") else None
        if isinstance(value, np.ndarray) and name not in skip:
            out[name] = value.copy()
    if hasattr(struct, "time"):
        out["time"] = np.array(struct.time)
    return out


def _assert_same_arrays(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys()
    differ = [name for name in expected if not np.array_equal(got[name], expected[name])]
    assert not differ, f"{what}: {differ} differ"


def _episode(env, init: int) -> list:
    """Reset to ``(TASK, init)`` and take MOVES: observations and every mjData array."""
    scene_arrays = lambda: _arrays(env.scene(0).data, SPARSE_SCRATCH)  # noqa: E731
    obs = env.reset([TASK], [init])
    records = [(obs, scene_arrays(), _arrays(env.scene(0).model))]
    for action in MOVES:
        records.append((env.step(action[None]).obs, scene_arrays(), None))
    return records


@contextlib.contextmanager
def _reset_mode(env, mode: str):
    """Reset the module's env (the same built scene) the other way for a while."""
    before, env.config.reset_mode = env.config.reset_mode, mode
    try:
        yield
    finally:
        env.config.reset_mode = before


@pytest.mark.libero
@requires_libero
def test_soft_reset_is_a_hard_reset_also_after_another_episode(env):
    with _reset_mode(env, "hard"):
        hard = _episode(env, INIT)  # robosuite rebuilds the model
    assert not mujoco.mj_isSparse(env.scene(0).model)  # SPARSE_SCRATCH is unused scratch
    env.reset([TASK], [7])  # another episode: the arm moves, the gripper closes
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(np.concatenate([rng.uniform(-1, 1, (1, 6)), np.ones((1, 1))], axis=1))
    soft = _episode(env, INIT)
    for t, ((h_obs, h_data, h_model), (s_obs, s_data, s_model)) in enumerate(zip(hard, soft)):
        for name in ("image", "wrist_image", "state"):
            np.testing.assert_array_equal(getattr(s_obs, name), getattr(h_obs, name), name)
        _assert_same_arrays(s_data, h_data, f"mjData after {t} steps")  # bit for bit
        if h_model is not None:
            _assert_same_arrays(s_model, h_model, "mjModel after the reset")
    assert not np.allclose(hard[0][0].state, hard[-1][0].state, atol=1e-3)  # MOVES moved


def _robosuite_step_records(env, step) -> list:
    """Reset to ``(TASK, INIT)``, then take MOVES twice (the env's max_steps) with ``step(robosuite_env,
    action)``: per step the observation dict, every mjData array, the state captured for the
    image, the robot's policy-step buffers (force-torque from acceleration-stage sensors), its
    controller's and gripper's last commands and every observable's timer."""
    env.reset([TASK], [INIT])
    scene = env.scene(0)
    robot = scene.env.robots[0]
    records = []
    for action in np.concatenate([MOVES] * 2):
        obs = step(scene.env, list(action))
        buffers = (robot.recent_ee_forcetorques.current, robot.recent_ee_acc.current)
        commands = (robot.controller.torques, robot.torques, robot.gripper.current_action)
        timers = [(o._time_since_last_sample, o._sampled) for o in scene.env._observables.values()]
        records.append(
            (
                {k: np.array(v) for k, v in obs.items()},
                _arrays(scene.data, SPARSE_SCRATCH),
                _arrays(scene._observed, SPARSE_SCRATCH),
                [np.array(b) for b in (*buffers, *commands)],
                timers,
            )
        )
    return records


def _assert_same_steps(got_steps: list, expected_steps: list) -> None:
    for t, (expected, got) in enumerate(zip(expected_steps, got_steps, strict=True)):
        assert expected[0].keys() == got[0].keys()
        for name in expected[0]:
            np.testing.assert_array_equal(got[0][name], expected[0][name], f"step {t}: {name}")
        _assert_same_arrays(got[1], expected[1], f"mjData after step {t}")
        _assert_same_arrays(got[2], expected[2], f"observed mjData at step {t}")
        for got_array, expected_array in zip(got[3], expected[3], strict=True):
            np.testing.assert_array_equal(got_array, expected_array)
        assert got[4] == expected[4], f"observable timers after step {t}"


@pytest.mark.libero
@requires_libero
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "robosuite_substeps"])
def test_split_substeps_compute_what_robosuites_step_computes(env, lean):
    raw = env.scene(0).env
    # LIBERO's robot and observables are the setup the lean substeps replicate.
    assert ArmSubsteps.of(raw) is not None and ObservableClock.of(raw) is not None
    robosuite_steps = _robosuite_step_records(env, lambda raw, action: raw.step(action)[0])
    split_steps = _robosuite_step_records(
        env, lambda raw, action: step_with_split_substeps(raw, action, lean=lean)
    )
    _assert_same_steps(split_steps, robosuite_steps)
    assert "forward" not in vars(env.scene(0).env.sim)  # robosuite's own forward again
    first, last = robosuite_steps[0][0], robosuite_steps[-1][0]
    assert not np.allclose(first["robot0_eef_pos"], last["robot0_eef_pos"], atol=1e-3)
    assert np.abs(robosuite_steps[-1][3][0]).max() > 0  # the force sensor read something
    assert robosuite_steps[-1][3][4][1] > robosuite_steps[0][3][4][1]  # the gripper closed


@pytest.mark.libero
@requires_libero
def test_lean_substeps_leave_setups_they_do_not_replicate_to_robosuite(env):
    env.reset([TASK], [INIT])
    raw = env.scene(0).env
    controller = raw.robots[0].controller
    controller.interpolator_pos = object()  # an interpolated goal: not replicated
    try:
        assert ArmSubsteps.of(raw) is None
    finally:
        controller.interpolator_pos = None
    observable = next(iter(raw._observables.values()))
    timer = observable._time_since_last_sample
    observable._time_since_last_sample = timer + raw.model_timestep  # a timer of its own
    try:
        assert ObservableClock.of(raw) is None
    finally:
        observable._time_since_last_sample = timer
    assert ArmSubsteps.of(raw) is not None and ObservableClock.of(raw) is not None


@pytest.mark.libero
@requires_libero
def test_geoms_out_of_view_are_left_out_and_the_frames_are_the_same(env):
    env.reset([TASK], [INIT])
    env.step(MOVES[:1])
    scene, renderer = env.scene(0), env._assets[TASK].renderer
    assert renderer.culls  # no reflections (the default), LIBERO's lights cast no shadows
    model, data = scene.model, scene.data
    groups = model.geom_group.copy()
    for camera in ("agentview", "robot0_eye_in_hand"):
        hidden = outside_view(model, data, model.camera(camera).id)
        assert 0 < hidden.size < (model.geom_group == 1).sum()
        culled = renderer.render(model, data, camera, SIZE)
        renderer.culls = False
        try:
            whole = renderer.render(model, data, camera, SIZE)
        finally:
            renderer.culls = True
        np.testing.assert_array_equal(culled, whole, camera)
        assert culled.std() > 10  # a drawn scene, not a flat colour
    np.testing.assert_array_equal(model.geom_group, groups)  # groups put back
    # A geom moved behind the camera is outside; one on its axis in front is inside.
    agentview = model.camera("agentview").id
    geom = int(np.flatnonzero((model.geom_group == 1) & (model.geom_rbound > 0))[0])
    axis = data.cam_xmat[agentview].reshape(3, 3)[:, 2]  # the camera looks along -axis
    saved = data.geom_xpos[geom].copy()
    try:
        for distance, expected in ((-1.0, False), (1.0 + model.geom_rbound[geom], True)):
            data.geom_xpos[geom] = data.cam_xpos[agentview] + distance * axis
            assert (geom in outside_view(model, data, agentview)) == expected
    finally:
        data.geom_xpos[geom] = saved


@pytest.mark.libero
@requires_libero
def test_scenes_of_a_task_share_a_renderer_and_are_kept_by_task(env):
    expected = env.reset([TASK], [INIT])
    expected_step = env.step(MOVES[:1]).obs
    several = SIMULATORS.get("libero")(OPTIONS, 3)
    try:
        obs = several.reset([1, TASK, TASK], [INIT, INIT, INIT])
        for row in (1, 2):  # the first scene of task 0 and one built from its snapshot
            for name in ("image", "wrist_image", "state"):
                np.testing.assert_array_equal(getattr(obs, name)[row], getattr(expected, name)[0])
        assert sorted(several._assets) == [0, 1]
        assert several.scene(1) is not several.scene(2)
        stepped = several.step(np.repeat(MOVES[:1], 3, axis=0)).obs
        for row in (1, 2):
            np.testing.assert_array_equal(stepped.image[row], expected_step.image[0])
            np.testing.assert_array_equal(stepped.state[row], expected_step.state[0])

        # max_cached_tasks=1: the task-0 scenes are reused, task 1's is closed (and its
        # renderer), one task-0 scene is built.
        kept = {id(several.scene(1)), id(several.scene(2))}
        again = several.reset([TASK, TASK, TASK], [INIT, INIT, INIT])
        assert len(kept & {id(several.scene(i)) for i in range(3)}) == 2
        assert sorted(several._assets) == [0]
        for row in range(3):
            np.testing.assert_array_equal(again.image[row], expected.image[0])
    finally:
        several.close()
    assert several._assets == {}


@pytest.mark.libero
@requires_libero
def test_each_task_is_drawn_with_its_own_gl_context(env):
    # libero_goal tasks share one scene; a libero_spatial one has other meshes and textures.
    options = {"suite": "libero_spatial", "image_size": SIZE, "cameras": ["agentview"]}
    spatial = SIMULATORS.get("libero")({**options, "render_size": 0, "max_steps": 4}, 1)
    try:
        alone = spatial.reset([0], [0]).image  # drawn by the only GL context
        env.reset([TASK], [INIT])  # the module env's renderer draws, so its context is current
        np.testing.assert_array_equal(spatial.reset([0], [0]).image, alone)
        scene, goal_renderer = spatial.scene(0), env._assets[TASK].renderer
        wrong = scene.draw_observed(goal_renderer, "agentview", SIZE)[::-1, ::-1]
        assert (wrong != alone[0]).mean() > 0.05  # what sharing one context across tasks gives
    finally:
        spatial.close()


@pytest.mark.libero
@requires_libero
def test_envs_stepped_in_one_thread_draw_and_close_in_another(env):
    # A DAG worker (a threaded Ray actor) steps its envs in one pool thread and closes them
    # from another while the first lives on; an EGL context left current in a live thread
    # cannot be made current in another (EGL_BAD_ACCESS).
    other = SIMULATORS.get("libero")({**OPTIONS, "max_steps": 4}, 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as stepper:
        stepper.submit(other.reset, [TASK], [INIT]).result()
        stepped = stepper.submit(other.step, MOVES[:1]).result().obs.image
        first = env.reset([TASK], [INIT]).image  # this thread draws with the module env
        np.testing.assert_array_equal(env.step(MOVES[:1]).obs.image, stepped)
        other.close()  # from this thread, while the stepping thread is alive
        assert other._assets == {}
    np.testing.assert_array_equal(env.reset([TASK], [INIT]).image, first)


@pytest.mark.libero
@requires_libero
def test_scene_models_carry_no_texture_pixels_and_merge_shared_images(env):
    # libero_goal task 0 has two textures of each of three image files (table, cabinet wood,
    # stove metal); the pixels are covered by the raw-env test, which draws robosuite's way.
    env.reset([TASK], [INIT])
    scene = env.scene(0)
    xml = scene.xml()
    unmerged = mujoco.MjModel.from_xml_string(xml)
    textured = scene.textured_model()
    light = mujoco.MjModel.from_xml_string(without_texture_pixels(xml))
    assert unmerged.ntex - textured.ntex == 3 == unmerged.ntex - scene.model.ntex
    assert scene.model.tex_data.nbytes < 2**10 < 50 * 2**20 < textured.tex_data.nbytes
    assert unmerged.nmat == textured.nmat == light.nmat
    for name in [n for n in dir(light) if isinstance(getattr(light, n, None), np.ndarray)]:
        if name.startswith(("tex_", "name", "_")):  # textures, the names buffer, sizes
            continue
        np.testing.assert_array_equal(getattr(light, name), getattr(textured, name), name)
        if not name.startswith("mat_texid"):  # merged textures renumber the materials' ids
            np.testing.assert_array_equal(getattr(light, name), getattr(unmerged, name), name)
    # Merged away: duplicates of one image; the materials point at the one kept.
    merged = with_shared_textures(xml)
    assert merged.count("<texture ") == xml.count("<texture ") - 3
