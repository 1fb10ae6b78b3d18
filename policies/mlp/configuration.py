"""Options of the MLP policy: the fast policy for CPU runs and learning tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HEADS = ("gaussian", "discrete")


@dataclass
class MLPPolicyConfig:
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

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"mlp head must be one of {HEADS}, got {self.head!r}")
        if self.state_dim <= 0 and self.image_size <= 0:
            raise ValueError("the MLP policy needs an input: set state_dim > 0 or image_size > 0")
        if self.action_dim < 1 or self.num_bins < 2:
            raise ValueError("action_dim must be >= 1 and num_bins >= 2")
        if self.image_size and self.image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {self.image_size}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MLPPolicyConfig:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise ValueError(f"unknown mlp policy option(s) {unknown}; valid: {sorted(valid)}")
        return cls(**dict(options))
