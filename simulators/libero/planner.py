"""A scripted planner for LIBERO, closed-loop on privileged simulator state.

For each step of a task's goal (:mod:`simulators.libero.goals`) the planner drives the end
effector (eef) through a fixed sequence of phases
(:data:`~simulators.libero.planner_config.PHASES`), each towards a waypoint:

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

The phases' waypoints come from mixins: pick-and-place (grasps, carrying, placing) from
:mod:`simulators.libero.pick_place_phases`, pushes, drawers and knobs from
:mod:`simulators.libero.skill_phases`, cavities and doors from
:mod:`simulators.libero.cavity_phases`; this module is the phase machine that runs them (when a
phase ends, what comes next, retries and failures) and the control. Its settings are
:class:`~simulators.libero.planner_config.PlannerConfig`, its progress
:class:`~simulators.libero.planner_state.PlannerState`.
"""

from __future__ import annotations

import numpy as np

from simulators.libero.cavity_phases import CavityPhases
from simulators.libero.goals import ClearOf, Step, UnsupportedGoalError
from simulators.libero.grasp import yaw_of
from simulators.libero.pick_place_phases import PickPlacePhases
from simulators.libero.planner_config import LIVE_PHASES, PHASES, PlannerConfig
from simulators.libero.planner_state import PlannerState, rotation_error, waypoint_errors
from simulators.libero.privileged import PrivilegedScene
from simulators.libero.skill_phases import OPEN, SkillPhases, Waypoint


class ScriptedPlanner(PickPlacePhases, SkillPhases, CavityPhases):
    """Waypoint skills through a sequence of goal steps
    (:data:`~simulators.libero.planner_config.PHASES`).

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
        self._s = PlannerState()
        self.reset()

    def reset(self) -> None:
        """Start from the first step (call after every env reset and ``scene.refresh()``);
        first ``wait`` while an object is thrown about (an init state of libero_10's living room
        throws the milk, the ketchup and the orange juice 45 cm up when it is set: planned
        from where they fly, grasps and heights would be wrong)."""
        self._s = PlannerState()
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
        position, _ = self.scene.eef_pose()
        self._s.measure(position, self.scene.finger_opening())

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
        """``(xy distance, |z error|, |yaw error|)`` of the eef to the current waypoint."""
        position, rotation = self.scene.eef_pose()
        return waypoint_errors(self._s.waypoint, position, rotation)

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

    def _stay(self, gripper: float) -> Waypoint:
        """The current waypoint's pose with another gripper command (close, grip, release)."""
        waypoint = self._s.waypoint
        return Waypoint(waypoint.position.copy(), waypoint.yaw, gripper, waypoint.rotation)

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
