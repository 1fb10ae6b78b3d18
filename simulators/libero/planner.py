"""A scripted planner for LIBERO, closed-loop on privileged simulator state.

For each step of a task's goal (:mod:`simulators.libero.goals`) the planner drives the end
effector (eef) through a fixed sequence of phases (:data:`PHASES`), each towards a waypoint:

- :class:`~simulators.libero.goals.PickPlace`: above the object, down to the grasp, close
  the gripper, lift, over the target, down, open, back up; a grasp that does not hold when
  lifting is retried;
- :class:`~simulators.libero.goals.ClearOf`: the same phases, placing the object on the
  table at the nearest spot out of a drawer's sweep (skipped when it is out already);
- :class:`~simulators.libero.goals.Push` (a plate): closed fingers down into the dish, then
  moved by what the dish still has to move (re-aimed every step), so they drag it by the
  inside of its rim until its body is on the goal region, back up (from behind, a plate
  next to a cabinet leaves no room for the hand);
- :class:`~simulators.libero.goals.OpenDrawer`: the hand turned nearly horizontal high above
  the front of the handle, down, in to the bar, close, pull along the drawer's axis past
  LIBERO's open threshold, open, back off (a drawer already open is skipped);
- :class:`~simulators.libero.goals.CloseDrawer`: closed fingers, pointing down and tilted
  towards the cabinet, lowered in front of the drawer's panel beside its handle and pushed
  along the drawer's axis past LIBERO's close threshold, back up (a drawer already closed
  is skipped). Not the opening's horizontal hand: with the drawer open its wrist reaches
  28 cm out in front of the handle, where libero_10's wine rack stands before the bottom
  drawer;
- :class:`~simulators.libero.goals.TurnOn`: a grasp of the knob's ridge from above (the hand
  tilted towards the robot's base), a twist about the vertical past LIBERO's on threshold,
  open, back up.
- :class:`~simulators.libero.goals.PutInside` (a mug into a microwave) and
  :class:`~simulators.libero.goals.CloseDoor` (its door): see
  :mod:`simulators.libero.cavity_phases`.

Before the first step the planner waits (hand still, open) while any object moves faster
than ``settle_speed``: setting some of libero_10's init states throws objects into the air.

Every waypoint is computed from the scene
(:class:`~simulators.libero.privileged.PrivilegedScene`) when its phase starts, so a nudged
object or a slipped grasp is seen.

Actions are in the policies' convention (:data:`simulators.libero.suites.ACTION_DIM`):
``[dx, dy, dz, drx, dry, drz, gripper]`` in ``[-1, 1]``, the first six scaled by OSC_POSE to
metres / radians (0.05 m, 0.5 rad per unit by default), world frame, rotations as axis-angle;
gripper -1 opens, +1 closes. Control is proportional: ``action = gain * error / scale``,
clipped. With gain 1 the controller's goal is exactly the waypoint whenever the error is
within one action's reach, and OSC's critically damped impedance brings the eef there
without overshoot; further away the action saturates (about 1.2 cm per step).

An object wider than the narrow side of the region it goes ``in`` (libero_10's book and the
caddy's compartment) is turned while carried, its thinnest side across the region, and its
shape rather than its body origin is centred in the region.

Grasps are top-down with the fingers vertical (:mod:`simulators.libero.grasp`): across the
object's narrowest horizontal width (a box across its short side; round objects keep the
current yaw), turned away from neighbours the hand would hit, ``grasp_depth`` below the
object's top. Moves at height (approach, carry) rise above every object near the path. The
held object is placed by its body position, which is what LIBERO's goal tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from simulators.libero.cavity_phases import CLOSE_DOOR, PUT_INSIDE, CavityPhases
from simulators.libero.goals import (
    ClearOf,
    CloseDoor,
    CloseDrawer,
    OpenDrawer,
    PickPlace,
    Push,
    PutInside,
    Step,
    TurnOn,
    UnsupportedGoalError,
    is_drawer_region,
)
from simulators.libero.grasp import (
    Grasp,
    GraspLimits,
    finger_width,
    path_obstacle_top,
    plan_grasp,
    wrap_angle,
    yaw_of,
)
from simulators.libero.privileged import PrivilegedScene, RegionBox
from simulators.libero.skill_phases import CLOSE, OPEN, SkillPhases, Waypoint
from simulators.libero.skills import clear_move, knob_grip_points, shift_clear, slot_offset

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


@dataclass
class _State:
    """Mutable progress through the goal (reset for every episode)."""

    step: int = 0  # index into the goal's steps
    phase: str = "approach"
    phase_steps: int = 0
    attempts: int = 1
    grasp: Grasp | None = None
    grasped_from: np.ndarray | None = None  # the object's position when its grasp was planned
    waypoint: Waypoint | None = None
    last_position: np.ndarray | None = None
    last_opening: float | None = None
    still_steps: int = 0  # consecutive steps the eef moved under 0.5 mm
    gripper_settled: bool = False  # the fingers moved under 0.5 mm in the last step
    failure: str | None = None
    history: list[str] = field(default_factory=list)
    path: np.ndarray | None = None  # a pushed object's planned centre positions (M, 2)
    clear_goal: tuple[np.ndarray, float] | None = None  # ClearOf: body xy (2,), table height
    tight: bool = False  # the held object is turned to fit its region (see _place_yaw)


def rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Axis-angle ``(3,)`` of the shortest world-frame rotation from ``current`` to ``target``.

    OSC_POSE applies a rotation delta as ``R(delta) @ current``, so this is the delta that
    reaches ``target``.
    """
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, (target @ current.T).reshape(-1))  # (w, x, y, z)
    if quat[0] < 0:
        quat = -quat  # the same rotation; w >= 0 gives the angle in [0, pi]
    sin_half = np.linalg.norm(quat[1:])
    if sin_half < 1e-9:
        return np.zeros(3)
    return quat[1:] / sin_half * 2.0 * np.arctan2(sin_half, quat[0])


