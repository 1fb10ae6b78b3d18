"""Simulators (LIBERO, a fast MuJoCo task) and parallel simulator workers.

Importing this package registers every simulator in ``embodied_rl.registry.SIMULATORS``;
``SIMULATORS.get(name)(options, num_envs, processes=P)`` builds one in this process (0) or in
``P`` simulator processes (:class:`ProcessVectorEnv`).
"""

import embodied_rl  # noqa: F401  (first: installs the torchvision fix, also in spawned children)

# isort: split
from simulators import libero, reach  # noqa: F401  (registrations)
from simulators.base import EnvSpec, Obs, StepResult, VectorEnv
from simulators.checker import check_vector_env
from simulators.registry import Simulator, register_simulator
from simulators.workers import ProcessVectorEnv

__all__ = [
    "EnvSpec",
    "Obs",
    "ProcessVectorEnv",
    "Simulator",
    "StepResult",
    "VectorEnv",
    "check_vector_env",
    "register_simulator",
]
