"""The physics substeps between two policy steps, computed as robosuite computes them, minus
its per-call Python.

An env step is 25 physics substeps. On each of them robosuite runs the arm's controller and the
gripper through several layers of Python: name-to-id lookups, properties that rebuild the same
index lists, four Jacobian queries where two give the same numbers, and an ``update`` of each of
the env's ~37 observables, which on 23 of the 25 substeps only adds the model timestep to its
timer. Without it the physics of an env chunk (8 env steps) costs 0.77-0.88 of what it did
(docs/benchmarks/libero_step_parts.md). Here:

- :class:`ArmSubsteps` computes what robosuite's ``SingleArm.control(action,
  policy_step=False)`` computes for an operational-space (``OSC_POSE``) arm with a Panda
  gripper (LIBERO's robot): the controller's state update, its torques (robosuite's own jitted
  kernels for the orientation error, the operational-space matrices and the nullspace torques,
  and the same NumPy operations in the same order for the rest), the torque clip, the
  gripper's ramped command, the actuator controls; and it leaves the controller, robot and
  gripper attributes as robosuite would. The policy step itself (the goal from the action, the
  robot's history buffers) stays robosuite's.
- :class:`ObservableClock` advances one copy of the observables' shared timer per substep and
  hands a substep to robosuite's ``_update_observables`` only when an observable samples or
  its period ends (then robosuite does everything: the sensor, the corrupter that records the
  observed state, the timer's wrap). Valid when every enabled observable has the same sampling
  period, no delay and the same timer, which is LIBERO's configuration (checked every step).

Anything else (another controller, an interpolator, variable impedance, another gripper,
several robots, delayed observables) is not recognised, and the step runs robosuite's Python
for every substep. Every ``mjData`` array, observation and robot buffer is bit for bit what
robosuite's step gives (``tests/simulators/test_libero_scene.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np


class ArmSubsteps:
    """robosuite's control of one OSC arm with a Panda gripper, for the non-policy substeps.

    Made for one env step (:meth:`of`): the controller's goal, gains and nullspace posture are
    read from the controller at every substep; the indices and limits it caches do not change
    within a step.

    Args:
        env: the robosuite env (one robot, checked by :meth:`of`).
    """

    def __init__(self, env: Any) -> None:
        robot = env.robots[0]
        controller = robot.controller
        self._robot, self._controller, self._gripper = robot, controller, robot.gripper
        self._model, self._data = env.sim.model._model, env.sim.data._data
        self._site = env.sim.model.site_name2id(controller.eef_name)
        # Robosuite's index lists: fancy indexing with them gives its arrays' memory layouts
        # (the rows of J and M come out Fortran-ordered), and the jitted kernels' float results
        # depend on the layouts they were compiled for. The 1-D reads take a slice where the
        # joints are consecutive (the same numbers, without converting a list on every call).
        self._qvel_list = controller.qvel_index
        self._qpos_index = _as_slice(controller.qpos_index)
        self._qvel_index = _as_slice(controller.qvel_index)
        self._arm_actuators = robot._ref_joint_actuator_indexes
        ctrlrange = self._model.actuator_ctrlrange
        self._torque_low = ctrlrange[self._arm_actuators, 0]
        self._torque_high = ctrlrange[self._arm_actuators, 1]
        self._gripper_actuators = [
            env.sim.model.actuator_name2id(name) for name in robot.gripper.actuators
        ]
        gripper_range = ctrlrange[self._gripper_actuators]
        # robosuite's rescaling of the normalised gripper command to the control range.
        self._gripper_bias = 0.5 * (gripper_range[:, 1] + gripper_range[:, 0])
        self._gripper_weight = 0.5 * (gripper_range[:, 1] - gripper_range[:, 0])
        self._gripper_speed = robot.gripper.speed
        self._control_dim = controller.control_dim
        self._orientation_error, self._opspace_matrices, self._nullspace_torques = _osc_kernels()
        # Views of the MuJoCo arrays read every substep (MjData's buffers do not move), and
        # the scratch arrays MuJoCo fills whole: attribute lookups and allocations per step,
        # not per substep.
        data = self._data
        self._qpos, self._qvel, self._ctrl = data.qpos, data.qvel, data.ctrl
        self._qfrc_bias = data.qfrc_bias
        self._ee_xpos, self._ee_xmat = data.site_xpos[self._site], data.site_xmat[self._site]
        nv = self._model.nv
        self._jacp, self._jacr = np.zeros((3, nv)), np.zeros((3, nv))
        self._full_mass = np.ndarray(shape=(nv, nv), dtype=np.float64, order="C")

    @classmethod
    def of(cls, env: Any) -> ArmSubsteps | None:
        """The lean control of ``env``'s arm, or None when its setup is not the one replicated."""
        return cls(env) if _is_replicated_arm(env) else None

    def control(self, action: Sequence[float]) -> None:
        """What ``robot.control(action, policy_step=False)`` does, on the current MuJoCo state.

        Args:
            action: ``(7,)`` the env step's action (the goal was set from it on the policy step).
        """
        torques = self._osc_torques()
        robot = self._robot
        robot.torques = np.clip(torques, self._torque_low, self._torque_high)
        self._grip(action[self._control_dim :])
        self._ctrl[self._arm_actuators] = robot.torques

    def _osc_torques(self) -> np.ndarray:
        """The controller's ``update`` and ``run_controller`` (fixed impedance, no interpolator).

        Returns:
            ``(7,)`` joint torques before the clip; the controller's attributes as robosuite's
            calls leave them.
        """
        c, qvel, qvel_list = self._controller, self._qvel, self._qvel_list
        # update(): robosuite queries the site Jacobian twice per row (for the velocity and for
        # J); MuJoCo computes each row alike with or without the other, so one query serves.
        # It writes every entry of both (the dofs off the arm's chain as zeros).
        jacp, jacr = self._jacp, self._jacr
        mujoco.mj_jacSite(self._model, self._data, jacp, jacr, self._site)
        c.ee_pos = np.array(self._ee_xpos)
        c.ee_ori_mat = np.array(self._ee_xmat.reshape([3, 3]))
        c.ee_pos_vel = np.array(np.dot(jacp, qvel))
        c.ee_ori_vel = np.array(np.dot(jacr, qvel))
        c.joint_pos = np.array(self._qpos[self._qpos_index])
        c.joint_vel = np.array(qvel[self._qvel_index])
        c.J_pos = np.array(jacp.reshape((3, -1))[:, qvel_list])
        c.J_ori = np.array(jacr.reshape((3, -1))[:, qvel_list])
        c.J_full = np.array(np.vstack([c.J_pos, c.J_ori]))
        mass_matrix = self._full_mass  # every entry written: a copy of qM's, no arithmetic
        mujoco.mj_fullM(self._model, self._data, mass_matrix)
        c.mass_matrix = mass_matrix[qvel_list, :][:, qvel_list]

        # run_controller(), term by term in robosuite's order (the float results depend on it).
        ori_error = self._orientation_error(np.array(c.goal_ori), c.ee_ori_mat)
        position_error = np.array(c.goal_pos) - c.ee_pos
        desired_force = np.multiply(np.array(position_error), np.array(c.kp[0:3])) + np.multiply(
            -c.ee_pos_vel, c.kd[0:3]
        )
        desired_torque = np.multiply(np.array(ori_error), np.array(c.kp[3:6])) + np.multiply(
            -c.ee_ori_vel, c.kd[3:6]
        )
        lambda_full, lambda_pos, lambda_ori, nullspace_matrix = self._opspace_matrices(
            c.mass_matrix, c.J_full, c.J_pos, c.J_ori
        )
        if c.uncoupling:
            wrench = np.concatenate(
                [np.dot(lambda_pos, desired_force), np.dot(lambda_ori, desired_torque)]
            )
        else:
            wrench = np.dot(lambda_full, np.concatenate([desired_force, desired_torque]))
        c.torques = np.dot(c.J_full.T, wrench) + self._qfrc_bias[self._qvel_index]
        c.torques += self._nullspace_torques(
            c.mass_matrix, nullspace_matrix, c.initial_joint, c.joint_pos, c.joint_vel
        )
        c.new_update = True  # the base class's run_controller: the next update recomputes
        return c.torques

    def _grip(self, gripper_action: Sequence[float]) -> None:
        """The Panda gripper's command ramp (``format_action``) and its actuator controls."""
        gripper = self._gripper
        gripper.current_action = np.clip(
            gripper.current_action
            + np.array([-1.0, 1.0]) * self._gripper_speed * np.sign(gripper_action),
            -1.0,
            1.0,
        )
        self._ctrl[self._gripper_actuators] = (
            self._gripper_bias + self._gripper_weight * gripper.current_action
        )


