"""The scripted LIBERO planner: goal parsing, grasp geometry, success, and the demo files.

Goal parsing and grasp / handle / knob geometry run without LIBERO (hand-made BDDL text and
point sets with hand-computed answers). The rest needs LIBERO (marked ``libero``): the
planner's conventions against the real robot, planner episodes without cameras (a flat box
into the basket of libero_object, a bowl onto the plate of libero_spatial, and one per
libero_goal skill: a drawer opened, a plate pushed, a stove turned on), one demo written at 32 px by
``embodied-rl demos`` and replayed open-loop in a fresh ``libero`` env from the same init
state (it must succeed on its last action: the file is a real demo in the env's
convention), and the command's refusals of bad input.
"""

from __future__ import annotations

import importlib.util
import json
import re

import h5py
import numpy as np
import pytest

from embodied_rl.cli import main
from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demos import content_digest, scan_demo_file
from embodied_rl.runtime.config import ConfigError
from embodied_rl.video import read_video
from simulators.libero.demos import EpisodeResult, TaskInfo, run_episode, suite_tasks
from simulators.libero.demos_cli import TaskReport, finished_reports, summarise, write_report
from simulators.libero.goals import (
    ClearOf,
    CloseDoor,
    CloseDrawer,
    GoalAtom,
    OpenDrawer,
    PickPlace,
    Push,
    PutInside,
    TurnOn,
    UnsupportedGoalError,
    goal_steps,
    object_kind,
    parse_goal,
    read_sexp,
)
from simulators.libero.grasp import (
    GraspLimits,
    convex_hull,
    down_rotation,
    finger_width,
    path_obstacle_top,
    plan_grasp,
    polygons_overlap,
    yaw_of,
)
from simulators.libero.planner import ScriptedPlanner
from simulators.libero.planner_config import PlannerConfig
from simulators.libero.planner_state import rotation_error
from simulators.libero.skills import (
    clear_move,
    door_push_point,
    handle_bar,
    handle_grip,
    knob_grip_points,
    long_axis,
    ray_hit,
    shift_clear,
    slot_offset,
    tilt_towards,
    turn_xy,
    widest_gap,
)

HAVE_LIBERO = importlib.util.find_spec("libero") is not None
requires_libero = pytest.mark.skipif(not HAVE_LIBERO, reason="LIBERO is not installed")

# --- goals ----------------------------------------------------------------------------------

OBJECT_GOAL = """
(define (problem LIBERO_Floor_Manipulation)
  (:domain robosuite)
  (:language Pick the alphabet soup and place it in the basket)  ; comment (ignored)
  (:objects alphabet_soup_1 - alphabet_soup basket_1 - basket)
  (:goal
    (And (In alphabet_soup_1 basket_1_contain_region))
  )
)
"""


def test_goal_of_a_libero_object_task():
    assert parse_goal(OBJECT_GOAL) == (
        GoalAtom("in", ("alphabet_soup_1", "basket_1_contain_region")),
    )
    assert goal_steps(parse_goal(OBJECT_GOAL)) == (
        PickPlace("alphabet_soup_1", "in", "basket_1_contain_region"),
    )


def test_goal_conjunctions_keep_their_order_and_unsupported_predicates_are_named():
    two = "(define (problem p) (:goal (and (On a_1 plate_1) (IN b_1 basket_1_contain_region))))"
    assert goal_steps(parse_goal(two)) == (
        PickPlace("a_1", "on", "plate_1"),
        PickPlace("b_1", "in", "basket_1_contain_region"),
    )
    door = "(define (problem p) (:goal (And (Open microwave_1))))"
    assert parse_goal(door) == (GoalAtom("open", ("microwave_1",)),)
    with pytest.raises(UnsupportedGoalError, match=r"\(open microwave_1\)"):
        goal_steps(parse_goal(door))
    with pytest.raises(UnsupportedGoalError, match="'Or' is not supported"):
        parse_goal("(define (:goal (Or (On a b) (On b a))))")
    with pytest.raises(ValueError, match="no '\\(:goal"):
        parse_goal("(define (problem p) (:init (On a b)))")
    with pytest.raises(ValueError, match="1 unclosed"):
        read_sexp("(a (b c)")
    with pytest.raises(ValueError, match="without a matching"):
        read_sexp("(a))")


def _goal(*atoms: str) -> tuple:
    return goal_steps(parse_goal(f"(define (problem p) (:goal (And {' '.join(atoms)})))"))


