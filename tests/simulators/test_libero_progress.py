"""Privileged task progress of LIBERO episodes (:mod:`simulators.libero.progress`).

The terms are pure functions checked with numbers computed by hand; the rest runs the real
simulator (marked ``libero``) in one camera-less libero_goal env for the module: the
scripted planner's episodes rise to exactly 1.0 at their success (a pick-and-place onto an
object and a knob turned), and random actions stay low and never reach 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulators.base import distance_fraction
from simulators.libero.goals import GoalAtom, UnsupportedGoalError, goal_steps, parse_goal
from simulators.libero.privileged import RegionBox
from simulators.libero.progress import (
    ATOM_CAP,
    TASK_CAP,
    PrivilegedProgress,
    box_distance,
    env_progress,
    joint_fraction,
    on_object_distance,
    on_region_band,
    read_goal,
    staged_progress,
)
from tests.simulators.libero_common import requires_libero

# --- the terms, by hand -----------------------------------------------------------------------


def test_distance_fraction_is_the_share_of_the_start_distance_covered():
    assert distance_fraction(0.03, 0.12) == pytest.approx(0.75)  # 9 of 12 cm covered
    assert distance_fraction(0.12, 0.12) == 0.0
    assert distance_fraction(0.2, 0.1) == 0.0  # farther than at the start: 0, not -1
    assert distance_fraction(0.0, 0.1) == 1.0
    assert distance_fraction(0.0, 0.0) == 1.0  # there from the start
    assert distance_fraction(0.01, 0.0) == 0.0  # ... and moved away


def test_joint_fraction_is_the_share_of_the_way_to_the_goal_position():
    # a drawer's slide from closed (0 m) towards open (-0.15 m)
    assert joint_fraction(-0.05, 0.0, -0.15) == pytest.approx(1 / 3)
    assert joint_fraction(0.02, 0.0, -0.15) == 0.0  # pushed further in
    assert joint_fraction(-0.16, 0.0, -0.15) == 1.0  # past the goal
    # a stove's knob from -0.005 rad towards on (0.5 rad): 0.255 / 0.505
    assert joint_fraction(0.25, -0.005, 0.5) == pytest.approx(0.504950495)
    assert joint_fraction(0.3, 0.3, 0.3) == 1.0  # no way to go


def test_goal_distances_by_hand():
    low, high = np.zeros(3), np.full(3, 0.1)
    assert box_distance(np.array([0.05, 0.05, 0.05]), low, high) == 0.0  # inside
    assert box_distance(np.array([0.3, 0.05, 0.1]), low, high) == pytest.approx(0.2)
    assert box_distance(np.array([0.4, 0.5, 0.05]), low, high) == pytest.approx(0.5)  # 3-4-5
    # On a region: its footprint, from 5 mm below to 10 cm above its top face (z = 0.9)
    band = on_region_band(RegionBox(np.array([0.0, 0.0, 0.88]), np.array([0.2, 0.1, 0.9])))
    np.testing.assert_allclose(band[0], [0.0, 0.0, 0.895])
    np.testing.assert_allclose(band[1], [0.2, 0.1, 1.0])
    # On an object: 4 cm across is 1 cm beyond the 3 cm of LIBERO's test, 2 cm too low
    target = np.array([0.1, 0.0, 0.92])
    assert on_object_distance(np.array([0.1, 0.04, 0.90]), target) == pytest.approx(0.03)
    assert on_object_distance(np.array([0.11, 0.01, 0.95]), target) == 0.0


def test_staged_progress_by_hand():
    assert staged_progress(0.0, 0.0, 0.0) == 0.0
    assert staged_progress(0.5, 0.0, 0.0) == pytest.approx(0.1)  # halfway to the object
    assert staged_progress(1.0, 1.0, 0.0) == pytest.approx(0.4)  # grasped
    assert staged_progress(1.0, 1.0, 0.5) == pytest.approx(0.65)  # halfway to the goal
    # moved 40 % of the way (pushed, the hand away): the earlier stages count 40 % too
    assert staged_progress(0.0, 0.0, 0.4) == pytest.approx(0.36)
    assert staged_progress(1.0, 1.0, 1.0) == pytest.approx(ATOM_CAP)  # the predicate: 1
    assert ATOM_CAP < TASK_CAP < 1.0


def test_goals_without_a_measure_are_refused_naming_the_predicate(tmp_path):
    for atom in (GoalAtom("turnoff", ("flat_stove_1",)), GoalAtom("open", ("microwave_1",))):
        progress = PrivilegedProgress((GoalAtom("turnon", ("flat_stove_1",)), atom))
        with pytest.raises(UnsupportedGoalError, match=rf"\({atom.predicate} {atom.args[0]}\)"):
            progress.value()  # refused when asked: the env may still run the task
    bddl = tmp_path / "or.bddl"
    bddl.write_text("(define (problem p) (:goal (Or (On a_1 b_1) (On b_1 a_1))))")
    with pytest.raises(UnsupportedGoalError, match="'Or'"):
        PrivilegedProgress.of_file(str(bddl)).value()
    with pytest.raises(RuntimeError, match="start"):
        PrivilegedProgress((GoalAtom("turnon", ("flat_stove_1",)),)).value()
    # What the vector env reports for them (a rollout records it; the oracle refuses it): NaN,
    # and 0 for an env left out of the reset.
    assert math.isnan(env_progress(PrivilegedProgress.of_file(str(bddl))))
    assert env_progress(None) == 0.0


# --- with LIBERO ----------------------------------------------------------------------------

BOWL_ON_PLATE = "put_the_bowl_on_the_plate"  # (On akita_black_bowl_1 plate_1)
STOVE = "turn_on_the_stove"  # (Turnon flat_stove_1)


@pytest.fixture(scope="module")
def goal_env():
    """One camera-less libero_goal env (a scene build costs seconds: shared by the module)."""
    from simulators.libero import LiberoConfig, LiberoVectorEnv

    vec = LiberoVectorEnv(LiberoConfig(suite="libero_goal", cameras=(), render_size=0), 1)
    yield vec
    vec.close()


def _task(name: str):
    from simulators.libero.demos import suite_tasks

    (task,) = [t for t in suite_tasks("libero_goal") if t.name == name]
    return task


def _planner_episode(env, name: str) -> tuple[np.ndarray, bool]:
    """The scripted planner from init state 0; privileged progress after the reset and after
    each step ``(T + 1,)``, and whether it succeeded."""
    from simulators.libero.demos import _raw_env
    from simulators.libero.planner import ScriptedPlanner
    from simulators.libero.planner_config import PlannerConfig
    from simulators.libero.privileged import PrivilegedScene

    task = _task(name)
    env.reset([task.task_id], [0])
    planner = ScriptedPlanner(
        PrivilegedScene(_raw_env(env)), goal_steps(parse_goal(task.bddl_text)), PlannerConfig()
    )
    values = [env.privileged_progress()[0]]
    for _ in range(env.spec.max_steps):
        action = planner.act()
        assert planner.failure is None, planner.failure
        result = env.step(action[None])
        values.append(env.privileged_progress()[0])
        if result.done[0]:
            break
    return np.array(values), bool(result.success[0])


@pytest.mark.libero
@requires_libero
def test_random_actions_stay_low_and_an_env_left_out_has_zero(goal_env):
    task = _task(BOWL_ON_PLATE)
    assert read_goal(task.bddl_path) == (GoalAtom("on", ("akita_black_bowl_1", "plate_1")),)
    goal_env.reset([task.task_id], [0])
    low, high = goal_env.spec.action_bounds()
    rng = np.random.default_rng(0)
    values = [goal_env.privileged_progress()[0]]
    for _ in range(40):
        result = goal_env.step(rng.uniform(low, high, (1, 7)).astype(np.float32))
        values.append(goal_env.privileged_progress()[0])
    values = np.array(values)
    assert not result.success[0]
    assert values[0] == 0.0  # nothing reached nor moved yet
    assert values.max() < 0.5 and np.all(values < 1.0), values
    goal_env.reset([task.task_id], [0], active=np.array([False]))  # no scene: nothing built
    np.testing.assert_array_equal(goal_env.privileged_progress(), [0.0])


@pytest.mark.libero
@requires_libero
@pytest.mark.parametrize("name", [BOWL_ON_PLATE, STOVE])
def test_planner_episodes_rise_to_exactly_one_at_success(goal_env, name):
    values, success = _planner_episode(goal_env, name)
    assert success
    half = len(values) // 2
    assert values[0] < 0.3, values
    assert values[-1] == 1.0 and np.all(values[:-1] < 1.0), values  # 1 exactly at success
    assert values[:half].max() < values[-1]
    assert values[half:].mean() > values[:half].mean()  # rises overall
    goal_env.step(np.zeros((1, 7), np.float32))  # done: ignored, the value kept
    assert goal_env.privileged_progress()[0] == 1.0
