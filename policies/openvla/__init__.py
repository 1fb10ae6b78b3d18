"""OpenVLA policy (registered as ``openvla``): fused DINOv2 + SigLIP, projector, Llama.

The pieces OpenVLA-OFT shares (vision backbone, action tokenizer, checkpoint loading, the
Prismatic core) live here too and are imported by ``policies.openvla_oft``.
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
from policies.openvla.vla import PrismaticVLA, PromptEncoder

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
