"""What the scripted planner tracks from one env step to the next.

:class:`PlannerState` is its progress through a goal (step, phase, grasp attempts, the
current :class:`~simulators.libero.skill_phases.Waypoint`) with the motion counters its phase
exit tests read, updated once per env step by :meth:`PlannerState.measure`;
:func:`waypoint_errors` is how far the eef is from the waypoint, with the rotation math
(:func:`rotation_error`) that the planner's control shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from simulators.libero.grasp import Grasp, wrap_angle, yaw_of
from simulators.libero.skill_phases import Waypoint

STILL = 5e-4  # metres: the eef or the fingers moving less than this in a step count as still


@dataclass
class PlannerState:
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

    def measure(self, position: np.ndarray, opening: float) -> None:
        """Update the motion and gripper counters from this env step's eef position ``(3,)``
        and finger opening (m)."""
        moved = (
            np.inf if self.last_position is None else np.linalg.norm(position - self.last_position)
        )
        self.still_steps = self.still_steps + 1 if moved < STILL else 0
        self.last_position = position
        settled = self.last_opening is not None and abs(opening - self.last_opening) < STILL
        self.gripper_settled = settled
        self.last_opening = opening


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


def waypoint_errors(
    waypoint: Waypoint, position: np.ndarray, rotation: np.ndarray
) -> tuple[float, float, float]:
    """``(xy distance, |z error|, |yaw error|)`` of the eef at ``position`` ``(3,)`` with
    ``rotation`` ``(3, 3)`` to ``waypoint`` (for a full-rotation waypoint the angle of the
    whole rotation error instead of the yaw's)."""
    error = waypoint.position - position
    if waypoint.rotation is None:
        turn = abs(wrap_angle(waypoint.yaw - yaw_of(rotation)))
    else:
        turn = float(np.linalg.norm(rotation_error(waypoint.rotation, rotation)))
    return float(np.linalg.norm(error[:2])), float(abs(error[2])), turn
