"""A scripted pick-and-place planner for LIBERO, closed-loop on privileged simulator state.

For each :class:`~simulators.libero.goals.PickPlace` step of a task's goal, the planner
drives the end effector (eef) through waypoints: above the object, down to the grasp, close
the gripper, lift, over the target, down, open, back up. Every waypoint is computed from the
scene (:class:`~simulators.libero.privileged.PrivilegedScene`) when its phase starts, so a nudged object or
a slipped grasp is seen; a grasp that does not hold when lifting is retried.

Actions are in the policies' convention (:data:`simulators.libero.suites.ACTION_DIM`):
``[dx, dy, dz, drx, dry, drz, gripper]`` in ``[-1, 1]``, the first six scaled by OSC_POSE to
metres / radians (0.05 m, 0.5 rad per unit by default), world frame, rotations as axis-angle;
gripper -1 opens, +1 closes. Control is proportional: ``action = gain * error / scale``,
clipped. With gain 1 the controller's goal is exactly the waypoint whenever the error is
within one action's reach, and OSC's critically damped impedance brings the eef there
without overshoot; further away the action saturates (about 1.2 cm per step).

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

from simulators.libero.goals import PickPlace, UnsupportedGoalError
from simulators.libero.grasp import (
    Grasp,
    GraspLimits,
    down_rotation,
    path_obstacle_top,
    plan_grasp,
    wrap_angle,
    yaw_of,
)
from simulators.libero.privileged import PrivilegedScene

OPEN, CLOSE = -1.0, 1.0


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
        max_attempts: grasp attempts per object before giving up.
        phase_steps: a phase that has not reached its waypoint after this many steps ends
            the episode as a planner failure.
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
    max_attempts: int = 2
    phase_steps: int = 80


@dataclass
class Waypoint:
    """Target of a phase: eef position ``(3,)``, yaw, gripper command."""

    position: np.ndarray
    yaw: float
    gripper: float


@dataclass
class _State:
    """Mutable progress through the goal (reset for every episode)."""

    step: int = 0  # index into the PickPlace steps
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


class PickPlacePlanner:
    """Waypoint pick-and-place through a sequence of :class:`PickPlace` steps.

    Call :meth:`act` once per env step with the scene in its current state; it returns the
    next ``(7,)`` action. :attr:`failure` is set (and :meth:`act` keeps returning a still,
    open-gripper action) when the planner gives up.

    Args:
        scene: the privileged view of the env.
        steps: what to pick and where to place it, in order.
        config: gains and clearances.
    """

    def __init__(
        self,
        scene: PrivilegedScene,
        steps: tuple[PickPlace, ...],
        config: PlannerConfig | None = None,
    ) -> None:
        if not steps:
            raise UnsupportedGoalError("the goal has no pick-and-place step")
        self.scene = scene
        self.steps = steps
        self.config = config or PlannerConfig()
        self._s = _State()
        self.reset()

    def reset(self) -> None:
        """Start from the first step (call after every env reset and ``scene.refresh()``)."""
        self._s = _State()
        self._enter("approach")

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
            return self._control(Waypoint(position, s.waypoint.yaw, OPEN))
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
        turn = c.rotation_gain * rotation_error(down_rotation(waypoint.yaw), rotation)
        turn = turn / rotation_scale
        action = np.concatenate([move, turn, [waypoint.gripper]])
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    def _errors(self) -> tuple[float, float, float]:
        """``(xy distance, |z error|, |yaw error|)`` of the eef to the current waypoint."""
        position, rotation = self.scene.eef_pose()
        error = self._s.waypoint.position - position
        yaw_error = abs(wrap_angle(self._s.waypoint.yaw - yaw_of(rotation)))
        return float(np.linalg.norm(error[:2])), float(abs(error[2])), yaw_error

    # --- phases -------------------------------------------------------------------------------
    def _phase_done(self) -> bool:
        """Whether the current phase's exit condition holds (reads the scene)."""
        s, c = self._s, self.config
        xy, z, yaw = self._errors()
        reached = xy < c.position_tolerance and z < c.position_tolerance and yaw < c.yaw_tolerance
        if s.phase == "approach":
            return (
                xy < c.position_tolerance and z < 2 * c.position_tolerance and yaw < c.yaw_tolerance
            )
        if s.phase == "carry":  # a held load can stop the arm short: near and still is enough
            stalled = s.still_steps >= 3 and xy < 3 * c.position_tolerance
            return (xy < c.position_tolerance or stalled) and z < 3 * c.position_tolerance
        if s.phase in ("descend", "lower"):
            # blocked by contact (the object or the surface) counts as arrived
            blocked = s.still_steps >= 2 and s.phase_steps >= 4 and z < 3 * c.position_tolerance
            return reached or (blocked and xy < 2 * c.position_tolerance)
        if s.phase in ("close", "release"):
            low, high = c.close_steps if s.phase == "close" else c.release_steps
            return s.phase_steps >= high or (s.phase_steps >= low and s.gripper_settled)
        if s.phase in ("lift", "retreat", "reopen"):  # vertical moves: the height matters
            return z < 2 * c.position_tolerance
        raise AssertionError(f"unknown phase {s.phase}")

    def _advance(self) -> None:
        """Leave the current phase for the next one (or retry / finish)."""
        s = self._s
        order = ("approach", "descend", "close", "lift", "carry", "lower", "release", "retreat")
        if s.phase == "lift" and not self.scene.is_grasping(self.steps[s.step].obj):
            if s.attempts >= self.config.max_attempts:
                s.failure = f"grasp of {self.steps[s.step].obj!r} failed {s.attempts} times"
                return
            s.attempts += 1
            self._enter("reopen")
            return
        if s.phase == "reopen":
            self._enter("approach")
            return
        if s.phase == "retreat":
            if s.step + 1 >= len(self.steps):
                s.failure = "all steps done but the task's success test does not hold"
                return
            s.step, s.attempts = s.step + 1, 1
            self._enter("approach")
            return
        self._enter(order[order.index(s.phase) + 1])

    def _enter(self, phase: str) -> None:
        """Start ``phase``: compute its waypoint from the scene as it is now."""
        s = self._s
        s.phase, s.phase_steps, s.still_steps, s.gripper_settled = phase, 0, 0, False
        s.history.append(f"{phase}@{len(s.history)}")
        s.waypoint = getattr(self, f"_waypoint_{phase}")()

    def _waypoint_approach(self) -> Waypoint:
        s, c = self._s, self.config
        position, rotation = self.scene.eef_pose()
        obj = self.steps[s.step].obj
        s.grasp = self._plan_grasp(obj, yaw_of(rotation), position[:2])
        s.grasped_from = self.scene.object_position(obj)
        target = s.grasp.position[:2]
        blocking = path_obstacle_top(position[:2], target, self._others(obj), c.path_margin)
        height = max(s.grasp.top + c.approach_height, blocking + c.path_clearance)
        return Waypoint(np.array([*target, height]), s.grasp.yaw, OPEN)

    def _waypoint_descend(self) -> Waypoint:
        """The approach's grasp, moved as far as the object has moved since (xy)."""
        s = self._s
        moved = self.scene.object_position(self.steps[s.step].obj) - s.grasped_from
        position = s.grasp.position + np.array([moved[0], moved[1], 0.0])
        return Waypoint(position, s.grasp.yaw, OPEN)

    def _waypoint_close(self) -> Waypoint:
        return Waypoint(self._s.waypoint.position.copy(), self._s.waypoint.yaw, CLOSE)

    def _waypoint_lift(self) -> Waypoint:
        """Straight up to the carry height, and at least ``approach_height`` off the support."""
        position, _ = self.scene.eef_pose()
        height = max(
            self._carry_height(self._place_target_xy()), position[2] + self.config.approach_height
        )
        return Waypoint(np.array([*position[:2], height]), self._s.waypoint.yaw, CLOSE)

    def _waypoint_carry(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        target = self._place_target_xy()
        height = max(position[2], self._carry_height(target))
        return Waypoint(np.array([*target, height]), self._s.waypoint.yaw, CLOSE)

    def _waypoint_lower(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        target = self._place_target_xy()
        return Waypoint(np.array([*target, self._place_height()]), self._s.waypoint.yaw, CLOSE)

    def _waypoint_release(self) -> Waypoint:
        return Waypoint(self._s.waypoint.position.copy(), self._s.waypoint.yaw, OPEN)

    def _waypoint_retreat(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        up = position + np.array([0.0, 0.0, self.config.approach_height])
        return Waypoint(up, self._s.waypoint.yaw, OPEN)

    def _waypoint_reopen(self) -> Waypoint:
        position, _ = self.scene.eef_pose()
        up = position + np.array([0.0, 0.0, self.config.approach_height])
        return Waypoint(up, self._s.waypoint.yaw, OPEN)

    def _others(self, obj: str) -> list[np.ndarray]:
        """World points of every movable object but ``obj`` (the obstacles)."""
        names = self.scene.movable_objects() + self.scene.fixtures()
        return [part for n in names if n != obj for part in self.scene.object_parts(n)]

    def _plan_grasp(self, obj: str, yaw: float, eef_xy: np.ndarray) -> Grasp:
        """A grasp of ``obj`` from the scene now, preferring ``yaw`` and sides near ``eef_xy``."""
        try:
            return plan_grasp(
                self.scene.object_points(obj),
                self._others(obj),
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
        if scene.is_site(step.target):
            box = scene.region_box(step.target)
            surface = box.low[2] + 0.01 if step.relation == "in" else box.high[2]
            return box.center[:2], float(surface)
        if step.relation == "in":
            raise UnsupportedGoalError(f"(In {step.obj} {step.target}): target is not a region")
        top = float(scene.object_points(step.target)[:, 2].max())
        return scene.object_position(step.target)[:2], top

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
