"""embodied_rl: multi-controller distributed RL for robot VLA policies and LLMs."""

from embodied_rl._startup import is_console_script, quiet_interrupts_while_starting

if is_console_script():  # before the imports below (torch: a second or more)
    quiet_interrupts_while_starting()

# isort: split
from embodied_rl._compat import ensure_torchvision_ops

ensure_torchvision_ops()

__version__ = "0.1.0"
