"""embodied_rl: multi-controller distributed RL for robot VLA policies and LLMs."""

from embodied_rl._compat import ensure_torchvision_ops

ensure_torchvision_ops()

__version__ = "0.1.0"