def test_goal_steps_of_drawers_plates_and_knobs():
    top, middle = "wooden_cabinet_1_top_region", "white_cabinet_1_middle_region"
    assert _goal(f"(Open {middle})") == (OpenDrawer(middle),)
    # an In a drawer clears the object of the drawer and opens it first, once; an explicit
    # Open before it is not repeated
    assert _goal(f"(In bowl_1 {top})", f"(In cup_1 {top})") == (
        ClearOf("bowl_1", top),
        OpenDrawer(top),
        PickPlace("bowl_1", "in", top),
        PickPlace("cup_1", "in", top),
    )
    assert _goal(f"(Open {top})", f"(In bowl_1 {top})") == (
        OpenDrawer(top),
        PickPlace("bowl_1", "in", top),
    )
    assert _goal("(In bowl_1 basket_1_contain_region)") == (
        PickPlace("bowl_1", "in", "basket_1_contain_region"),
    )
    # a plate going to a table region is pushed; onto a plate or a plate onto a fixture's
    # region is pick-and-place
    assert _goal("(On plate_1 main_table_stove_front_region)") == (
        Push("plate_1", "main_table_stove_front_region"),
    )
    assert _goal("(On bowl_1 plate_1)") == (PickPlace("bowl_1", "on", "plate_1"),)
    assert _goal("(On plate_2 flat_stove_1_cook_region)") == (
        PickPlace("plate_2", "on", "flat_stove_1_cook_region"),
    )
    assert _goal("(Turnon flat_stove_1)") == (TurnOn("flat_stove_1"),)
    # two objects on one region get a slot each (k of 2); on an object or in a region, none
    stove = "flat_stove_1_cook_region"
    assert _goal(f"(On pot_1 {stove})", "(On cup_1 plate_1)", f"(On pot_2 {stove})") == (
        PickPlace("pot_1", "on", stove, slot=(0, 2)),
        PickPlace("cup_1", "on", "plate_1"),
        PickPlace("pot_2", "on", stove, slot=(1, 2)),
    )
    basket = "basket_1_contain_region"
    assert [s.slot for s in _goal(f"(In a_1 {basket})", f"(In b_1 {basket})")] == [(0, 1)] * 2
    assert object_kind("plate_12") == "plate" and object_kind("plate") == "plate"
    # a Close goes after the steps that use its drawer, whatever the goal's order; the
    # drawer is opened first (skipped at run time when it starts open)
    bottom = "white_cabinet_1_bottom_region"
    assert _goal(f"(Close {bottom})", f"(In bowl_1 {bottom})", "(Turnon s_1)") == (
        ClearOf("bowl_1", bottom),
        OpenDrawer(bottom),
        PickPlace("bowl_1", "in", bottom),
        CloseDrawer(bottom),
        TurnOn("s_1"),
    )
    assert _goal(f"(Close {top})", "(Turnon s_1)") == (CloseDrawer(top), TurnOn("s_1"))
    # a mug into a microwave goes in through its door; the door's Close comes after it
    heating = "microwave_1_heating_region"
    assert _goal("(Close microwave_1)", f"(In mug_1 {heating})") == (
        PutInside("mug_1", heating),
        CloseDoor("microwave_1"),
    )
    assert _goal("(Close microwave_1)", "(Turnon s_1)") == (CloseDoor("microwave_1"), TurnOn("s_1"))
    handled = r"handles \(In obj region\), \(On obj target\), \(Open <cabinet>_<top\|middle"
    for goal in ("(Close oven_1)", "(Open microwave_1)", "(Turnoff s_1)"):
        with pytest.raises(UnsupportedGoalError, match=handled):
            _goal(goal)
    with pytest.raises(UnsupportedGoalError, match=r"goal \(open microwave_1\) is not supported"):
        _goal("(Open microwave_1)")


@pytest.mark.libero
@requires_libero
def test_goals_of_the_installed_task_files():
    """Real BDDL files of four suites: libero_object and libero_spatial are one step each."""
    for task in suite_tasks("libero_object"):
        (step,) = goal_steps(parse_goal(task.bddl_text))
        assert (step.relation, step.target) == ("in", "basket_1_contain_region")
        assert step.obj[: -len("_1")].replace("_", " ") in task.instruction  # "bbq sauce"
    spatial = [goal_steps(parse_goal(t.bddl_text)) for t in suite_tasks("libero_spatial")]
    assert spatial == [(PickPlace("akita_black_bowl_1", "on", "plate_1"),)] * 10
    ten = suite_tasks("libero_10")
    baskets = [t for t in ten if "both" in t.instruction and "basket" in t.instruction]
    assert len(baskets) == 3  # e.g. "put both the alphabet soup and the tomato sauce in ..."
    for task in baskets:
        steps = goal_steps(parse_goal(task.bddl_text))
        assert [s.target for s in steps] == ["basket_1_contain_region"] * 2
    goal = {t.name: goal_steps(parse_goal(t.bddl_text)) for t in suite_tasks("libero_goal")}
    top, bowl = "wooden_cabinet_1_top_region", "akita_black_bowl_1"
    assert goal["open_the_middle_drawer_of_the_cabinet"] == (
        OpenDrawer("wooden_cabinet_1_middle_region"),
    )
    assert goal["open_the_top_drawer_and_put_the_bowl_inside"] == (
        ClearOf(bowl, top),
        OpenDrawer(top),
        PickPlace(bowl, "in", top),
    )
    assert goal["push_the_plate_to_the_front_of_the_stove"] == (
        Push("plate_1", "main_table_stove_front_region"),
    )
    assert goal["turn_on_the_stove"] == (TurnOn("flat_stove_1"),)
    assert goal["put_the_bowl_on_the_plate"] == (PickPlace(bowl, "on", "plate_1"),)
    assert sum(isinstance(steps[0], PickPlace) for steps in goal.values()) == 6


# --- geometry -------------------------------------------------------------------------------


def _box(centre, size, yaw=0.0):
    """Corner points ``(8, 3)`` of a box with ``size`` (x, y, z) standing on z=0."""
    c, s = np.cos(yaw), np.sin(yaw)
    half = np.asarray(size) / 2
    pts = []
    for x in (-half[0], half[0]):
        for y in (-half[1], half[1]):
            for z in (0.0, size[2]):
                pts.append([centre[0] + c * x - s * y, centre[1] + s * x + c * y, z])
    return np.array(pts)


def test_hull_and_overlap():
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5], [0.2, 0.7]], float)
    hull = convex_hull(square)
    assert len(hull) == 4 and {tuple(p) for p in hull} == {(0, 0), (1, 0), (1, 1), (0, 1)}
    area = 0.5 * sum(a[0] * b[1] - b[0] * a[1] for a, b in zip(hull, np.roll(hull, -1, axis=0)))
    assert area == pytest.approx(1.0)  # positive: counter-clockwise
    other = hull + [1.5, 0.0]
    assert not polygons_overlap(hull, other)
    assert not polygons_overlap(hull, other, margin=0.4)
    assert polygons_overlap(hull, other, margin=0.6)
    diamond = np.array([[1.2, 0.5], [1.6, 0.1], [2.0, 0.5], [1.6, 0.9]])
    assert not polygons_overlap(hull, diamond) and polygons_overlap(hull, diamond - [0.3, 0])


