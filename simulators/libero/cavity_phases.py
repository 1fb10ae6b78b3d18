"""The planner's phases for a roofed cavity behind a hinged door (a microwave).

:class:`CavityPhases` is a mixin of :class:`~simulators.libero.planner.ScriptedPlanner`, like
:class:`~simulators.libero.skill_phases.SkillPhases` (the same host attributes: ``scene``,
``config``, ``_s``, ``_step``, ``_others``, ``_holding``, ``_raised``).

:class:`~simulators.libero.goals.PutInside` (``side_*`` phases): libero_10's microwave is
roofed 4 cm above a mug standing on its floor, so a top-down hand (its body 3 to 12 cm
behind the grip) cannot lower a mug in. The mug is taken by its handle instead, which faces
the opening: the hand points into the cavity, tilted ``side_tilt`` from straight down, its
fingers closing across the handle's outer bar; carried level to
in front of the opening, low enough for the mug to pass under the roof, pushed in along the
opening's normal, set down and let go; the hand goes back out the way it came. The Panda's
hand is 20 cm across its closing axis and the opening 20.7 cm wide, so the hand stays
outside: the mug is set where its handle is just inside the closed door's plane, and along
the opening where the hand keeps furthest from the open door and the control panel.

:class:`~simulators.libero.goals.CloseDoor` (``door_*`` and ``swing``): closed fingers,
pointing down, on the outside of the door ``door_push_radius`` from its hinge, pushed along
the door's arc (re-aimed every step, ``swing_lead`` ahead of the door's angle) until LIBERO's
close test holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulators.libero.goals import UnsupportedGoalError, cavity_fixture
from simulators.libero.grasp import down_rotation, path_obstacle_top, wrap_angle, yaw_of
from simulators.libero.skill_phases import CLOSE, OPEN, Waypoint
from simulators.libero.skills import (
    FINGER_TIP,
    door_push_point,
    handle_bar,
    long_axis,
    ray_hit,
    tilt_towards,
    turn_xy,
    widest_gap,
)

PUT_INSIDE = (
    "side_high",
    "side_front",
    "side_in",
    "side_close",
    "side_lift",
    "side_carry",
    "side_mouth",
    "side_insert",
    "side_lower",
    "side_release",
    "side_out",
)
CLOSE_DOOR = ("door_rise", "door_turn", "door_over", "door_down", "swing", "door_up")
_REACH = 0.5  # metres: how far the cavity's walls are looked for from its region's centre


@dataclass(frozen=True)
class Cavity:
    """A door fixture's cavity, world frame, as the planner uses it.

    Attributes:
        inward: ``(2,)`` horizontal unit normal of the opening, pointing in.
        across: ``(2,)`` horizontal unit direction along the opening.
        mouth: the opening's plane (the hinge's coordinate along ``inward``): the shut door
            lies in front of it.
        back: the back wall's inner face along ``inward``.
        sides: the side walls' inner faces along ``across`` (low, high).
        floor / roof: heights of the floor's top and the roof's underside.
    """

    inward: np.ndarray
    across: np.ndarray
    mouth: float
    back: float
    sides: tuple[float, float]
    floor: float
    roof: float


@dataclass(frozen=True)
class Door:
    """A hinged door as it stands: ``hinge (3,)`` (its axis is vertical), ``along (2,)`` (unit,
    hinge to free end), ``closing`` (+1: shuts turning counter-clockwise seen from above),
    ``to_shut`` (rad the door still turns to its closed middle), ``outer`` (the panel's
    reach off the hinge line on the side away from its motion), ``top`` (height)."""

    hinge: np.ndarray
    along: np.ndarray
    closing: float
    to_shut: float
    outer: float
    top: float


class CavityPhases:
    """Waypoints and exit tests of the ``side_*`` (put inside) and ``door_*`` / ``swing``
    (close the door) phases; a mixin of the scripted planner."""

    # --- geometry -----------------------------------------------------------------------------
    def _door(self, fixture: str) -> Door:
        """The door of ``fixture`` now (its biggest collision piece is the panel)."""
        scene = self.scene
        joint = scene.object_joint(fixture)
        if abs(joint.axis[2]) < 0.9:
            raise UnsupportedGoalError(f"the door of {fixture!r} does not turn about the vertical")
        parts = scene.body_parts(joint.body)
        panel = max(parts, key=lambda p: float(np.ptp(p[:, :2], axis=0).sum()))
        along = long_axis(panel[:, :2])
        hinge = joint.anchor
        if (panel[:, :2].mean(axis=0) - hinge[:2]) @ along < 0:
            along = -along
        turn = scene.closed_qpos(fixture) - joint.qpos  # in joint units (rad)
        closing = float(np.sign(turn * joint.axis[2]) or 1.0)
        moving = closing * np.array([-along[1], along[0]])
        outer = float(np.max((panel[:, :2] - hinge[:2]) @ -moving))  # not the handle's
        top = max(float(p[:, 2].max()) for p in parts)
        return Door(hinge, along, closing, abs(turn), outer, top)

    def _cavity(self, region: str) -> Cavity:
        """The cavity of ``region`` (inside a door fixture): the opening is the shut door's
        plane; the walls, floor and roof are what rays from the region's centre meet."""
        fixture = cavity_fixture(region)
        door = self._door(fixture)
        shut_along = turn_xy(door.along, door.closing * door.to_shut)
        centre = self.scene.region_box(region).center
        inward = np.array([-shut_along[1], shut_along[0]])
        if (centre[:2] - door.hinge[:2]) @ inward < 0:
            inward = -inward
        parts = self.scene.object_parts(fixture)

        def wall(direction_xy: np.ndarray | None, up: float = 0.0) -> float:
            """How far from the centre the fixture is met along ``direction_xy`` (or up /
            down: ``up`` +1 / -1)."""
            xy = np.zeros(2) if direction_xy is None else direction_xy
            hit = ray_hit(centre, np.array([*xy, up]), parts, _REACH)
            if hit is None:
                raise UnsupportedGoalError(f"{region!r} is open to {xy} / {up}: not a cavity")
            return hit

        across_at = float(centre[:2] @ shut_along)
        return Cavity(
            inward=inward,
            across=shut_along,
            mouth=float(door.hinge[:2] @ inward),
            back=float(centre[:2] @ inward) + wall(inward),
            sides=(across_at - wall(-shut_along), across_at + wall(shut_along)),
            floor=float(centre[2]) - wall(None, up=-1.0),
            roof=float(centre[2]) + wall(None, up=1.0),
        )

    def _side_rotation(self, inward: np.ndarray) -> np.ndarray:
        """The hand pointing into the cavity, tilted ``side_tilt`` from straight down, its
        fingers closing along the opening."""
        across = np.array([-inward[1], inward[0]])
        yaw = float(np.arctan2(across[1], across[0]))
        _, rotation = self.scene.eef_pose()
        yaw = min(
            (yaw, yaw + np.pi, yaw - np.pi), key=lambda a: abs(wrap_angle(a - yaw_of(rotation)))
        )
        return tilt_towards(down_rotation(yaw), inward, self.config.side_tilt)

    def _handle_grip(self) -> Waypoint:
        """The hand on the held-to-be object's handle bar: across its thickness, the grip site
        ``side_grip_depth`` under the bar's top, the hand pointing into the cavity."""
        step = self._step
        cavity = self._cavity(step.target)
        bar = handle_bar(self.scene.object_parts(step.obj))
        middle = (self.scene.object_points(step.obj)[:, :2]).mean(axis=0)
        bar_centre = (bar.min(axis=0) + bar.max(axis=0)) / 2
        facing = bar_centre[:2] - middle
        if facing @ -cavity.inward < 0.8 * np.linalg.norm(facing):
            raise UnsupportedGoalError(
                f"the handle of {step.obj!r} does not face the opening of {step.target!r}; "
                "the planner does not turn a mug round"
            )
        grip = np.array([*bar_centre[:2], float(bar[:, 2].max()) - self.config.side_grip_depth])
        return Waypoint(grip, 0.0, OPEN, self._side_rotation(cavity.inward))

    def _inside_grip(self) -> np.ndarray:
        """The eef position ``(3,)`` that holds the object at its place in the cavity, its
        bottom ``cavity_clearance`` above the floor: centred between the opening and the back
        wall along the normal (the handle inside the shut door's plane), and along the
        opening where the hand (outside) keeps furthest from the door and the frame."""
        step, scene, c = self._step, self.scene, self.config
        cavity = self._cavity(step.target)
        position, rotation = scene.eef_pose()
        held = scene.object_points(step.obj) - position  # relative to the eef
        depth = held[:, :2] @ cavity.inward
        grip_in = (cavity.mouth + cavity.back) / 2 - (depth.min() + depth.max()) / 2
        height = cavity.floor + c.cavity_clearance - float(held[:, 2].min())
        hand = self._hand_corners(rotation)
        hand_in = grip_in + hand[:, :2] @ cavity.inward
        hand_z = height + hand[:, 2]
        width = held[:, :2] @ cavity.across
        feasible = (
            cavity.sides[0] + c.cavity_margin - width.min(),
            cavity.sides[1] - c.cavity_margin - width.max(),
        )
        obstacles = []
        for part in self._others(step.obj):
            part_in = part[:, :2] @ cavity.inward
            if part_in.min() > cavity.mouth - 0.002:
                continue  # the cavity's own walls, roof and floor: the hand stays outside
            if part_in.min() > hand_in.max() or part_in.max() < hand_in.min():
                continue
            if part[:, 2].min() > hand_z.max() or part[:, 2].max() < hand_z.min():
                continue
            along = part[:, :2] @ cavity.across
            obstacles.append((float(along.min()), float(along.max())))
        hand_across = hand[:, :2] @ cavity.across
        grip_across = widest_gap(feasible, (hand_across.min(), hand_across.max()), obstacles)
        xy = cavity.inward * grip_in + cavity.across * grip_across
        return np.array([*xy, height])

    def _outside_grip(self) -> np.ndarray:
        """The insert position backed out along the normal until the held object's far end
        is ``cavity_margin`` short of the opening."""
        step, scene, c = self._step, self.scene, self.config
        cavity = self._cavity(step.target)
        inside = self._inside_grip()
        position, _ = scene.eef_pose()
        held = scene.object_points(step.obj)[:, :2] - position[:2]
        far = float((held @ cavity.inward).max()) + float(inside[:2] @ cavity.inward)
        back = far - cavity.mouth + c.cavity_margin
        return inside - np.array([*(cavity.inward * back), 0.0])

    # --- put inside ---------------------------------------------------------------------------
    def _waypoint_side_high(self) -> Waypoint:
        """The turned hand high over :meth:`_waypoint_side_front`."""
        return self._raised(self._waypoint_side_front())

    def _waypoint_side_front(self) -> Waypoint:
        """``side_standoff`` back along the hand's axis from the grip and ``approach_height``
        / 2 higher, open."""
        c = self.config
        grip = self._handle_grip()
        self._s.grasped_from = self.scene.object_position(self._step.obj)
        back = -grip.rotation[:, 2] * c.side_standoff + np.array([0, 0, c.approach_height / 2])
        return Waypoint(grip.position + back, 0.0, OPEN, grip.rotation)

    def _waypoint_side_in(self) -> Waypoint:
        grip = self._handle_grip()
        return Waypoint(grip.position, 0.0, OPEN, self._s.waypoint.rotation)

    def _waypoint_side_close(self) -> Waypoint:
        return self._stay(CLOSE)

    def _waypoint_side_release(self) -> Waypoint:
        return self._stay(OPEN)

    def _waypoint_side_lift(self) -> Waypoint:
        """Straight up by ``approach_height``, and at least to the insertion height."""
        position, _ = self.scene.eef_pose()
        height = max(position[2] + self.config.approach_height, self._inside_grip()[2])
        return Waypoint(np.array([*position[:2], height]), 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_side_carry(self) -> Waypoint:
        """Over to in front of the opening, above everything on the way."""
        c = self.config
        position, _ = self.scene.eef_pose()
        outside = self._outside_grip()
        others = self._others(self._step.obj)
        blocking = path_obstacle_top(position[:2], outside[:2], others, c.path_margin)
        below = position[2] - float(self.scene.object_points(self._step.obj)[:, 2].min())
        height = max(position[2], blocking + c.path_clearance + below)
        return Waypoint(np.array([*outside[:2], height]), 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_side_mouth(self) -> Waypoint:
        return Waypoint(self._outside_grip(), 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_side_insert(self) -> Waypoint:
        return Waypoint(self._inside_grip(), 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_side_lower(self) -> Waypoint:
        """Down until the object is ``place_lift`` above the floor (or stands on it)."""
        c = self.config
        cavity = self._cavity(self._step.target)
        position, _ = self.scene.eef_pose()
        bottom = float(self.scene.object_points(self._step.obj)[:, 2].min())
        drop = bottom - cavity.floor - c.place_lift
        return Waypoint(position - np.array([0, 0, drop]), 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_side_out(self) -> Waypoint:
        """Back out along the opening's normal until the finger tips are ``cavity_margin``
        outside it."""
        c = self.config
        cavity = self._cavity(self._step.target)
        position, rotation = self.scene.eef_pose()
        tips = position + rotation[:, 2] * FINGER_TIP
        back = float(tips[:2] @ cavity.inward) - cavity.mouth + c.cavity_margin
        out = position - np.array([*(cavity.inward * back), 0.0])
        return Waypoint(out, 0.0, OPEN, self._s.waypoint.rotation)

    # --- close the door -----------------------------------------------------------------------
    def _door_height(self) -> float:
        """The eef height at which the hand turns and moves over the door."""
        c = self.config
        return self._door(self._step.obj).top + c.approach_height + c.path_clearance + FINGER_TIP

    def _push_pose(self, lead: float, turning: bool = False) -> Waypoint:
        """Closed fingers pointing down at the door's push point once it has turned ``lead``
        (rad) further towards shut, the closing axis along the door, the tips at the hinge's
        middle height. Of the two yaws that put the closing axis along the door: the nearer
        the hand's yaw now, or when ``turning`` (the hand turns from pointing into the cavity)
        the one that leaves the wrist (joint 7) nearer the middle of its range: the nearer
        yaw can turn it into its limit (2.9 rad) before the hand points down."""
        c = self.config
        door = self._door(self._step.obj)
        along = turn_xy(door.along, door.closing * lead)
        point = door_push_point(
            door.hinge[:2], along, door.closing, c.door_push_radius, door.outer + c.door_standoff
        )
        heading = float(np.arctan2(along[1], along[0]))
        _, rotation = self.scene.eef_pose()
        now = yaw_of(rotation)
        turns = [wrap_angle(heading - now), wrap_angle(heading + np.pi - now)]
        if turning:  # the wrist turns about opposite to the hand's yaw (the hand points down)
            wrist = float(self.scene.joint_positions()[6])
            turn = min(turns, key=lambda t: abs(wrist - t))
        else:
            turn = min(turns, key=abs)
        return Waypoint(np.array([*point, door.hinge[2] + FINGER_TIP]), now + turn, CLOSE)

    def _waypoint_door_rise(self) -> Waypoint:
        """Straight up, the hand as it is, to the height over the door."""
        position, rotation = self.scene.eef_pose()
        height = max(position[2], self._door_height())
        return Waypoint(np.array([*position[:2], height]), 0.0, CLOSE, rotation)

    def _waypoint_door_turn(self) -> Waypoint:
        """Turned to point down, closing axis along the door, where the hand is."""
        position, _ = self.scene.eef_pose()
        push = self._push_pose(0.0, turning=True)
        return Waypoint(np.array([*position[:2], self._door_height()]), push.yaw, CLOSE)

    def _waypoint_door_over(self) -> Waypoint:
        push = self._push_pose(0.0)
        return Waypoint(np.array([*push.position[:2], self._door_height()]), push.yaw, CLOSE)

    def _waypoint_door_down(self) -> Waypoint:
        return self._push_pose(0.0)

    def _waypoint_swing(self) -> Waypoint:
        """The push point ``swing_lead`` ahead of the door's angle (no further than shut plus
        ``swing_lead`` / 4, which presses the door against its stop)."""
        c = self.config
        door = self._door(self._step.obj)
        return self._push_pose(min(c.swing_lead, door.to_shut + c.swing_lead / 4))

    def _door_shut(self) -> bool:
        return self.scene.is_closed(self._step.obj)

    def _cavity_phase_done(self, xy: float, z: float, turn: float) -> bool:
        """Exit conditions of the ``side_*``, ``door_*`` and ``swing`` phases that the
        planner's own tests (gripper, contact, carrying) do not cover."""
        s, c = self._s, self.config
        tol = c.position_tolerance
        if s.phase == "door_rise" and self._door_shut():
            return True  # nothing to do
        if s.phase == "swing":
            return self._door_shut() or s.still_steps >= 3
        if s.phase in ("side_high", "door_rise", "door_turn", "door_over"):
            return xy < 2 * tol and z < 2 * tol and turn < c.rotation_tolerance
        if s.phase in PUT_INSIDE + CLOSE_DOOR:
            return xy < tol and z < tol and turn < c.rotation_tolerance
        raise AssertionError(f"unknown phase {s.phase}")