def _as_slice(indices: Sequence[int]) -> slice | list[int]:
    """``indices`` as a slice where they are consecutive (the arm's joints are): indexing copies
    the same numbers, without NumPy converting a list on every call."""
    indices = list(indices)
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return slice(indices[0], indices[0] + len(indices))
    return indices


def _osc_kernels() -> tuple:
    """robosuite's jitted OSC kernels, the very functions its controller calls."""
    from robosuite.controllers import osc

    return osc.orientation_error, osc.opspace_matrices, osc.nullspace_torques


def _is_replicated_arm(env: Any) -> bool:
    """Whether ``env`` has the one robot setup :class:`ArmSubsteps` replicates."""
    from robosuite.controllers.osc import OperationalSpaceController
    from robosuite.models.grippers.panda_gripper import PandaGripper
    from robosuite.robots.single_arm import SingleArm

    if len(env.robots) != 1:
        return False
    robot = env.robots[0]
    controller = getattr(robot, "controller", None)
    return (
        type(robot).control is SingleArm.control
        and type(controller) is OperationalSpaceController
        and controller.impedance_mode == "fixed"
        and controller.use_delta
        and controller.interpolator_pos is None
        and controller.interpolator_ori is None
        and robot.has_gripper
        and type(robot.gripper).format_action is PandaGripper.format_action
    )


