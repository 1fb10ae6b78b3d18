"""Simulators (LIBERO, a fast MuJoCo task) and parallel simulator workers.

Importing this package registers every simulator in ``embodied_rl.registry.SIMULATORS``.
"""

import embodied_rl  # noqa: F401  (first: installs the torchvision fix, also in spawned children)

# isort: split
from simulators import libero, libero_demos_cli, reach, workers  # noqa: F401  (registrations)
from simulators.base import EnvSpec, Obs, StepResult, VectorEnv, check_vector_env
from simulators.workers import ProcessVectorEnv, make_vector_env

__all__ = [
    "EnvSpec",
    "Obs",
    "ProcessVectorEnv",
    "StepResult",
    "VectorEnv",
    "check_vector_env",
    "make_vector_env",
]
