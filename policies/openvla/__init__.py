"""OpenVLA policy (registered as ``openvla``): fused DINOv2 + SigLIP, projector, Llama.

The pieces OpenVLA-OFT shares live here too and are imported by ``policies.openvla_oft``:
the vision backbone (``vision.py``), the action tokenizer, checkpoint loading
(``loading.py``), the prompt (``prompt.py``), the Prismatic module (``prismatic.py``), action
sampling (``sampling.py``), the policy base class (``policy_base.py``) and the builder from a
preset or a checkpoint (``builders.py``).
"""

from policies.openvla.action_tokenizer import ActionTokenizer
from policies.openvla.configuration import (
    TINY_ARCHITECTURE,
    OpenVLAConfig,
    VLAArchitecture,
    VLAOptions,
)
from policies.openvla.loading import read_checkpoint, save_checkpoint
from policies.openvla.modeling import OpenVLAPolicy, build_openvla
from policies.openvla.prismatic import PrismaticVLA
from policies.openvla.prompt import PromptEncoder

__all__ = [
    "TINY_ARCHITECTURE",
    "ActionTokenizer",
    "OpenVLAConfig",
    "OpenVLAPolicy",
    "PrismaticVLA",
    "PromptEncoder",
    "VLAArchitecture",
    "VLAOptions",
    "build_openvla",
    "read_checkpoint",
    "save_checkpoint",
]