def test_clear_move_is_the_shortest_free_move_not_away_from_the_robot():
    bowl = _box((0.0, 0.0), (0.1, 0.1, 0.05))[:, :2]
    sweep = _box((0.2, -0.02), (0.2, 0.2, 0.1))[:, :2]  # x 0.1..0.3: 5 cm from the bowl
    base = np.array([-1.0, 0.0])
    assert np.array_equal(clear_move(bowl, [(sweep, 0.04)], base), [0.0, 0.0])
    # a 7 cm margin needs 2 cm more room: straight back towards the robot
    assert np.allclose(clear_move(bowl, [(sweep, 0.07)], base), [-0.02, 0.0])
    # with a box behind the bowl too, the move goes sideways (y) instead
    behind = _box((-0.11, 0.0), (0.1, 0.1, 0.05))[:, :2]
    move = clear_move(bowl, [(sweep, 0.07), (behind, 0.0)], base)
    assert move[0] == pytest.approx(-0.02) and abs(move[1]) == pytest.approx(0.1)
    # nothing within reach that keeps to the robot's side
    assert clear_move(bowl, [(sweep, 0.07), (behind, 0.0)], base, reach=0.05) is None


def test_shift_clear_is_the_least_shift_out_from_under_an_overhang():
    bowl = _box((0.0, 0.165), (0.108, 0.108, 0.05))[:, :2]  # y 0.111 .. 0.219
    handle = _box((0.0, 0.205), (0.09, 0.016, 0.02))[:, :2]  # y 0.197 .. 0.213, above
    out = np.array([0.0, -1.0])
    # 0.219 - 0.197 = 2.2 cm of overlap: the first 2.5 mm step past it is 2.25 cm
    assert np.allclose(shift_clear(bowl, [handle], out, reach=0.05, margin=0.0), [0, -0.0225])
    # 1 cm of margin: 3.25 cm
    assert np.allclose(shift_clear(bowl, [handle], out, reach=0.05, margin=0.01), [0, -0.0325])
    assert shift_clear(bowl, [handle], out, reach=0.02, margin=0.0) is None
    assert np.array_equal(shift_clear(bowl, [], out, reach=0.0, margin=0.0), [0.0, 0.0])


def test_ray_hit_is_the_distance_to_the_first_box_entered():
    wall = _box((0.2, 0.0), (0.02, 0.4, 0.3))  # x 0.19 .. 0.21, z 0 .. 0.3
    roof = _box((0.0, 0.0), (0.4, 0.4, 0.02)) + [0.0, 0.0, 0.25]  # z 0.25 .. 0.27
    assert np.isclose(ray_hit([0, 0, 0.1], [1, 0, 0], [wall, roof], 1.0), 0.19)
    assert np.isclose(ray_hit([0, 0, 0.1], [0, 0, 1], [wall, roof], 1.0), 0.15)
    assert ray_hit([0, 0, 0.1], [-1, 0, 0], [wall, roof], 1.0) is None  # nothing behind
    assert ray_hit([0, 0, 0.1], [1, 0, 0], [wall], 0.1) is None  # out of reach
    assert ray_hit([0.2, 0, 0.1], [1, 0, 0], [wall], 1.0) == 0.0  # starts inside


def test_handle_bar_is_the_piece_furthest_from_the_cup():
    ring = [_box((0.04 * np.cos(a), 0.04 * np.sin(a)), (0.02, 0.02, 0.09)) for a in range(6)]
    bar = _box((0.0, -0.083), (0.018, 0.008, 0.058)) + [0.0, 0.0, 0.027]
    assert handle_bar([*ring, bar]) is bar
    panel = _box((0.0, 0.0), (0.026, 0.259, 0.18), yaw=0.3)[:, :2]
    assert np.isclose(abs(long_axis(panel) @ [-np.sin(0.3), np.cos(0.3)]), 1.0)
    assert np.allclose(turn_xy(np.array([1.0, 0.0]), np.pi / 2), [0.0, 1.0])


def test_widest_gap_centres_the_hand_between_door_and_panel():
    # libero_10's microwave, open door at x -0.209 .. -0.183, control panel from x 0.078;
    # the hand spans -0.100 .. 0.104 about the grip: centred in the gap at -0.0545
    hand = (-0.100, 0.104)
    assert np.isclose(widest_gap((-0.1, 0.0), hand, [(-0.209, -0.183), (0.078, 0.163)]), -0.055)
    assert np.isclose(widest_gap((-0.03, 0.0), hand, [(-0.209, -0.183), (0.078, 0.163)]), -0.03)
    assert widest_gap((-0.1, 0.0), hand, []) == -0.05  # nothing in the way: the middle
    assert widest_gap((0.0, -0.1), hand, [(-0.2, -0.1)]) == 0.0  # nothing feasible