class ScriptedPlanner(SkillPhases, CavityPhases):
    """Waypoint skills through a sequence of goal steps (:data:`PHASES`).

    Call :meth:`act` once per env step with the scene in its current state; it returns the
    next ``(7,)`` action. :attr:`failure` is set (and :meth:`act` keeps returning a still,
    open-gripper action) when the planner gives up.

    Args:
        scene: the privileged view of the env.
        steps: the goal's skill steps, in order.
        config: gains and clearances.
    """

    def __init__(
        self,
        scene: PrivilegedScene,
        steps: tuple[Step, ...],
        config: PlannerConfig | None = None,
    ) -> None:
        if not steps:
            raise UnsupportedGoalError("the goal has no step")
        self.scene = scene
        self.steps = steps
        self.config = config or PlannerConfig()
        self._s = _State()
        self.reset()

    def reset(self) -> None:
        """Start from the first step (call after every env reset and ``scene.refresh()``);
        first ``wait`` while an object is thrown about (an init state of libero_10's living room
        throws the milk, the ketchup and the orange juice 45 cm up when it is set: planned
        from where they fly, grasps and heights would be wrong)."""
        self._s = _State()
        if self._scene_moving():
            self._enter("wait")
        else:
            self._start_step()

    def _scene_moving(self) -> bool:
        """Whether any movable object moves faster than ``settle_speed``."""
        speed = self.config.settle_speed
        return any(self.scene.object_speed(n) > speed for n in self.scene.movable_objects())

    def _start_step(self) -> None:
        """Enter the current step's first phase; a :class:`ClearOf` whose object is clear
        of the drawer is skipped (the last step never is one)."""
        s = self._s
        while isinstance(self._step, ClearOf):
            s.clear_goal = self._plan_clear()
            if s.clear_goal is not None or s.failure is not None:
                break
            s.step += 1
        self._enter(self._order()[0])

    @property
    def failure(self) -> str | None:
        """Why the planner gave up, or ``None``."""
        return self._s.failure

    @property
    def phase(self) -> str:
        """The current phase name (``approach``, ``descend``, ``close``, ...)."""
        return self._s.phase

    @property
    def history(self) -> list[str]:
        """``phase@step`` of every phase entered so far (for failure reports)."""
        return list(self._s.history)

    def act(self) -> np.ndarray:
        """The next action ``(7,)`` float32 in ``[-1, 1]``."""
        s = self._s
        self._measure()
        if s.failure is None:
            for _ in range(3):  # a phase may end at once (e.g. already above the object)
                if not self._phase_done():
                    break
                self._advance()
                if s.failure is not None:
                    break
        if s.failure is not None:
            position, _ = self.scene.eef_pose()
            return self._control(Waypoint(position, s.waypoint.yaw, OPEN, s.waypoint.rotation))
        if s.phase in LIVE_PHASES:
            s.waypoint = getattr(self, f"_waypoint_{s.phase}")()
        s.phase_steps += 1
        if s.phase_steps > self.config.phase_steps:
            s.failure = f"phase {s.phase!r} of step {s.step} did not finish"
        return self._control(s.waypoint)

    def _measure(self) -> None:
        """Update the motion and gripper counters once per env step."""
        s = self._s
        position, _ = self.scene.eef_pose()
        moved = np.inf if s.last_position is None else np.linalg.norm(position - s.last_position)
        s.still_steps = s.still_steps + 1 if moved < 5e-4 else 0
        s.last_position = position
        opening = self.scene.finger_opening()
        s.gripper_settled = s.last_opening is not None and abs(opening - s.last_opening) < 5e-4
        s.last_opening = opening

    # --- control ------------------------------------------------------------------------------
    def _control(self, waypoint: Waypoint) -> np.ndarray:
        """Proportional action towards ``waypoint``, clipped to ``[-1, 1]``."""
        position, rotation = self.scene.eef_pose()
        position_scale, rotation_scale = self.scene.action_scale()
        c = self.config
        move = c.position_gain * (waypoint.position - position) / position_scale
        turn = c.rotation_gain * rotation_error(waypoint.target_rotation(), rotation)
        turn = turn / rotation_scale
        action = np.concatenate([move, turn, [waypoint.gripper]])
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _errors(self) -> tuple[float, float, float]:
        """``(xy distance, |z error|, |yaw error|)`` of the eef to the current waypoint (for a
        full-rotation waypoint the angle of the whole rotation error instead of the yaw's)."""
        position, rotation = self.scene.eef_pose()
        waypoint = self._s.waypoint
        error = waypoint.position - position
        if waypoint.rotation is None:
            turn = abs(wrap_angle(waypoint.yaw - yaw_of(rotation)))
        else:
            turn = float(np.linalg.norm(rotation_error(waypoint.rotation, rotation)))
        return float(np.linalg.norm(error[:2])), float(abs(error[2])), turn

    @property
    def _step(self) -> Step:
        return self.steps[self._s.step]

    def _order(self) -> tuple[str, ...]:
        """The phases of the current step."""
        return PHASES[type(self._step)]

    # --- phases -------------------------------------------------------------------------------
    def _phase_done(self) -> bool:
        """Whether the current phase's exit condition holds (reads the scene)."""
        s, c = self._s, self.config
        xy, z, yaw = self._errors()
        tol = c.position_tolerance
        reached = xy < tol and z < tol and yaw < c.yaw_tolerance
        # blocked by contact (the object, the surface, the handle) counts as arrived
        blocked = s.still_steps >= 2 and s.phase_steps >= 4
        if s.phase in ("approach", "push_over"):
            return xy < tol and z < 2 * tol and yaw < c.yaw_tolerance
        if s.phase in ("carry", "side_carry", "side_insert"):  # a held load can stop the arm
            # short: near and still is enough
            stalled = s.still_steps >= 3 and xy < 3 * tol
            return (xy < tol or stalled) and z < 3 * tol
        if s.phase == "lower":  # over the target, whatever stops the load is its support
            return reached or (blocked and xy < 2 * tol)  # (libero_10's basket floor is 5 cm
            # above the bottom of its region box, which the In test reads)
        if s.phase in ("descend", "push_down", "shut_down", "side_in", "side_lower", "door_down"):
            return reached or (blocked and xy < 2 * tol and z < 3 * tol)
        if s.phase in ("close", "grip", "side_close"):
            low, high = c.close_steps
            return s.phase_steps >= high or (s.phase_steps >= low and s.gripper_settled)
        if s.phase in ("release", "side_release"):  # fingers still pinching (a cream
            # cheese) are not settled
            low, high = c.release_steps
            opened = s.gripper_settled and self.scene.finger_opening() >= c.release_opening
            return s.phase_steps >= high or (s.phase_steps >= low and opened)
        if s.phase == "settle":
            return s.phase_steps >= c.settle_steps
        if s.phase == "wait":
            return not self._scene_moving() or s.phase_steps >= c.wait_steps
        if s.phase in (
            "lift",
            "retreat",
            "reopen",
            "push_up",
            "shut_up",
            "door_up",
        ):  # vertical: the
            # height matters
            return z < 2 * tol
        return self._skill_phase_done(xy, z, yaw, blocked)

    def _advance(self) -> None:
        """Leave the current phase for the next one (or retry / finish the step)."""
        s, step = self._s, self._step
        if s.phase == "lift" and not self._holding(step.obj):
            if s.attempts >= self.config.max_attempts:
                s.failure = f"grasp of {step.obj!r} failed {s.attempts} times"
                return
            s.attempts += 1
            self._enter("reopen")
            return
        if s.phase == "reopen":
            self._enter("approach")
            return
        if s.phase == "wait":
            self._start_step()
            return
        if s.phase == "twist" and not self.scene.is_turned_on(step.obj):
            s.failure = f"the knob of {step.obj!r} did not turn on"
            return
        if s.phase == "shut" and not self._drawer_there():
            s.failure = f"the drawer of {step.region!r} stopped short of shut"
            return
        if s.phase == "side_lift" and not self._holding(step.obj):
            s.failure = f"the handle grasp of {step.obj!r} did not hold"
            return
        if s.phase == "swing" and not self._door_shut():
            s.failure = f"the door of {step.obj!r} stopped short of shut"
            return
        order = self._order()
        already = s.phase in ("handle_above", "shut_over") and self._drawer_there()
        already = already or (s.phase == "door_rise" and self._door_shut())
        if s.phase in (order[-1], "settle") or already:
            self._next_step()
            return
        self._enter(order[order.index(s.phase) + 1])

    def _holding(self, obj: str) -> bool:
        """Whether the lifted ``obj`` is held: both finger pads touch it (robosuite's test),
        or it rose with the hand by half the lift between fingers that are not shut (a bowl
        held by its rim often touches the fingers but not both pads; one caught on a finger
        side rises too, then falls)."""
        rose = self.scene.object_position(obj)[2] - self._s.grasped_from[2]
        pinched = self.scene.finger_opening() > self.config.min_held_width  # not shut on air
        return self.scene.is_grasping(obj) or (rose > self.config.approach_height / 2 and pinched)

    def _next_step(self) -> None:
        s = self._s
        if s.phase == "settle":
            s.failure = "all steps done but the task's success test does not hold"
            return
        if s.step + 1 >= len(self.steps):  # a released object may still be landing
            self._enter("settle")
            return
        s.step, s.attempts = s.step + 1, 1
        self._start_step()

    def _enter(self, phase: str) -> None:
        """Start ``phase``: compute its waypoint from the scene as it is now."""
        s = self._s
        s.phase, s.phase_steps, s.still_steps, s.gripper_settled = phase, 0, 0, False
        s.history.append(f"{phase}@{len(s.history)}")
        s.waypoint = getattr(self, f"_waypoint_{phase}")()

    def _waypoint_approach(self) -> Waypoint:
        s, c = self._s, self.config
        position, rotation = self.scene.eef_pose()
        obj = self._step.obj
        s.grasp = self._plan_grasp(yaw_of(rotation), position[:2])
        s.grasped_from = self.scene.object_position(obj)
        target = s.grasp.position[:2]
        blocking = path_obstacle_top(position[:2], target, self._others(obj), c.path_margin)
        height = max(s.grasp.top + c.approach_height, blocking + c.path_clearance)
        return Waypoint(np.array([*target, height]), s.grasp.yaw, OPEN, self._hand(s.grasp.yaw))

    def _waypoint_descend(self) -> Waypoint:
        """The approach's grasp, moved as far as the object has moved since (xy)."""
        s = self._s
        moved = self.scene.object_position(self._step.obj) - s.grasped_from
        position = s.grasp.position + np.array([moved[0], moved[1], 0.0])
        return Waypoint(position, s.grasp.yaw, OPEN, self._hand(s.grasp.yaw))

    def _stay(self, gripper: float) -> Waypoint:
        """The current waypoint's pose with another gripper command (close, grip, release)."""
        waypoint = self._s.waypoint
        return Waypoint(waypoint.position.copy(), waypoint.yaw, gripper, waypoint.rotation)

    def _waypoint_close(self) -> Waypoint:
        return self._stay(CLOSE)

    _waypoint_grip = _waypoint_close

    def _waypoint_lift(self) -> Waypoint:
        """Straight up to the carry height, and at least ``approach_height`` off the support."""
        self._s.tight = self._tight_fit()  # as the object stands, before the hand turns it
        position, _ = self.scene.eef_pose()
        height = max(
            self._carry_height(self._place_target_xy()), position[2] + self.config.approach_height
        )
        return Waypoint(np.array([*position[:2], height]), self._s.waypoint.yaw, CLOSE)

    def _waypoint_carry(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        target = self._place_target_xy()
        height = max(position[2], self._carry_height(target))
        return Waypoint(np.array([*target, height]), self._place_yaw(), CLOSE)

    def _narrow_side(self) -> tuple[int, float]:
        """The step's target region's narrower horizontal axis (0 = x, 1 = y) and its width."""
        box = self.scene.region_box(self._step.target)
        size = (box.high - box.low)[:2]
        narrow = int(np.argmin(size))
        return narrow, float(size[narrow])

    def _tight_fit(self) -> bool:
        """Whether the step puts its object ``in`` a region whose narrow side is narrower
        than the object's footprint along it as the object stands now."""
        step, scene = self._step, self.scene
        if not (isinstance(step, PickPlace) and step.relation == "in"):
            return False
        if not scene.is_site(step.target):
            return False
        narrow, width = self._narrow_side()
        return bool(np.ptp(scene.object_points(step.obj)[:, narrow]) > width)

    def _place_yaw(self) -> float:
        """The hand's yaw to carry and place the held object: the grasp's, but turned when
        the object is wider than the narrow side of the region it goes ``in`` so that its
        thinnest horizontal direction lies along that side (libero_10's book, standing at
        45 degrees, 10 cm across, into a caddy's 5.5 cm compartment)."""
        yaw = self._s.waypoint.yaw
        if not self._s.tight:
            return yaw
        narrow, width = self._narrow_side()
        points = self.scene.object_points(self._step.obj)[:, :2]
        headings = np.deg2rad(np.arange(0, 180, 5))
        widths = [finger_width(points, h)[0] for h in headings]
        thin = float(headings[int(np.argmin(widths))])
        if min(widths) >= width:
            return yaw  # does not fit whichever way: go as it is
        turn = wrap_angle(narrow * np.pi / 2 - thin)
        turn = min((turn, turn - np.pi, turn + np.pi), key=abs)  # a half turn is the same fit
        return float(yaw + turn)

    def _waypoint_lower(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        target = self._place_target_xy()
        return Waypoint(np.array([*target, self._place_height()]), self._s.waypoint.yaw, CLOSE)

    def _waypoint_release(self) -> Waypoint:
        return self._stay(OPEN)

    def _waypoint_retreat(self) -> Waypoint:
        """Open, ``approach_height`` straight up from where the eef is (also after a failed
        grasp, ``reopen``, and after a push, ``push_up``)."""
        position, _ = self.scene.eef_pose()
        up = position + np.array([0.0, 0.0, self.config.approach_height])
        return Waypoint(up, self._s.waypoint.yaw, OPEN)

    _waypoint_reopen = _waypoint_push_up = _waypoint_shut_up = _waypoint_door_up = _waypoint_retreat

    def _waypoint_settle(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        return Waypoint(position, self._s.waypoint.yaw, OPEN, self._s.waypoint.rotation)

    def _waypoint_wait(self) -> Waypoint:
        """Hold the eef where it is, open."""
        position, rotation = self.scene.eef_pose()
        return Waypoint(position, yaw_of(rotation), OPEN, rotation)

    def _others(self, obj: str) -> list[np.ndarray]:
        """World points of every movable object but ``obj`` (the obstacles)."""
        names = self.scene.movable_objects() + self.scene.fixtures()
        return [part for n in names if n != obj for part in self.scene.object_parts(n)]

    def _plan_grasp(self, yaw: float, eef_xy: np.ndarray) -> Grasp:
        """A grasp of the step's object from the scene now, preferring ``yaw`` and sides near
        ``eef_xy``; a knob's ridge for :class:`TurnOn` (its tabs are obstacles, like the
        other objects)."""
        obj = self._step.obj
        points, obstacles = self.scene.object_points(obj), self._others(obj)
        if isinstance(self._step, TurnOn):
            parts = self.scene.body_parts(self.scene.object_joint(obj).body)
            points = knob_grip_points(parts)
            top = float(points[:, 2].max())
            obstacles += [p for p in parts if float(p[:, 2].max()) < top]
        try:
            return plan_grasp(
                points,
                obstacles,
                self.scene.gripper_boxes(),
                yaw,
                self.config.grasp,
                eef_xy,
            )
        except ValueError as err:
            raise UnsupportedGoalError(f"cannot grasp {obj!r}: {err}") from None

    # --- placing ------------------------------------------------------------------------------
    def _held_offset(self) -> tuple[np.ndarray, float]:
        """Held object's body position minus the eef's ``(3,)``, and its bottom below the eef."""
        obj = self.steps[self._s.step].obj
        position, _ = self.scene.eef_pose()
        bottom = float(self.scene.object_points(obj)[:, 2].min())
        return self.scene.object_position(obj) - position, float(position[2] - bottom)

    def _place_goal(self) -> tuple[np.ndarray, float]:
        """Where the held object's body goes (xy ``(2,)``) and the height of its resting surface.

        ``in`` a region: the region's centre, resting on its floor (LIBERO's ``in_box``
        test needs the body position inside the box). ``on`` a region site: the site's
        centre, on its top face. ``on`` an object: the object's body xy (LIBERO tests the
        xy distance of the two bodies), on its highest point.
        """
        step = self.steps[self._s.step]
        scene = self.scene
        if isinstance(step, ClearOf):
            return self._s.clear_goal
        if scene.is_site(step.target):
            box = scene.region_box(step.target)
            surface = box.low[2] + 0.01 if step.relation == "in" else box.high[2]
            centre = box.center[:2] + slot_offset(box.low, box.high, step.slot)
            if self._s.tight:  # the object's shape, not its body, in the middle of the region
                points = scene.object_points(step.obj)[:, :2]
                middle = (points.min(axis=0) + points.max(axis=0)) / 2
                centre = centre - (middle - scene.object_position(step.obj)[:2])
            if step.relation == "in" and is_drawer_region(step.target):
                centre = self._below_open_sky(centre, box)
            return centre, float(surface)
        if step.relation == "in":
            raise UnsupportedGoalError(f"(In {step.obj} {step.target}): target is not a region")
        top = float(scene.object_points(step.target)[:, 2].max())
        return scene.object_position(step.target)[:2], top

    def _below_open_sky(self, centre: np.ndarray, box: RegionBox) -> np.ndarray:
        """``centre`` (body xy ``(2,)``) moved out along the open drawer's axis, half-way
        between the least shift that clears the held object's footprint of everything above
        the drawer (the drawers above it and their handles) and the most that keeps it inside
        the region (the drawer's front wall); ``centre`` when no shift clears them. libero_10's
        bowl is 10.8 cm across and its bottom drawer leaves it 0 to 3 mm between the two."""
        step, scene = self._step, self.scene
        outward = scene.drawer_outward(step.target)[:2]
        outward = outward / max(float(np.linalg.norm(outward)), 1e-9)
        footprint = scene.object_points(step.obj)[:, :2] - scene.object_position(step.obj)[:2]
        footprint = footprint + centre
        overhangs = [p[:, :2] for p in self._others(step.obj) if float(p[:, 2].min()) > box.high[2]]
        corners = np.array(
            [[x, y] for x in (box.low[0], box.high[0]) for y in (box.low[1], box.high[1])]
        )
        inside = float((corners @ outward).max() - (footprint @ outward).max())
        clear = shift_clear(
            footprint, overhangs, outward, reach=max(inside, 0.0) + 0.05, margin=0.0
        )
        if clear is None:
            return centre
        return centre + outward * (float(np.linalg.norm(clear)) + inside) / 2

    def _plan_clear(self) -> tuple[np.ndarray, float] | None:
        """Where :class:`ClearOf` puts its object (body xy ``(2,)``, table height), ``None``
        when it is clear already: the nearest spot ``clear_margin`` away from the drawer's
        sweep (the drawer body from where it is to fully open) and ``place_gap`` from the
        objects standing on the table (pieces above its bottom)."""
        step, scene = self._step, self.scene
        points = scene.object_points(step.obj)
        bottom = float(points[:, 2].min())
        joint = scene.region_joint(step.region)
        opened, _ = scene.open_close_qpos(step.region)
        drawer = np.concatenate(scene.body_parts(joint.body))
        sweep = np.concatenate([drawer, drawer + (opened - joint.qpos) * joint.axis])
        standing = [p for p in self._others(step.obj) if float(p[:, 2].max()) > bottom + 0.005]
        c = self.config
        keep_out = [(sweep[:, :2], c.clear_margin)] + [(p[:, :2], c.place_gap) for p in standing]
        move = clear_move(points[:, :2], keep_out, scene.base_position()[:2])
        if move is None:
            self._s.failure = f"no free spot on the table to move {step.obj!r} out of the drawer"
            return None
        if not move.any():
            return None
        return scene.object_position(step.obj)[:2] + move, bottom

    def _place_target_xy(self) -> np.ndarray:
        """The eef xy that puts the held object's body over the place goal."""
        goal_xy, _ = self._place_goal()
        offset, _ = self._held_offset()
        return goal_xy - offset[:2]

    def _place_height(self) -> float:
        """The eef height that holds the object ``place_lift`` above the resting surface."""
        _, surface = self._place_goal()
        _, below = self._held_offset()
        return surface + self.config.place_lift + below

    def _carry_height(self, target_xy: np.ndarray) -> float:
        """The eef height that carries the held object's bottom over everything on the way."""
        s, c = self._s, self.config
        position, _ = self.scene.eef_pose()
        obj = self.steps[s.step].obj
        blocking = path_obstacle_top(position[:2], target_xy, self._others(obj), c.path_margin)
        _, below = self._held_offset()
        return max(blocking + c.path_clearance + below, self._place_height())
