"""The scripted planner's settings and the phases of each kind of goal step.

:class:`PlannerConfig` holds the gains, clearances and phase limits of
:class:`~simulators.libero.planner.ScriptedPlanner`; :data:`PHASES` lists, per kind of goal
step (:mod:`simulators.libero.goals`), the phases the planner drives the eef through, in
order, and :data:`LIVE_PHASES` the phases whose waypoint follows the scene every env step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulators.libero.cavity_phases import CLOSE_DOOR, PUT_INSIDE
from simulators.libero.goals import (
    ClearOf,
    CloseDoor,
    CloseDrawer,
    OpenDrawer,
    PickPlace,
    Push,
    PutInside,
    TurnOn,
)
from simulators.libero.grasp import GraspLimits

# The phases of each kind of step, in order; the last one ends the step.
PICK_AND_PLACE = ("approach", "descend", "close", "lift", "carry", "lower", "release", "retreat")
PHASES = {
    PickPlace: PICK_AND_PLACE,
    ClearOf: PICK_AND_PLACE,  # a pick-and-place to a spot out of the drawer's way
    Push: ("push_over", "push_down", "push", "push_up"),
    OpenDrawer: (
        "handle_above",
        "handle_front",
        "handle_in",
        "grip",
        "pull",
        "release",
        "back_off",
    ),
    CloseDrawer: ("shut_over", "shut_down", "shut", "shut_up"),
    TurnOn: ("approach", "descend", "close", "twist", "release", "retreat"),
    PutInside: PUT_INSIDE,
    CloseDoor: CLOSE_DOOR,
}
LIVE_PHASES = ("push", "pull", "shut", "twist", "swing")  # waypoints recomputed every step


@dataclass
class PlannerConfig:
    """Gains, clearances and phase limits of the planner (metres, radians, env steps).

    Attributes:
        position_gain / rotation_gain: proportional gains on the eef error, in units of one
            action's reach (1 = aim the controller exactly at the waypoint).
        grasp: what makes a grasp feasible (width, depth, gaps to neighbours).
        approach_height: pre-grasp eef height above the object's top.
        path_clearance: moving eef / held object's bottom above obstacles on the path.
        path_margin: horizontal distance from the path within which objects are obstacles
            (the hand reaches about 10 cm along the finger axis).
        place_lift: held object's bottom above the place surface when released.
        position_tolerance / yaw_tolerance: a waypoint counts as reached within these.
        close_steps / release_steps: gripper steps (min, max) to close and to open.
        release_opening: a release ends early only with the fingers this far apart (m).
        settle_steps: after the last step, steps to wait for the success test (a released
            object may still be landing) before giving up.
        settle_speed / wait_steps: before the first step, wait (at most ``wait_steps``)
            until no object moves faster than ``settle_speed`` (m/s): thrown cartons fall
            at over 1 m/s; a bowl sliding off libero_spatial's ramekin at 0.2 m/s is taken
            as it slides (waiting for it to settle made its rim grasp fail: task 5, 49/50
            -> 3/50 at 0.02 m/s).
        max_attempts: grasp attempts per object before giving up.
        min_held_width: fingers closer than this (m) hold nothing between them.
        phase_steps: a phase that has not reached its waypoint after this many steps ends
            the episode as a planner failure.
        push_margin: pushing: the pushed dish's path keeps this far from other objects.
        push_lookahead: pushing: the dish is aimed at the path point this far ahead of it.
        push_speed: pushing: how far beyond the contact (m) the push aims each step.
        push_contact: pushing: the fingers' distance from the dish's centre while dragging
            it (a LIBERO plate's floor is 6 cm across, its rim's foot 8 to 10 cm).
        push_height: pushing: finger tips' target above the pushed dish's bottom; below it,
            so that the fingers press on the dish's floor (OSC's stiffness turns the 2 cm into
            a few newtons): held down, they drag the dish by friction and by the inside of
            its rim instead of riding up the rim's slope.
        push_tolerance: pushing ends with the body this close (xy) to the region's centre.
        handle_standoff: drawers: eef distance in front of the handle before going in.
        tip_clearance: drawers: the deepest finger point past the handle bar's back face.
        handle_pitch: drawers: the hand's tilt (tips down, rad) when gripping a handle.
        pull_overshoot: drawers: pull this far (m) past the middle of the open range.
        pull_speed: drawers: how far ahead of the eef (m) the pull (the push shut) aims each
            step.
        shut_standoff: closing drawers: the eef's distance in front of the drawer's front
            face when it goes down (a closed finger is 2 cm thick) ...
        shut_below_top: ... and the finger tips' depth below the face's top edge.
        shut_pitch: closing drawers: the hand's tilt (rad), tips towards the cabinet.
        shut_edge_inset: closing drawers: the fingers push the panel this far in from its
            end away from the robot.
        rotation_tolerance: a full-rotation waypoint counts as reached within this angle.
        knob_overturn: knobs: twist this far (rad) past the on threshold.
        knob_pitch: knobs: the hand's tilt (rad) about its closing axis, tips towards the
            robot's base.
        side_tilt: putting inside a cavity: the hand's tilt (rad) from straight down, tips
            into the cavity (a level hand's fingers slip round the handle; upright, its body
            meets the roof's front edge) ...
        side_grip_depth: ... the grip site this far below the handle bar's top ...
        side_standoff: ... and this far back along the hand's axis before going in.
        cavity_clearance: the held object's bottom above the cavity's floor as it goes in.
        cavity_margin: the object keeps this far from the cavity's side walls; it waits,
            and the finger tips end, this far outside the opening.
        door_push_radius: doors: the fingers push this far from the hinge (the hand's body,
            20 cm along the door, ends short of the handle at its free end) ...
        door_standoff: ... and this far off the panel's outer face.
        swing_lead: doors: the push aims this far (rad) ahead of the door's angle.
        clear_margin: clearing: the moved object keeps this far (xy) from the drawer's
            sweep (room for the fingers of the next grasp) ...
        place_gap: ... and this far from the objects standing on the table.
    """

    position_gain: float = 1.0
    rotation_gain: float = 1.0
    grasp: GraspLimits = field(default_factory=GraspLimits)
    approach_height: float = 0.05
    path_clearance: float = 0.03
    path_margin: float = 0.08
    place_lift: float = 0.01
    position_tolerance: float = 0.01
    yaw_tolerance: float = 0.08
    close_steps: tuple[int, int] = (4, 14)
    release_steps: tuple[int, int] = (3, 12)
    release_opening: float = 0.06
    settle_steps: int = 10
    settle_speed: float = 0.5
    wait_steps: int = 40
    max_attempts: int = 2
    min_held_width: float = 0.003
    phase_steps: int = 80
    push_height: float = -0.008
    push_margin: float = 0.01
    push_lookahead: float = 0.03
    push_speed: float = 0.05
    push_contact: float = 0.03
    push_tolerance: float = 0.015
    handle_standoff: float = 0.08
    tip_clearance: float = 0.012
    handle_pitch: float = 0.21
    pull_overshoot: float = 0.005
    pull_speed: float = 0.02
    shut_standoff: float = 0.025
    shut_below_top: float = 0.015
    shut_pitch: float = 1.0
    shut_edge_inset: float = 0.008
    rotation_tolerance: float = 0.1
    knob_overturn: float = 0.35
    knob_pitch: float = 0.5
    side_tilt: float = 1.0
    side_grip_depth: float = 0.02
    side_standoff: float = 0.08
    cavity_clearance: float = 0.02
    cavity_margin: float = 0.02
    door_push_radius: float = 0.12
    door_standoff: float = 0.018
    swing_lead: float = 0.25
    clear_margin: float = 0.04
    place_gap: float = 0.01