def test_door_push_point_is_behind_the_door_on_its_arc():
    # a door hinged at the origin pointing -y, shutting counter-clockwise (its points move
    # +x): the fingers stand on its -x side, 12 cm out along it
    assert np.allclose(door_push_point([0, 0], [0, -1], 1.0, 0.12, 0.045), [-0.045, -0.12])
    assert np.allclose(door_push_point([0, 0], [0, -1], -1.0, 0.12, 0.045), [0.045, -0.12])
    # half shut (pointing at -45 degrees): still 4.5 cm off its line, on the trailing side
    along = turn_xy(np.array([0.0, -1.0]), np.pi / 4)
    point = door_push_point([0, 0], along, 1.0, 0.12, 0.045)
    assert np.isclose(point @ along, 0.12) and np.isclose(point @ [-along[1], along[0]], -0.045)


@pytest.mark.libero
@requires_libero
def test_the_bowl_is_moved_clear_of_the_top_drawer_before_it_opens(goal_env):
    """libero_goal's open top drawer overhangs the bowl in front of the cabinet: the planner
    first moves the bowl to a spot clear of the drawer's sweep (no episode is run)."""
    from simulators.libero.demos import _raw_env
    from simulators.libero.privileged import PrivilegedScene

    (task,) = [t for t in suite_tasks("libero_goal") if "top_drawer" in t.name]
    goal_env.reset([task.task_id], [1])
    scene = PrivilegedScene(_raw_env(goal_env))
    bowl, top = "akita_black_bowl_1", "wooden_cabinet_1_top_region"
    planner = ScriptedPlanner(scene, goal_steps(parse_goal(task.bddl_text)), PlannerConfig())
    assert planner.phase == "approach" and planner._step == ClearOf(bowl, top)
    goal_xy, height = planner._s.clear_goal
    moved = scene.object_points(bowl)[:, :2] + (goal_xy - scene.object_position(bowl)[:2])
    drawer = np.concatenate(scene.body_parts(scene.region_joint(top).body))[:, :2]
    opened = (
        drawer
        + (scene.open_close_qpos(top)[0] - scene.region_joint(top).qpos)
        * (scene.region_joint(top).axis[:2])
    )
    assert polygons_overlap(convex_hull(scene.object_points(bowl)[:, :2]), convex_hull(opened))
    assert not polygons_overlap(convex_hull(moved), convex_hull(opened), margin=0.039)
    assert height == pytest.approx(float(scene.object_points(bowl)[:, 2].min()))
    # an object clear of the drawer already (the cream cheese, 6 cm beyond its sweep) is not
    # moved: the planner starts with the drawer
    steps = (ClearOf("cream_cheese_1", top), OpenDrawer(top))
    planner = ScriptedPlanner(scene, steps, PlannerConfig())
    assert planner._step == OpenDrawer(top) and planner.phase == "handle_above"


def test_slot_offsets_spread_along_the_longer_side():
    low, high = np.array([0.0, 0.0, 0.9]), np.array([0.15, 0.1, 0.91])
    assert np.array_equal(slot_offset(low, high, (0, 1)), [0.0, 0.0])
    # 2 slots along x (15 cm), 1 cm inside its ends: centres at +-6.5 cm
    assert np.allclose(slot_offset(low, high, (0, 2)), [-0.065, 0.0])
    assert np.allclose(slot_offset(low, high, (1, 2)), [0.065, 0.0])
    assert np.allclose(slot_offset(low, high, (1, 3)), [0.0, 0.0])


def test_rotation_conventions():
    rot = down_rotation(0.7)
    assert yaw_of(rot) == pytest.approx(0.7)
    np.testing.assert_allclose(rot[:, 2], [0, 0, -1], atol=1e-12)  # pointing down
    # the OSC delta that turns yaw 0.2 into yaw 0.7 is +0.5 rad about world z
    np.testing.assert_allclose(
        rotation_error(down_rotation(0.7), down_rotation(0.2)), [0, 0, 0.5], atol=1e-9
    )
    # shortest way round: -170 deg -> +170 deg is a 20 deg turn the negative way
    error = rotation_error(down_rotation(np.deg2rad(170)), down_rotation(np.deg2rad(-170)))
    np.testing.assert_allclose(error, [0, 0, np.deg2rad(-20)], atol=1e-9)


def test_grasp_goes_across_the_short_side_and_around_a_neighbour():
    """An 8 x 4 x 2 cm box along x: fingers (heading = yaw) along y, i.e. yaw +-90 deg."""
    box = _box((0.0, 0.0), (0.08, 0.04, 0.02))
    width, centre = finger_width(box[:, :2], 0.0)
    assert width == pytest.approx(0.08) and np.allclose(centre, 0)
    gripper = [  # the Panda hand and finger boxes in the grip-site frame (site z points down)
        (np.array([-0.1, -0.032, -0.123]), np.array([0.104, 0.032, -0.031])),
        (np.array([-0.065, -0.01, -0.044]), np.array([-0.039, 0.01, 0.009])),
        (np.array([0.039, -0.01, -0.044]), np.array([0.065, 0.01, 0.009])),
    ]
    limits = GraspLimits()
    grasp = plan_grasp(box, [], gripper, current_yaw=0.3, limits=limits)
    # yaws are tried every 5 deg from the current one (0.3 rad = 17.2 deg): the narrowest
    # are 87.2 and 92.2 deg (widths within the 4 mm tie), and 87.2 turns less
    assert grasp.clear and grasp.yaw == pytest.approx(0.3 + np.deg2rad(70))
    # eef height: floor_clearance above the bottom (the box is lower than grasp_depth)
    np.testing.assert_allclose(grasp.position, [0, 0, limits.floor_clearance], atol=1e-9)
    # a 7.6 cm can beside the box's end sits under the hand at yaw -90 deg: the planner turns
    # the hand 20 deg away from it, still across the box (6.5 cm wide there)
    can = _box((0.05, 0.10), (0.06, 0.06, 0.076))
    assert plan_grasp(box, [], gripper, 0.0, limits).yaw == pytest.approx(-np.pi / 2)
    avoided = plan_grasp(box, [can], gripper, current_yaw=0.0, limits=limits)
    assert avoided.clear and avoided.yaw == pytest.approx(np.deg2rad(-70))
    assert finger_width(box[:, :2], avoided.yaw)[0] == pytest.approx(
        0.08 * np.cos(np.deg2rad(70)) + 0.04 * np.sin(np.deg2rad(70))
    )
    # too close to turn away from: no clear grasp, the preferred one is returned as such
    blocked = plan_grasp(box, [_box((0.03, 0.10), (0.06, 0.06, 0.076))], gripper, 0.0, limits)
    assert not blocked.clear and blocked.yaw == pytest.approx(-np.pi / 2)
    # the path from far away over the can sees its top; a path beside it does not
    assert path_obstacle_top(np.array([0, 0.3]), np.array([0, -0.3]), [can], 0.05) == 0.076
    assert path_obstacle_top(np.array([0.3, 0]), np.array([0.3, 0.3]), [can], 0.05) == -np.inf


