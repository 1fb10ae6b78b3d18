"""MLP policy (Gaussian or discrete-bin head), registered as policy ``mlp``."""

from policies.mlp.configuration import MLPPolicyConfig
from policies.mlp.modeling import MLPPolicy, build_mlp_policy

__all__ = ["MLPPolicy", "MLPPolicyConfig", "build_mlp_policy"]
