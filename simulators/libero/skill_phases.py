"""The planner's push, drawer and knob phases: their waypoints and exit tests.

:class:`SkillPhases` is a mixin of :class:`~simulators.libero.planner.ScriptedPlanner` (the
phase machine and the control live there, pick-and-place in
:mod:`simulators.libero.pick_place_phases`): its ``_waypoint_<phase>`` methods compute a
phase's :class:`Waypoint` from the scene when the phase starts (or every step for the
planner's ``LIVE_PHASES``), and :meth:`SkillPhases._skill_phase_done` says when one ends. They
use the host's ``scene``, ``config`` (a ``PlannerConfig``), ``_s`` (a ``PlannerState``),
``_step`` (the current goal step) and ``_others``; the geometry is
:mod:`simulators.libero.skills`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulators.libero.goals import CloseDrawer, TurnOn, UnsupportedGoalError
from simulators.libero.grasp import clear_yaw, down_rotation, path_obstacle_top, wrap_angle, yaw_of
from simulators.libero.skills import FINGER_TIP, handle_grip, handle_part, push_path, tilt_towards

OPEN, CLOSE = -1.0, 1.0


@dataclass
class Waypoint:
    """Target of a phase: eef position ``(3,)``, yaw, gripper command, and optionally a full
    eef rotation ``(3, 3)`` that replaces the down-pointing one of ``yaw`` (a drawer's
    handle is gripped with the hand nearly horizontal, a knob with the hand tilted)."""

    position: np.ndarray
    yaw: float
    gripper: float
    rotation: np.ndarray | None = None

    def target_rotation(self) -> np.ndarray:
        return down_rotation(self.yaw) if self.rotation is None else self.rotation


class SkillPhases:
    """Waypoints and exit tests of the push (``push_*``), drawer (``handle_*``, ``pull``,
    ``back_off``; ``shut_*``) and knob (``twist``) phases; a mixin of the scripted planner."""

    def _skill_phase_done(self, xy: float, z: float, turn: float, blocked: bool) -> bool:
        """Exit conditions of the push, drawer and knob phases."""
        s, c = self._s, self.config
        tol, step = c.position_tolerance, self._step
        if s.phase == "push":
            moved = self.scene.object_position(step.obj)[:2] - self._push_goal()
            return np.linalg.norm(moved) < c.push_tolerance
        if s.phase == "shut_over":
            if self._drawer_there():  # nothing to do
                return True
            return xy < tol and z < 2 * tol and turn < c.rotation_tolerance
        if s.phase == "handle_above":
            if self._drawer_there():  # nothing to do
                return True
            return xy < 2 * tol and z < 2 * tol and turn < c.rotation_tolerance
        if s.phase == "handle_front":
            return xy < 2 * tol and z < 2 * tol and turn < c.rotation_tolerance
        if s.phase == "handle_in":  # the approach is horizontal: blocked means by the bar
            return (xy < tol and z < tol) or (blocked and xy < 2 * tol and z < 2 * tol)
        if s.phase == "pull":  # far enough, or stopped by the slide's end, and open
            _, _, distance = self._drawer()
            done = distance < 2 * c.pull_overshoot or s.still_steps >= 3
            return done and self._drawer_there()
        if s.phase == "shut":  # far enough and closed, or stopped (shut or not)
            _, _, distance = self._drawer()
            return s.still_steps >= 3 or (distance < 2 * c.pull_overshoot and self._drawer_there())
        if s.phase == "back_off":
            return xy < 2 * tol and z < 2 * tol
        if s.phase == "twist":
            return self._knob_turn() < c.knob_overturn / 2
        return self._cavity_phase_done(xy, z, turn)

    def _hand(self, yaw: float) -> np.ndarray | None:
        """The eef rotation of a grasp at ``yaw``: ``None`` (straight down) but for a knob,
        where the hand tilts ``knob_pitch`` about the closing axis, tips towards the robot's
        base: libero_goal's stove knob is 26 cm in front of the base, where a straight-down
        hand runs the elbow (joint 4) into its limit 3 cm above the grasp."""
        if not isinstance(self._step, TurnOn):
            return None
        toward = self.scene.base_position()[:2] - self.scene.object_position(self._step.obj)[:2]
        return tilt_towards(down_rotation(yaw), toward, self.config.knob_pitch)

    def _push_goal(self) -> np.ndarray:
        """Where the pushed object's body goes ``(2,)``: the end of its path."""
        return self._s.path[-1]

    def _plan_push(self) -> np.ndarray:
        """The pushed object's path ``(M, 2)`` into its goal region (inset by its
        ``push_tolerance``) around the other objects standing as high as it (a cream cheese
        in front of the stove: a plate's flared rim rides up over it), with less clearance
        when there is no room; the straight line to the region's centre when there is none
        at all."""
        c, step = self.config, self._step
        points = self.scene.object_points(step.obj)
        position = self.scene.object_position(step.obj)[:2]
        radius = float(np.linalg.norm(points[:, :2] - position, axis=1).max())
        box = self.scene.region_box(step.target)
        inset = c.push_tolerance
        obstacles = [p[:, :2] for p in self._others(step.obj) if p[:, 2].min() < points[:, 2].max()]
        low, high = box.low[:2] + inset, box.high[:2] - inset
        # a plate's rim flares out 3 cm over its foot: it may overhang a low neighbour
        for margin in (c.push_margin, 0.0, -0.02):
            path = push_path(position, low, high, radius + margin, obstacles)
            if path is not None:
                return path
        return np.linspace(position, box.center[:2], 30)  # no room: straight, shoving

    def _push_target(self) -> np.ndarray:
        """The path point ``push_lookahead`` ahead of the pushed object (or the path's end)."""
        position = self.scene.object_position(self._step.obj)[:2]
        path = self._s.path
        nearest = int(np.argmin(np.linalg.norm(path - position, axis=1)))
        ahead = np.linalg.norm(path[nearest:] - position, axis=1) >= self.config.push_lookahead
        return path[nearest + int(np.argmax(ahead))] if ahead.any() else path[-1]

    def _waypoint_push_over(self) -> Waypoint:
        """Closed fingers above the dish's middle, high enough to pass over everything, the
        hand turned (least first, 15 degree steps) to miss the neighbours once down (a
        cabinet's handles beside the plate); plans the dish's path."""
        c = self.config
        self._s.path = self._plan_push()
        obj = self._step.obj
        points = self.scene.object_points(obj)
        centre = (points[:, :2].min(axis=0) + points[:, :2].max(axis=0)) / 2
        position, rotation = self.scene.eef_pose()
        others = self._others(obj)
        down = np.array([*centre, float(points[:, 2].max())])
        turns = np.deg2rad([0, 15, -15, 30, -30, 45, -45, 60, -60, 75, -75, 90])
        yaw = clear_yaw(
            down, yaw_of(rotation) + turns, others, self.scene.gripper_boxes(), c.grasp.margin
        )
        blocking = path_obstacle_top(position[:2], centre, others, c.path_margin)
        height = max(float(points[:, 2].max()) + c.approach_height, blocking + c.path_clearance)
        return Waypoint(
            np.array([*centre, height]), yaw_of(rotation) if yaw is None else yaw, CLOSE
        )

    def _waypoint_push_down(self) -> Waypoint:
        """Down into the dish, pressing on its floor (``push_height`` is below the bottom)."""
        points = self.scene.object_points(self._step.obj)
        height = float(points[:, 2].min()) + self.config.push_height + FINGER_TIP
        waypoint = self._s.waypoint
        return Waypoint(np.array([*waypoint.position[:2], height]), waypoint.yaw, CLOSE)

    def _waypoint_push(self) -> Waypoint:
        """The fingers ``push_contact`` from the dish's centre towards the path point ahead
        of it, plus one saturated action (re-aimed every step, anchored to the dish, so a
        turn of the path moves them across the floor to the new leading side of the rim
        instead of over it)."""
        c = self.config
        obj_xy = self.scene.object_position(self._step.obj)[:2]
        heading = self._push_target() - obj_xy
        heading = heading / max(float(np.linalg.norm(heading)), 1e-9)
        reach = min(float(np.linalg.norm(self._push_goal() - obj_xy)), c.push_speed)
        target = obj_xy + heading * (c.push_contact + reach)
        waypoint = self._s.waypoint
        return Waypoint(np.array([*target, waypoint.position[2]]), waypoint.yaw, CLOSE)

    def _drawer(self) -> tuple[np.ndarray, np.ndarray, float]:
        """``(handle points (K, 3), outward (3,), distance)`` of the step's drawer: the
        direction in which it opens and how far it must still move to the step's goal (past
        the middle of the open range, or of the close range, by ``pull_overshoot``)."""
        region = self._step.region
        joint = self.scene.region_joint(region)
        opened, closed = self.scene.open_close_qpos(region)
        sign = np.sign(opened - closed)  # the way the joint opens
        outward = self.scene.drawer_outward(region)
        handle = handle_part(self.scene.body_parts(joint.body), outward)
        if isinstance(self._step, CloseDrawer):
            remaining = sign * (joint.qpos - closed)
        else:
            remaining = sign * (opened - joint.qpos)
        return handle, outward, float(max(0.0, remaining) + self.config.pull_overshoot)

    def _drawer_there(self) -> bool:
        """Whether the step's drawer already passes LIBERO's test of its goal (open / closed)."""
        region = self._step.region
        if isinstance(self._step, CloseDrawer):
            return self.scene.is_closed(region)
        return self.scene.is_open(region)

    def _waypoint_handle_above(self) -> Waypoint:
        """The hand turned for the handle high above its front waypoint: the turned hand
        reaches about 10 cm below the site, so it is lowered only where it will stay (a
        diagonal descent sweeps it through the bowls in front of the cabinet)."""
        return self._raised(self._waypoint_handle_front())

    def _raised(self, front: Waypoint) -> Waypoint:
        """``front`` (a turned hand's waypoint) raised until the hand, turned, passes over
        everything between the eef and it."""
        c = self.config
        position, _ = self.scene.eef_pose()
        drop = -float(self._hand_corners(front.rotation)[:, 2].min())
        others = self._others("")  # every object and fixture
        blocking = path_obstacle_top(position[:2], front.position[:2], others, c.path_margin)
        height = max(front.position[2], position[2], blocking + drop + c.path_clearance)
        front.position = np.array([*front.position[:2], height])
        return front

    def _hand_corners(self, rotation: np.ndarray) -> np.ndarray:
        """Corners ``(8 * parts, 3)`` of the gripper's boxes relative to the eef, in world
        axes, with the hand at ``rotation (3, 3)``."""
        corners = [
            np.array([x, y, z])
            for low, high in self.scene.gripper_boxes()
            for x in (low[0], high[0])
            for y in (low[1], high[1])
            for z in (low[2], high[2])
        ]
        return np.array(corners) @ rotation.T

    def _waypoint_handle_front(self) -> Waypoint:
        """The hand turned for the handle (nearly horizontal), ``handle_standoff`` in front
        of the handle grip, open."""
        _, outward, _ = self._drawer()
        grip = self._waypoint_handle_in()
        grip.position = grip.position + outward * self.config.handle_standoff
        return grip

    def _waypoint_handle_in(self) -> Waypoint:
        """In to the bar, the pads over its depth (the finger tips short of the drawer front)."""
        c = self.config
        handle, outward, _ = self._drawer()
        _, rotation = self.scene.eef_pose()
        grip, turned = handle_grip(handle, outward, rotation, c.tip_clearance, c.handle_pitch)
        return Waypoint(grip, 0.0, OPEN, turned)

    def _waypoint_pull(self) -> Waypoint:
        """``pull_speed`` further along the drawer's axis (re-aimed every step, no further than
        it still has to open): the slide's damping (50 N s/m) resists a faster pull with
        more force than the fingers' friction on the bar holds."""
        _, outward, distance = self._drawer()
        position, _ = self.scene.eef_pose()
        target = position + outward * min(distance, self.config.pull_speed)
        return Waypoint(target, 0.0, CLOSE, self._s.waypoint.rotation)

    def _waypoint_shut_over(self) -> Waypoint:
        """The hand of :meth:`_waypoint_shut_down`, above it, high enough to pass over
        everything on the way."""
        c = self.config
        down = self._waypoint_shut_down()
        position, _ = self.scene.eef_pose()
        blocking = path_obstacle_top(
            position[:2], down.position[:2], self._others(""), c.path_margin
        )
        height = max(down.position[2] + c.approach_height, blocking + c.path_clearance)
        return Waypoint(np.array([*down.position[:2], height]), down.yaw, CLOSE, down.rotation)

    def _waypoint_shut_down(self) -> Waypoint:
        """Closed fingers in front of the drawer's front panel, ``shut_standoff`` off its face,
        the tips ``shut_below_top`` under its top edge and ``shut_edge_inset`` in from its end
        away from the robot, the closing axis along the panel (the least turn from the
        current yaw), the hand tilted ``shut_pitch`` with the tips towards the cabinet.
        libero_10's bottom drawer: pushed at the handle, the forearm lands on the cabinet's
        near top corner 4 cm short of shut; upright, the hand's body (20 cm along the closing
        axis) runs into the handles of the drawers above 2 to 17 mm short of shut."""
        c = self.config
        region = self._step.region
        outward = self.scene.drawer_outward(region)
        parts = self.scene.body_parts(self.scene.region_joint(region).body)
        handle = handle_part(parts, outward)
        side = np.cross([0.0, 0.0, 1.0], outward)  # horizontal, along the panel
        # the front panel: of the pieces wider than the handle's bar (not its posts), the
        # one furthest out
        wide = [p for p in parts if np.ptp(p @ side) > np.ptp(handle @ side)]
        panel = max(wide, key=lambda p: float(np.max(p @ outward)))
        away = np.sign(float((panel.mean(axis=0) - self.scene.base_position()) @ side)) or 1.0
        along = away * float((away * panel @ side).max()) - away * c.shut_edge_inset
        front = float((panel @ outward).max())
        spot = side * along + outward * (front + c.shut_standoff)  # xy in the (side, out) frame
        tips = float(panel[:, 2].max()) - c.shut_below_top
        _, rotation = self.scene.eef_pose()
        heading = float(np.arctan2(side[1], side[0]))  # the closing axis along the panel
        turns = (heading, heading - np.pi, heading + np.pi)
        yaw = wrap_angle(min(turns, key=lambda a: abs(wrap_angle(a - yaw_of(rotation)))))
        tilted = tilt_towards(down_rotation(yaw), -outward[:2], c.shut_pitch)
        return Waypoint(np.array([*spot[:2], tips + FINGER_TIP]), yaw, CLOSE, tilted)

    def _waypoint_shut(self) -> Waypoint:
        """``pull_speed`` further into the cabinet along the drawer's axis (re-aimed every
        step, no further than it still has to close): the fingers push the front panel."""
        _, outward, distance = self._drawer()
        position, _ = self.scene.eef_pose()
        target = position - outward * min(distance, self.config.pull_speed)
        return Waypoint(target, self._s.waypoint.yaw, CLOSE, self._s.waypoint.rotation)

    def _waypoint_back_off(self) -> Waypoint:
        """Away from the released handle along the drawer's axis, and up."""
        _, outward, _ = self._drawer()
        position, _ = self.scene.eef_pose()
        c = self.config
        away = position + outward * c.handle_standoff + np.array([0.0, 0.0, c.approach_height])
        return Waypoint(away, 0.0, OPEN, self._s.waypoint.rotation)

    def _knob_turn(self) -> float:
        """How far (rad, about world z) the knob must still turn: to ``knob_overturn`` past
        its on threshold."""
        obj = self._step.obj
        joint = self.scene.object_joint(obj)
        if abs(joint.axis[2]) < 0.9:
            raise UnsupportedGoalError(f"the knob of {obj!r} does not turn about the vertical")
        remaining = self.scene.turn_on_qpos(obj) + self.config.knob_overturn - joint.qpos
        return float(remaining * np.sign(joint.axis[2]))

    def _waypoint_twist(self) -> Waypoint:
        """The hand turned about the vertical by what the knob still has to turn (re-aimed
        every step: the fingers slip on the ridge, so the knob lags the hand)."""
        turn = self._knob_turn()
        c, s_ = np.cos(turn), np.sin(turn)
        about_z = np.array([[c, -s_, 0.0], [s_, c, 0.0], [0.0, 0.0, 1.0]])
        _, rotation = self.scene.eef_pose()
        waypoint = self._s.waypoint
        return Waypoint(waypoint.position, yaw_of(rotation) + turn, CLOSE, about_z @ rotation)