def _bowl(centre=(0.0, 0.0)):
    """A 10.6 cm bowl: a rim wall from radius 4.9 to 5.3 cm at 5 cm high, a 3 cm foot."""
    angles = np.deg2rad(np.arange(0, 360, 5))
    ring = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    points = [
        np.c_[ring * r + centre, np.full(len(ring), z)]
        for r, z in ((0.049, 0.05), (0.053, 0.05), (0.03, 0.0))
    ]
    return np.concatenate(points)


def test_a_bowl_is_taken_by_its_rim_from_the_near_free_side():
    gripper = [(np.array([-0.1, -0.032, -0.123]), np.array([0.104, 0.032, -0.031]))]  # hand
    limits = GraspLimits()
    bowl = _bowl()
    # yaw 0 points the fingers along x: the +x and -x sides need no turn; the nearer wins,
    # at the middle of the wall (5.1 cm), rim_depth below the top, fingers radial
    east = plan_grasp(bowl, [], gripper, 0.0, limits, eef_xy=np.array([0.3, 0.1]))
    np.testing.assert_allclose(east.position, [0.051, 0, 0.05 - limits.rim_depth], atol=1e-9)
    assert east.yaw == pytest.approx(0.0) and east.clear
    west = plan_grasp(bowl, [], gripper, 0.0, limits, eef_xy=np.array([-0.3, 0.1]))
    np.testing.assert_allclose(west.position, [-0.051, 0, 0.04], atol=1e-9)
    assert west.yaw == pytest.approx(0.0)  # pi is the same hand pose; no half turn
    # a tall box just beyond the east side: the hand (10 cm along the fingers) would hit it
    blocker = _box((0.17, 0.0), (0.06, 0.06, 0.1))
    detour = plan_grasp(bowl, [blocker], gripper, 0.0, limits, eef_xy=np.array([0.3, 0.1]))
    np.testing.assert_allclose(detour.position, [-0.051, 0, 0.04], atol=1e-9)


def test_a_handle_is_gripped_from_the_front_as_deep_as_the_fingers_fit():
    """A 9 x 1.5 x 1.7 cm bar whose front faces +y, 1.6 cm in front of a drawer at y=0.084."""
    bar = np.array([[x, y, z] for x in (-0.045, 0.045) for y in (0.1, 0.115) for z in (1.0, 1.017)])
    outward = np.array([0.0, 1.0, 0.0])
    position, rotation = handle_grip(bar, outward, down_rotation(0.0), 0.012, pitch=0.0)
    # level hand: the pads (1.16 cm behind the site) reach the bar's front face
    np.testing.assert_allclose(position, [0.0, 0.115 - 0.0116, 1.0085], atol=1e-9)
    np.testing.assert_allclose(rotation[:, 2], -outward, atol=1e-12)  # pointing at the drawer
    np.testing.assert_allclose(rotation[:, 0], [0, 0, 1], atol=1e-12)  # closing vertically
    assert np.linalg.det(rotation) == pytest.approx(1.0)
    # tilted 0.2 rad: the upper finger's outer edge (5.3 cm along the closing axis) swings
    # towards the drawer, so the site stays out until the deepest point is 1.2 cm past the back
    position, rotation = handle_grip(bar, outward, down_rotation(0.0), 0.012, pitch=0.2)
    reach = 0.0092 * np.cos(0.2) + 0.053 * np.sin(0.2)
    assert position[1] == pytest.approx(0.1 - 0.012 + reach) and position[1] - reach > 0.084
    np.testing.assert_allclose(rotation[:, 2], [0, -np.cos(0.2), -np.sin(0.2)], atol=1e-12)
    np.testing.assert_allclose(rotation.T @ rotation, np.eye(3), atol=1e-12)


def test_knob_ridge_and_tilted_hand():
    tabs = [_box((0.04, 0.0), (0.01, 0.03, 0.013)), _box((-0.04, 0.0), (0.01, 0.03, 0.013))]
    ridge = _box((0.0, 0.0), (0.09, 0.025, 0.05))
    np.testing.assert_array_equal(knob_grip_points([*tabs, ridge]), ridge)
    # fingers closing along y; the base lies towards -x: the tips swing to -x, the hand to +x
    tilted = tilt_towards(down_rotation(np.pi / 2), np.array([-1.0, 0.0]), 0.5)
    np.testing.assert_allclose(tilted[:, 2], [-np.sin(0.5), 0, -np.cos(0.5)], atol=1e-12)
    np.testing.assert_allclose(tilted[:, 0], down_rotation(np.pi / 2)[:, 0], atol=1e-12)


# --- with LIBERO ----------------------------------------------------------------------------


