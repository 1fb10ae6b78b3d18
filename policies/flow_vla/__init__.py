"""Flow-matching VLA policy (the pi0 family, CPU-sized), registered as policy ``flow_vla``."""

from policies.flow_vla.configuration import FlowVLAConfig
from policies.flow_vla.modeling import FlowVLAPolicy, build_flow_vla_policy

__all__ = ["FlowVLAConfig", "FlowVLAPolicy", "build_flow_vla_policy"]