class ObservableClock:
    """The enabled observables' shared sampling timer, advanced once per substep for all.

    robosuite's ``Observable.update`` adds the model timestep to the observable's timer, samples
    when it has not sampled yet this period (with no delay: on the period's first substep), and
    wraps the timer when it reaches the period. Between those two substeps an update changes
    nothing but the timer. The clock repeats that addition on one copy; on a substep where a
    sample or a wrap is due it writes the copy back and lets robosuite update every observable.

    Args:
        env: the robosuite env (observables checked by :meth:`of`).
        observables: its enabled observables.
    """

    def __init__(self, env: Any, observables: list) -> None:
        self._env, self._observables = env, observables
        first = observables[0]
        self._timestep = env.model_timestep
        self._period = first._sampling_timestep
        self._time, self._sampled = first._time_since_last_sample, first._sampled
        self._written = True  # the observables hold the copy's values

    @classmethod
    def of(cls, env: Any) -> ObservableClock | None:
        """The clock of ``env``'s enabled observables, or None when they do not share one."""
        from robosuite.utils.observables import NO_DELAY

        observables = [o for o in env._observables.values() if o._enabled]
        if not observables:
            return None
        first = observables[0]
        shared = (first._sampling_timestep, first._time_since_last_sample, first._sampled)
        for observable in observables:
            if (
                observable._delayer is not NO_DELAY
                or observable._current_delay != 0.0
                or (
                    observable._sampling_timestep,
                    observable._time_since_last_sample,
                    observable._sampled,
                )
                != shared
            ):
                return None
        return cls(env, observables)

    def advance(self) -> None:
        """One substep of every observable's ``update``."""
        before = self._time
        self._time = before + self._timestep  # robosuite's `+=`: the same float
        sample_due = not self._sampled and self._period >= self._time  # (delay 0.0)
        if sample_due or self._time >= self._period:
            self._write(before)
            self._env._update_observables()
            first = self._observables[0]
            self._time, self._sampled = first._time_since_last_sample, first._sampled
            self._written = True
        else:
            self._written = False

    def write_back(self) -> None:
        """Give every observable the copy's timer (call at the end of the env step)."""
        if not self._written:
            self._write(self._time)
            self._written = True

    def _write(self, time: float) -> None:
        for observable in self._observables:
            observable._time_since_last_sample = time
            observable._sampled = self._sampled