def _one_env(suite: str):
    """One camera-less env of ``suite`` for a module's tests, closed after them."""
    from simulators.libero import LiberoConfig, LiberoVectorEnv

    vec = LiberoVectorEnv(LiberoConfig(suite=suite, cameras=(), render_size=0), 1)
    yield vec
    vec.close()


@pytest.fixture(scope="module")
def env():
    yield from _one_env("libero_object")


@pytest.mark.libero
@requires_libero
def test_scene_matches_the_robot_and_the_observation(env):
    """The fingers close along the grip site's x axis (the planner's yaw convention), and
    the scene's reads agree with the simulator's proprio."""
    import mujoco

    from simulators.libero.demos import _raw_env
    from simulators.libero.privileged import PrivilegedScene

    obs = env.reset([1], [1])
    scene = PrivilegedScene(_raw_env(env))
    position, rotation = scene.eef_pose()
    np.testing.assert_allclose(position, obs.state[0, :3], atol=1e-6)
    pads = [
        scene.data.geom_xpos[mujoco.mj_name2id(scene.model, mujoco.mjtObj.mjOBJ_GEOM, name)]
        for name in ("gripper0_finger1_pad_collision", "gripper0_finger2_pad_collision")
    ]
    across = (pads[1] - pads[0]) / np.linalg.norm(pads[1] - pads[0])
    assert abs(across @ rotation[:, 0]) > 0.999
    # robosuite samples the finger observation during the step's last substep: 1e-5 apart
    assert scene.finger_opening() == pytest.approx(np.sum(np.abs(obs.state[0, 6:8])), abs=1e-4)
    robot = scene.robot_state_vector()
    np.testing.assert_allclose(robot[:2], obs.state[0, 6:8], atol=1e-4)
    np.testing.assert_allclose(robot[2:5], obs.state[0, :3], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(robot[5:]), 1.0, atol=1e-9)
    assert scene.action_scale()[0] == pytest.approx([0.05] * 3)
    cheese = scene.object_points("cream_cheese_1")  # lies on the floor, 1.8 cm high
    assert cheese[:, 2].min() == pytest.approx(0.0, abs=2e-3)
    assert cheese[:, 2].max() == pytest.approx(0.018, abs=2e-3)
    # the basket's contain region: half sizes (0.06108, 0.06108, 0.06949) in the asset,
    # the bottom lowered by 1 cm like LIBERO's in_box (the basket tilts slightly: 1 mm)
    box = scene.region_box("basket_1_contain_region")
    np.testing.assert_allclose(box.high - box.low, [0.12216, 0.12216, 0.14898], atol=1e-3)
    assert not scene.success() and not scene.is_grasping("cream_cheese_1")


