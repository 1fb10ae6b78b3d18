"""``reward.overlong``: DAPO's soft over-length penalty added to each sample's reward
(docs/ALGORITHMS.md, "DAPO"; arXiv 2503.14476)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


@dataclass
class OverlongConfig:
    """Options of ``reward.overlong``: ``L_max`` tokens, of which the last ``buffer`` are soft.

    Attributes:
        max_length: L_max, normally the rollout's ``max_response_length``.
        buffer_length: L_c, the soft-penalty zone before L_max.
        penalty_factor: scales the penalty (1.0 as in DAPO).
    """

    max_length: int = 8
    buffer_length: int = 2
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        check_range("penalty_factor", self.penalty_factor, 0)
        if not 0 < self.buffer_length <= self.max_length:
            raise ValueError(
                f"need 0 < buffer_length <= max_length, got {self.buffer_length} and {self.max_length}"
            )


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer_length: int) -> torch.Tensor:
    """DAPO's soft over-length punishment of response lengths ``|y|`` (B,).

    0 if ``|y| <= L_max - L_c``; ``(L_max - L_c - |y|) / L_c`` inside the buffer; -1 beyond.
    """
    start = max_length - buffer_length
    inside = (start - lengths.float()) / buffer_length
    penalty = torch.where(lengths <= start, torch.zeros_like(inside), inside)
    return torch.where(lengths > max_length, torch.full_like(inside, -1.0), penalty)


@register_node(
    "reward.overlong",
    reads=(K.REWARDS, K.RESPONSE_MASK),
    writes=(K.REWARDS,),
    config=OverlongConfig,
)
def overlong_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REWARDS += penalty_factor * overlong_penalty(response length)."""
    cfg: OverlongConfig = ctx.node_config
    lengths = batch[K.RESPONSE_MASK].sum(-1).round().long()
    penalty = cfg.penalty_factor * overlong_penalty(lengths, cfg.max_length, cfg.buffer_length)
    batch[K.REWARDS] = batch[K.REWARDS].float() + penalty
    ctx.metrics.log(
        "reward/overlong_penalty",
        penalty.mean().item() if len(penalty) else 0.0,
        weight=len(penalty),
    )
    return batch
