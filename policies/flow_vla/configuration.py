"""Options of the flow-matching VLA policy (``policy: flow_vla``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied_rl.checks import check_range
from policies.flow_vla.denoising import LOGPROB_METHODS
from policies.normalization import GRIPPER_CONVENTIONS
from policies.options import PolicyOptions


@dataclass
class FlowVLAConfig(PolicyOptions):
    """Flow-matching VLA options.

    Attributes:
        state_dim: size of the proprio vector (0: none).
        image_size: side of the square RGB image (a multiple of 8).
        action_dim: A; chunk: C actions per observation (``C * A`` values denoised at once).
        prefix_hidden: widths of the prefix MLP over image, proprio and instruction features;
            its output is the one prefix token the action expert attends to.
        instruction_buckets / instruction_dim: the hashed bag-of-words instruction embedding
            (0 buckets: no instruction), as the mlp policy's.
        expert_width / expert_layers / expert_heads: the action-expert transformer over the
            prefix token and the C noisy action tokens (each with the flow time added).
        denoise_steps: S, Euler steps from noise to actions (a chain has S Gaussian steps).
        logprob_method: ``sde`` (Flow-SDE) or ``noise_net`` (Flow-Noise), see denoising.py.
        noise_level: Flow-SDE's ``a`` in ``sigma_t = a sqrt(t / (1 - t))``.
        noise_log_std_range: bounds of the noise network's log standard deviation.
        value_head: a critic on the prefix features (PPO).
        seed: weight-init seed (every rank builds the same weights).
        gripper_convention: ``none`` or ``libero`` (``policies/normalization.py``).
    """

    state_dim: int = 8
    image_size: int = 64
    action_dim: int = 7
    chunk: int = 8
    prefix_hidden: list[int] = field(default_factory=lambda: [256])
    instruction_buckets: int = 256
    instruction_dim: int = 32
    expert_width: int = 64
    expert_layers: int = 2
    expert_heads: int = 4
    denoise_steps: int = 4
    logprob_method: str = "sde"
    noise_level: float = 0.5
    noise_log_std_range: list[float] = field(default_factory=lambda: [-4.0, -1.0])
    value_head: bool = False
    seed: int = 0
    gripper_convention: str = "libero"

    policy_name = "flow_vla"  # class attribute: used in messages
    # Options that do not change what the weights mean: an ``init_from`` checkpoint may
    # differ in them (the step count and noise only change how the chain is sampled).
    RUNTIME_OPTIONS = frozenset({"seed", "denoise_steps", "noise_level"})

    def __post_init__(self) -> None:
        check_range("flow_vla seed", self.seed, 0)
        check_range("flow_vla state_dim", self.state_dim, 0, note=" (0: none)")
        if self.state_dim <= 0 and self.image_size <= 0:
            raise ValueError("flow_vla needs an input: set state_dim > 0 or image_size > 0")
        if self.image_size % 8:
            raise ValueError(f"flow_vla image_size must be a multiple of 8, got {self.image_size}")
        for name in ("action_dim", "chunk", "expert_width", "expert_layers", "expert_heads"):
            check_range(name, getattr(self, name), 1)
        check_range("instruction_buckets", self.instruction_buckets, 0, note=" (0: off)")
        check_range("instruction_dim", self.instruction_dim, 1)
        if self.expert_width % self.expert_heads:
            raise ValueError(
                f"flow_vla expert_width {self.expert_width} must be a multiple of expert_heads "
                f"{self.expert_heads}"
            )
        if not 1 <= self.denoise_steps <= 64:
            raise ValueError(
                f"flow_vla denoise_steps={self.denoise_steps}: must be in [1, 64] (few on CPU, "
                "e.g. 4; pi0 uses 10). Fix: set models.actor.options.denoise_steps"
            )
        if self.logprob_method not in LOGPROB_METHODS:
            raise ValueError(
                f"flow_vla logprob_method={self.logprob_method!r}: one of {LOGPROB_METHODS}. "
                "Fix: set models.actor.options.logprob_method"
            )
        if not 0.0 < self.noise_level <= 2.0:
            raise ValueError(
                f"flow_vla noise_level={self.noise_level}: must be in (0, 2] (Flow-SDE's a; "
                "0 would make every step deterministic and unscorable). Fix: set "
                "models.actor.options.noise_level, e.g. 0.5"
            )
        low, high = self.noise_log_std_range
        if not low < high <= 1.0:
            raise ValueError(
                f"flow_vla noise_log_std_range={self.noise_log_std_range}: need low < high <= 1"
            )
        if self.gripper_convention not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"flow_vla gripper_convention {self.gripper_convention!r} is not one of "
                f"{list(GRIPPER_CONVENTIONS)}"
            )

    @property
    def chain_width(self) -> int:
        """Values of one recorded chain: ``(S + 1) C A`` (x_0 .. x_S)."""
        return (self.denoise_steps + 1) * self.chunk * self.action_dim

    @property
    def tokens_per_step(self) -> int:
        """Scored values per observation: ``S C A`` (each step's Gaussian, per dimension)."""
        return self.denoise_steps * self.chunk * self.action_dim
