"""The ``libero`` simulator: the LIBERO benchmark (robosuite/MuJoCo) as a vector env.

Modules:

- ``env``: :class:`LiberoVectorEnv` and its options (:class:`LiberoConfig`), registered as
  simulator ``libero``;
- ``scene``, ``render``: a task's built scene with exact soft resets, and the GL renderer
  its scenes share;
- ``lean_substeps``: the physics substeps between policy steps without robosuite's per-call
  Python (bit for bit robosuite's numbers);
- ``suites``: LIBERO's import, suites and the OpenVLA conventions (actions, proprio, image
  flip);
- ``goals``, ``grasp``, ``skills``, ``privileged``: a task's goal as skill steps, top-down
  grasps, the skills' geometry, and the true scene state a scripted planner reads;
- ``progress``: privileged task progress (a number in ``[0, 1]`` per env that follows the
  goal, read from that true state; for logging and oracle rewards, never a policy input);
- ``planner``, ``planner_config``, ``planner_state``: that planner (pick-and-place, push,
  drawer opening and closing, knob turning, a mug into a microwave and its door shut): its
  phase machine and control, its settings and the phases of each kind of step, and its
  progress and errors to the waypoint, step by step;
- ``pick_place_phases``, ``skill_phases``, ``cavity_phases``: the planner's phases, their
  waypoints and exit tests (pick-and-place; push, drawers, knobs; the microwave);
- ``demos``, ``demos_cli``, ``commands``: demonstrations recorded with that planner, the
  ``demos`` command (``embodied-rl demos``) that writes them, and its options, registered in
  ``embodied_rl.registry.COMMANDS`` without importing the rest.

Importing this package registers the simulator and the command.
"""

from simulators.libero import commands  # noqa: F401  (registers the ``demos`` command)
from simulators.libero.env import LiberoConfig, LiberoVectorEnv, build_libero

__all__ = ["LiberoConfig", "LiberoVectorEnv", "build_libero"]
