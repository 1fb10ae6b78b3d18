"""The planner's pick-and-place phases: grasp, lift, carry, place, and clearing a drawer's way.

:class:`PickPlacePhases` is a mixin of :class:`~simulators.libero.planner.ScriptedPlanner`,
like :class:`~simulators.libero.skill_phases.SkillPhases`: its ``_waypoint_<phase>`` methods
compute the waypoints of the pick-and-place phases (``approach``, ``descend``, ``close``,
``lift``, ``carry``, ``lower``, ``release``, ``retreat``; ``reopen`` after a grasp that does
not hold), which a :class:`~simulators.libero.goals.ClearOf` step runs too and a
:class:`~simulators.libero.goals.TurnOn` step grasps and lets go of its knob with. They use
the host's ``scene``, ``config`` (a :class:`~simulators.libero.planner_config.PlannerConfig`),
``_s`` (a :class:`~simulators.libero.planner_state.PlannerState`), ``_step``, ``_stay`` and
``_others``, and :class:`~simulators.libero.skill_phases.SkillPhases`'s ``_hand``.

Grasps are top-down with the fingers vertical (:mod:`simulators.libero.grasp`): across the
object's narrowest horizontal width (a box across its short side; round objects keep the
current yaw), turned away from neighbours the hand would hit, ``grasp_depth`` below the
object's top. Moves at height (approach, carry) rise above every object near the path. The
held object is placed by its body position, which is what LIBERO's goal tests check.

An object wider than the narrow side of the region it goes ``in`` (libero_10's book and the
caddy's compartment) is turned while carried, its thinnest side across the region, and its
shape rather than its body origin is centred in the region.
"""

from __future__ import annotations

import numpy as np

from simulators.libero.goals import (
    ClearOf,
    PickPlace,
    TurnOn,
    UnsupportedGoalError,
    is_drawer_region,
)
from simulators.libero.grasp import (
    Grasp,
    finger_width,
    path_obstacle_top,
    plan_grasp,
    wrap_angle,
    yaw_of,
)
from simulators.libero.privileged import RegionBox
from simulators.libero.skill_phases import CLOSE, OPEN, Waypoint
from simulators.libero.skills import clear_move, knob_grip_points, shift_clear, slot_offset


class PickPlacePhases:
    """Waypoints of the pick-and-place phases and the grasp and place goals they aim at; a
    mixin of the scripted planner."""

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
