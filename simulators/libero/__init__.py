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
- ``goals``, ``grasp``, ``skills``, ``skill_phases``, ``privileged``, ``planner``: a scripted planner
  (pick-and-place, push, drawer opening, knob turning) that reads the task's goal and the
  true scene state;
- ``demos``, ``demos_cli``: demonstrations recorded with that planner, and the ``demos``
  command (``embodied-rl demos``) that writes them.

Importing this package registers the simulator and the command.
"""

from simulators.libero import demos_cli  # noqa: F401  (registers the ``demos`` command)
from simulators.libero.env import LiberoConfig, LiberoObs, LiberoVectorEnv, build_libero

__all__ = ["LiberoConfig", "LiberoObs", "LiberoVectorEnv", "build_libero"]
