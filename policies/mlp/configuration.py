"""Options of the MLP policy: the fast policy for CPU runs and learning tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied_rl.checks import check_range
from policies.normalization import GRIPPER_CONVENTIONS
from policies.options import PolicyOptions

HEADS = ("gaussian", "discrete")


@dataclass
class MLPPolicyConfig(PolicyOptions):
    """MLP policy options.

    Attributes:
        state_dim: size of the proprio/state vector (0: no state input).
        image_size: side of the square RGB image input (0: no image input).
        action_dim: A, the action dimensions.
        hidden: widths of the trunk's hidden layers.
        head: ``gaussian`` (continuous, learnable log-std) or ``discrete`` (``num_bins``
            uniform bins per dimension over [-1, 1], one token per dimension).
        num_bins: bins per dimension of the discrete head.
        init_log_std: initial log standard deviation of the Gaussian head.
        value_head: add a scalar value head (for PPO with a shared trunk).
        seed: weight-init seed: every data-parallel rank builds identical weights.
        chunk: C, actions per policy step predicted from one observation (executed one
            after another); ``K = C * action_dim`` outputs per step.
        instruction_buckets: condition on the instruction with a hashed bag of words: each
            lower-cased word goes to bucket ``crc32(word) % instruction_buckets`` of an
            ``EmbeddingBag`` (mean); 0 ignores instructions (single-task runs).
        instruction_dim: width of the instruction embedding.
        gripper_convention: ``none`` or ``libero`` (``policies/normalization.py``): how the
            last action dimension maps to the env's gripper command.
    """

    state_dim: int = 8
    image_size: int = 0
    action_dim: int = 2
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    head: str = "gaussian"
    num_bins: int = 11
    init_log_std: float = -0.5
    value_head: bool = False
    seed: int = 0
    chunk: int = 1
    instruction_buckets: int = 0
    instruction_dim: int = 32
    gripper_convention: str = "none"

    policy_name = "mlp"  # class attribute: used in messages
    # Options that only set the initial weights: an ``init_from`` checkpoint may differ in
    # them (see ``architecture_options``).
    RUNTIME_OPTIONS = frozenset({"seed", "init_log_std"})

    def __post_init__(self) -> None:
        check_range("mlp seed", self.seed, 0)
        if self.head not in HEADS:
            raise ValueError(f"mlp head must be one of {HEADS}, got {self.head!r}")
        if self.state_dim <= 0 and self.image_size <= 0:
            raise ValueError("the MLP policy needs an input: set state_dim > 0 or image_size > 0")
        check_range("action_dim", self.action_dim, 1)
        check_range("num_bins", self.num_bins, 2)
        if self.image_size and self.image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {self.image_size}")
        check_range("chunk", self.chunk, 1)
        check_range("instruction_buckets", self.instruction_buckets, 0, note=" (0: off)")
        check_range("instruction_dim", self.instruction_dim, 1)
        if self.gripper_convention not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"mlp gripper_convention {self.gripper_convention!r} is not one of "
                f"{list(GRIPPER_CONVENTIONS)}"
            )