@pytest.mark.libero
@requires_libero
@pytest.mark.parametrize("init", [1, 7])
def test_planner_puts_the_cream_cheese_in_the_basket(env, init):
    """A flat box: the grasp must go across its short side and keep the hand off the cans."""
    task = suite_tasks("libero_object")[1]
    assert task.name == "pick_up_the_cream_cheese_and_place_it_in_the_basket"
    steps = goal_steps(parse_goal(task.bddl_text))
    result = run_episode(env, task, init, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 40 < result.steps < 200
    assert result.episode is None  # no cameras: nothing recorded


@pytest.mark.libero
@requires_libero
def test_planner_puts_a_bowl_on_the_plate():
    """libero_spatial: a bowl wider than the gripper (rim grasp), placed On an object and
    released: the success test needs contact, so the episode ends after the release."""
    from simulators.libero import LiberoConfig, LiberoVectorEnv

    task = suite_tasks("libero_spatial")[0]
    steps = goal_steps(parse_goal(task.bddl_text))
    vec = LiberoVectorEnv(LiberoConfig(suite="libero_spatial", cameras=(), render_size=0), 1)
    try:
        result = run_episode(vec, task, 0, steps, PlannerConfig())
    finally:
        vec.close()
    assert result.success, result.failure
    assert 40 < result.steps < 150


@pytest.fixture(scope="module")
def goal_env():
    yield from _one_env("libero_goal")


@pytest.mark.libero
@requires_libero
@pytest.mark.parametrize(
    "name, skill, max_steps",
    [
        ("open_the_middle_drawer_of_the_cabinet", OpenDrawer, 120),  # handle grip and pull
        ("push_the_plate_to_the_front_of_the_stove", Push, 110),  # fingers in the dish
        ("turn_on_the_stove", TurnOn, 80),  # tilted grasp of the knob's ridge and a twist
    ],
)
def test_planner_skills_of_libero_goal(goal_env, name, skill, max_steps):
    """One episode per articulated / pushing skill from init state 0, ending in LIBERO's
    own success test (``run_episode`` stops on it)."""
    (task,) = [t for t in suite_tasks("libero_goal") if t.name == name]
    steps = goal_steps(parse_goal(task.bddl_text))
    assert [type(step) for step in steps] == [skill]
    result = run_episode(goal_env, task, 0, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 30 < result.steps < max_steps


@pytest.fixture(scope="module")
def ten_env():
    yield from _one_env("libero_10")


@pytest.mark.libero
@requires_libero
def test_planner_does_a_two_step_libero_10_task(ten_env):
    """libero_10 task 0: two cans into a basket whose floor stands 5 cm above the bottom of
    its region box (the lowering stops on the floor, not at the box)."""
    task = suite_tasks("libero_10")[0]
    steps = goal_steps(parse_goal(task.bddl_text))
    assert [(s.obj, s.target) for s in steps] == [
        ("alphabet_soup_1", "basket_1_contain_region"),
        ("tomato_sauce_1", "basket_1_contain_region"),
    ]
    result = run_episode(ten_env, task, 0, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 100 < result.steps < 260  # the suite allows 520


@pytest.mark.libero
@requires_libero
def test_planner_puts_the_bowl_in_the_bottom_drawer_and_closes_it(ten_env):
    """libero_10 task 3: the goal lists the Close first; the drawer starts open (its Open is
    skipped), the bowl goes down in front of the handles of the drawers above (a 10.8 cm
    bowl in a 10.8 cm mouth), and the tilted, closed fingers push the drawer shut beside
    its handle."""
    task = suite_tasks("libero_10")[3]
    steps = goal_steps(parse_goal(task.bddl_text))
    drawer = "white_cabinet_1_bottom_region"
    assert steps[2:] == (PickPlace("akita_black_bowl_1", "in", drawer), CloseDrawer(drawer))
    result = run_episode(ten_env, task, 1, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 120 < result.steps < 260  # the suite allows 520


@pytest.mark.libero
@requires_libero
def test_planner_puts_the_mug_in_the_microwave_and_shuts_its_door(ten_env):
    """libero_10 task 9: the microwave is roofed 4 cm above a standing mug, so the mug goes in
    held by its handle, the hand tilted and outside the opening; then closed fingers swing
    the door shut along its arc."""
    task = suite_tasks("libero_10")[9]
    steps = goal_steps(parse_goal(task.bddl_text))
    heating = "microwave_1_heating_region"
    assert steps == (PutInside("white_yellow_mug_1", heating), CloseDoor("microwave_1"))
    result = run_episode(ten_env, task, 0, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 150 < result.steps < 300  # the suite allows 520


@pytest.mark.libero
@requires_libero
def test_planner_turns_the_book_to_fit_the_caddy(ten_env):
    """libero_10 task 5: the book stands at 45 degrees (10 cm across in x, the caddy's back
    compartment is 5.5 cm wide): carried turned so that its 2.8 cm thickness lies across
    the compartment, its shape (not its body origin, 1 cm off) centred in it."""
    from simulators.libero.demos import _raw_env
    from simulators.libero.privileged import PrivilegedScene

    task = suite_tasks("libero_10")[5]
    steps = goal_steps(parse_goal(task.bddl_text))
    assert steps == (PickPlace("black_book_1", "in", "desk_caddy_1_back_contain_region"),)
    ten_env.reset([task.task_id], [0])
    scene = PrivilegedScene(_raw_env(ten_env))
    planner = ScriptedPlanner(scene, steps, PlannerConfig())
    box = scene.region_box(steps[0].target)
    assert np.ptp(scene.object_points("black_book_1")[:, 0]) > 0.1 > box.high[0] - box.low[0]
    widths = []
    while planner.phase != "lower":
        ten_env.step(planner.act()[None])
        widths.append(np.ptp(scene.object_points("black_book_1")[:, 0]))
        assert planner.failure is None and len(widths) < 150
    assert widths[-1] < 0.035  # turned: its thickness (2.8 cm) and a slight tilt
    result = run_episode(ten_env, task, 0, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert result.steps < 150


@pytest.mark.libero
@requires_libero
def test_planner_waits_until_thrown_objects_land(env, ten_env):
    """Setting libero_10 task 1's init state 1 throws the orange juice 45 cm up (the table
    is at 0.44 m): the planner first waits until nothing moves, then puts both boxes in
    the basket (its descent to the first box, planned from the flying cartons, did not
    finish before the wait: 25/50 init states). A scene at rest starts at once."""
    from simulators.libero.demos import _raw_env
    from simulators.libero.privileged import PrivilegedScene

    env.reset([0], [0])
    soup = PickPlace("alphabet_soup_1", "in", "basket_1_contain_region")
    assert ScriptedPlanner(PrivilegedScene(_raw_env(env)), (soup,)).phase == "approach"
    task = suite_tasks("libero_10")[1]
    steps = goal_steps(parse_goal(task.bddl_text))
    ten_env.reset([task.task_id], [1])
    scene = PrivilegedScene(_raw_env(ten_env))
    assert scene.object_position("orange_juice_1")[2] > 0.8
    assert scene.object_speed("orange_juice_1") > 1.0  # m/s, falling
    planner = ScriptedPlanner(scene, steps, PlannerConfig())
    assert planner.phase == "wait"
    result = run_episode(ten_env, task, 1, steps, PlannerConfig())
    assert result.success and result.failure is None, result.failure
    assert 150 < result.steps < 300


@pytest.mark.libero
@requires_libero
def test_written_demo_reads_back_and_replays_to_success(env, tmp_path):
    out = tmp_path / "demos"
    # Two tasks in two processes (one per core): each writes its own file.
    args = ["demos", "--tasks", "1", "2", "--init-states", "0", "--image-size", "32", "--out"]
    assert main([*args, str(out), "--no-progress", "--videos", "--processes", "2"]) == 0
    assert sorted(p.name for p in out.glob("*.hdf5")) == [
        "pick_up_the_cream_cheese_and_place_it_in_the_basket_demo.hdf5",
        "pick_up_the_salad_dressing_and_place_it_in_the_basket_demo.hdf5",
    ]
    name = "pick_up_the_cream_cheese_and_place_it_in_the_basket"
    (info,) = scan_demo_file(out / f"{name}_demo.hdf5")
    # --videos: the demo as an MP4, one frame per step, upscaled with caption and step bands
    video = read_video(out / "videos" / f"{name}_init0.mp4")
    assert video.shape[0] == info.length and video.shape[1] > 32 and video.shape[3] == 3
    assert info.instruction == "pick up the cream cheese and place it in the basket"
    assert info.init_state_id == 0 and info.image_shape == (32, 32, 3)
    assert 40 < info.length < 200
    demo = load_demo(info, cameras=("agentview", "wrist"))
    assert demo.actions.shape == (info.length, 7) and demo.proprio.shape == (info.length, 8)
    assert demo.images["wrist"].shape == (info.length, 32, 32, 3)
    assert np.abs(demo.actions).max() <= 1.0
    assert demo.actions[0, 6] == -1.0 and demo.actions[-1, 6] == 1.0  # open ... holding
    with h5py.File(info.path) as f:
        data = f["data"]
        assert (data.attrs["embodied_rl_suite"], data.attrs["embodied_rl_task_id"]) == (
            "libero_object",
            1,
        )
        assert json.loads(data.attrs["env_args"])["env_kwargs"]["camera_heights"] == 32
        states = np.asarray(data["demo_0/states"])
        np.testing.assert_array_equal(data["demo_0"].attrs["init_state"], states[0])
        assert data["demo_0/robot_states"].shape == (info.length, 9)

    # Open-loop replay in another simulator: the same observations, success on the last step.
    obs = env.reset([1], [0])
    for t, action in enumerate(demo.actions):
        np.testing.assert_allclose(obs.state[0], demo.proprio[t], atol=1e-5)
        result = env.step(action[None])
        obs = result.obs
        assert result.success[0] == (t == info.length - 1), f"success at step {t}"

    # demos.json records each task's episodes, file and content digest; --resume keeps them.
    record = json.loads((out / "demos.json").read_text())["tasks"]
    assert [(r["task_id"], r["init_states"], r["successes"]) for r in record] == [
        (1, [0], 1),
        (2, [0], 1),
    ]
    assert record[0]["digest"] == content_digest(out / record[0]["demo_file"])
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*.hdf5")}
    assert main([*args, str(out), "--no-progress", "--resume"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.hdf5")} == stamps  # nothing re-run
    # another init state is another request: the task runs again, refused over its file
    assert main(["demos", "--tasks", "1", "--init-states", "1", "--out", str(out), "--resume"]) == 2


@pytest.mark.libero
@requires_libero
@pytest.mark.parametrize(
    "args, message",
    [
        (["--suite", "libero_nope"], "unknown LIBERO suite 'libero_nope'"),
        (["--tasks", "10"], r"task id\(s\) \[10\] out of range.*Fix: use ids 0..9"),
        (["--init-states", "50"], r"init state id\(s\) \[50\] out of range.*0..49"),
        (
            ["--suite", "libero_90", "--tasks", "35"],
            r"no selected task of libero_90 has a goal the planner handles \(goal \(open micro",
        ),
        (["--image-size", "0"], "--image-size 0 must be >= 1"),
        (["--processes", "0"], "--processes 0 must be >= 1"),
        (["--tasks", "0", "--init-states"], "given no ids and --report is not set: nothing"),
    ],
)
def test_bad_demo_requests_are_refused(tmp_path, capsys, args, message):
    assert main(["demos", *args, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Fix:" in err
    assert re.search(message, err), err
    assert not (tmp_path / "out").exists()


@pytest.mark.libero
@requires_libero
def test_output_path_that_is_a_file_is_refused(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    assert main(["demos", "--tasks", "0", "--out", str(taken), "--no-progress"]) == 2
    assert "is a file. Fix: give a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demos", "--tasks", "zero", "--out", str(tmp_path)])


def test_report_table_and_json(tmp_path):
    task = TaskInfo(3, "pick_up_x", "pick up x", "x.bddl", "", 50)
    results = [
        EpisodeResult(0, True, 90),
        EpisodeResult(1, False, 40, "grasp of 'x_1' failed 2 times"),
        EpisodeResult(2, True, 110),
    ]
    report = summarise(task, results)
    assert (report.successes, report.episodes, report.mean_steps) == (2, 3, 100.0)
    assert report.failed_init_states == [1] and report.rate == pytest.approx(2 / 3)
    unsupported = TaskReport(4, "open_y", "open y", unsupported="(open y) is not pick-and-place")
    json_path, md_path = write_report(tmp_path, "libero_object", [report, unsupported])
    payload = json.loads(json_path.read_text())
    assert payload["tasks"][0]["failures"] == {"1": "grasp of 'x_1' failed 2 times"}
    assert payload["tasks"][0]["rate"] == pytest.approx(2 / 3)
    table = md_path.read_text()
    assert "| 3 | pick up x | 2/3 | 67% | 100.0 | 1 |" in table
    assert "unsupported: (open y)" in table and "Overall: 2/3 (66.7%)." in table


def test_resume_keeps_the_complete_tasks_of_a_stopped_report(tmp_path):
    infos = [TaskInfo(i, f"t{i}", f"task {i}", "x.bddl", "", 3) for i in range(3)]
    complete = summarise(infos[0], [EpisodeResult(i, i != 1, 50, "slipped") for i in range(3)])
    partial = summarise(infos[1], [EpisodeResult(0, True, 60)])  # stopped after 1 of 3
    unsupported = TaskReport(2, "t2", "task 2", unsupported="(close y) is not supported")
    write_report(tmp_path, "libero_goal", [complete, partial, unsupported])
    kept = finished_reports(tmp_path, "libero_goal", infos)
    assert list(kept) == [0] and kept[0] == complete  # failures keyed by int again
    assert finished_reports(tmp_path / "none", "libero_goal", infos) == {}
    with pytest.raises(ConfigError, match="report of 'libero_goal', not 'libero_10'"):
        finished_reports(tmp_path, "libero_10", infos)
