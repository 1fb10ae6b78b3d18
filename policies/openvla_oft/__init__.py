"""OpenVLA-OFT policy (registered as ``openvla_oft``): parallel decoding of an action chunk.

Shares the vision backbone, action tokenizer and checkpoint loading of ``policies.openvla``.
"""

from policies.openvla_oft.configuration import OpenVLAOFTConfig
from policies.openvla_oft.modeling import (
    ContinuousActionHead,
    OpenVLAOFTPolicy,
    ProprioProjector,
    build_openvla_oft,
    make_bidirectional,
)

__all__ = [
    "ContinuousActionHead",
    "OpenVLAOFTConfig",
    "OpenVLAOFTPolicy",
    "ProprioProjector",
    "build_openvla_oft",
    "make_bidirectional",
]
