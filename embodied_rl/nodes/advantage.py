"""Advantage nodes (ALGORITHMS.md): GRPO / Dr. GRPO over groups that may span ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import grpo_advantages
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


@dataclass
class GrpoConfig:
    """Options of ``advantage.grpo``.

    Attributes:
        norm_by_std: divide by the group std (GRPO); ``False`` is Dr. GRPO.
        eps: added to the std.
    """

    norm_by_std: bool = True
    eps: float = 1e-6


def gather_over_dp(ctx: NodeContext, local: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """Concatenate a small per-sample tensor over the node's dp group.

    Returns:
        the concatenation in dp-rank order and the slice holding this rank's rows.
    """
    if ctx.dp_group is None or ctx.dp_size == 1:
        return local, slice(0, len(local))
    parts: list[torch.Tensor | None] = [None] * ctx.dp_size
    dist.all_gather_object(parts, local, group=ctx.dp_group)
    start = sum(len(p) for p in parts[: ctx.dp_rank])
    return torch.cat(parts), slice(start, start + len(local))


@register_node(
    "advantage.grpo",
    reads=(K.REWARDS, K.GROUP_ID, K.RESPONSE_MASK),
    writes=(K.ADVANTAGES,),
    config=GrpoConfig,
)
def grpo_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """ADVANTAGES (B, R) = group-normalised reward on every valid response token."""
    cfg: GrpoConfig = ctx.node_config
    local = torch.stack([batch[K.REWARDS].float(), batch[K.GROUP_ID].double()], dim=-1)
    everyone, mine = gather_over_dp(ctx, local.double())
    rewards, groups = everyone[:, 0].float(), everyone[:, 1].long()
    advantages = grpo_advantages(rewards, groups, norm_by_std=cfg.norm_by_std, eps=cfg.eps)[mine]
    mask = batch[K.RESPONSE_MASK].float()
    batch[K.ADVANTAGES] = advantages[:, None] * mask
    solved = _fraction_of_groups_with_spread(rewards, groups)
    ctx.metrics.log("advantage/groups_with_signal", solved, weight=1.0, reduce="max")
    return batch


def _fraction_of_groups_with_spread(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose rewards are not all equal (the ones that produce a gradient)."""
    unique = torch.unique(groups)
    if len(unique) == 0:
        return 0.0
    spread = [bool((rewards[groups == g].max() - rewards[groups == g].min()) > 0) for g in unique]
    return sum(spread) / len(spread)
