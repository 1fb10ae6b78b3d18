"""Advantage and token-reward nodes (ALGORITHMS.md, "Advantage estimators").

Group estimators (GRPO / Dr. GRPO, RLOO) gather the small (reward, group id) pairs over the dp
group, so groups may span ranks. REINFORCE++ whitens over the global batch with sums reduced
over the dp group. The ``reward.*`` nodes turn the scalar REWARDS into per-token
TOKEN_REWARDS (with or without a KL-to-reference penalty) for REINFORCE++.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import (
    group_mean_std,
    grpo_advantages,
    place_on_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
    subtract_group_mean_at_last_token,
)
from embodied_rl.algorithms.losses import KL_ESTIMATORS, kl_penalty
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


def _gather_rewards_and_groups(
    ctx: NodeContext, batch: TensorDict
) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """Every dp rank's REWARDS (N,) float32 and GROUP_ID (N,) int64, and this rank's slice."""
    local = torch.stack([batch[K.REWARDS].double(), batch[K.GROUP_ID].double()], dim=-1)
    everyone, mine = gather_over_dp(ctx, local.cpu())
    return everyone[:, 0].float(), everyone[:, 1].long(), mine


def _write_group_advantages(
    ctx: NodeContext,
    batch: TensorDict,
    estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> TensorDict:
    """ADVANTAGES (B, R): ``estimator(rewards, groups)`` of the whole dp group on valid tokens."""
    rewards, groups, mine = _gather_rewards_and_groups(ctx, batch)
    mask = batch[K.RESPONSE_MASK].float()
    advantages = estimator(rewards, groups)[mine].to(mask.device)
    batch[K.ADVANTAGES] = advantages[:, None] * mask
    solved = _fraction_of_groups_with_spread(rewards, groups)
    ctx.metrics.log("advantage/groups_with_signal", solved, weight=1.0, reduce="max")
    return batch


@register_node(
    "advantage.grpo",
    reads=(K.REWARDS, K.GROUP_ID, K.RESPONSE_MASK),
    writes=(K.ADVANTAGES,),
    config=GrpoConfig,
)
def grpo_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """ADVANTAGES (B, R) = group-normalised reward on every valid response token."""
    cfg: GrpoConfig = ctx.node_config
    return _write_group_advantages(
        ctx,
        batch,
        lambda r, g: grpo_advantages(r, g, norm_by_std=cfg.norm_by_std, eps=cfg.eps),
    )


@register_node(
    "advantage.rloo",
    reads=(K.REWARDS, K.GROUP_ID, K.RESPONSE_MASK),
    writes=(K.ADVANTAGES,),
)
def rloo_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """ADVANTAGES (B, R) = ``R_i - mean_{j != i} R_j`` over the group on every valid token.

    A group of one sample has baseline 0 (advantage = its reward).
    """
    return _write_group_advantages(ctx, batch, rloo_advantages)


def _fraction_of_groups_with_spread(rewards: torch.Tensor, groups: torch.Tensor) -> float:
    """Share of groups whose rewards are not all equal (the ones that produce a gradient)."""
    unique = torch.unique(groups)
    if len(unique) == 0:
        return 0.0
    spread = [bool((rewards[groups == g].max() - rewards[groups == g].min()) > 0) for g in unique]
    return sum(spread) / len(spread)


@dataclass
class KlPenaltyRewardConfig:
    """Options of ``reward.kl_penalty`` (KL as reward, REINFORCE++ / PPO-RLHF style).

    Attributes:
        beta: weight of the per-token KL penalty.
        estimator: ``k1`` (the usual choice in the reward: its sum over tokens estimates the
            sequence KL), ``k2`` or ``k3``.
    """

    beta: float = 0.01
    estimator: str = "k1"

    def __post_init__(self) -> None:
        if self.estimator not in KL_ESTIMATORS:
            raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {self.estimator!r}")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}")


@register_node(
    "reward.kl_penalty",
    reads=(K.REF_LOGPROBS, K.OLD_LOGPROBS, K.RESPONSE_MASK, K.REWARDS),
    writes=(K.TOKEN_REWARDS,),
    config=KlPenaltyRewardConfig,
)
def kl_penalty_reward_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """TOKEN_REWARDS (B, R): REWARDS on the last valid token, ``- beta*KL_t`` on every valid one.

    ``KL_t`` estimates KL(pi_old || pi_ref) on the sampled token from OLD_LOGPROBS (the rollout
    policy) and REF_LOGPROBS.
    """
    cfg: KlPenaltyRewardConfig = ctx.node_config
    mask = batch[K.RESPONSE_MASK].float()
    kl = kl_penalty(batch[K.OLD_LOGPROBS].float(), batch[K.REF_LOGPROBS].float(), cfg.estimator)
    kl = kl * mask
    batch[K.TOKEN_REWARDS] = place_on_last_token(batch[K.REWARDS], mask) - cfg.beta * kl
    tokens = float(mask.sum())
    if tokens > 0:
        ctx.metrics.log("reward/kl_per_token", float(kl.sum()) / tokens, weight=tokens)
    return batch


@register_node(
    "reward.token_rewards",
    reads=(K.RESPONSE_MASK, K.REWARDS),
    writes=(K.TOKEN_REWARDS,),
)
def token_rewards_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """TOKEN_REWARDS (B, R): REWARDS on each row's last valid token, 0 elsewhere (no KL)."""
    batch[K.TOKEN_REWARDS] = place_on_last_token(batch[K.REWARDS], batch[K.RESPONSE_MASK])
    return batch


@dataclass
class ReinforcePPConfig:
    """Options of ``advantage.reinforce_pp``.

    Attributes:
        gamma: discount of the per-token return.
        baseline: REINFORCE++-baseline: subtract the group mean of REWARDS (over the whole
            group, all dp ranks; 0 for a group of one) from each row's last-token reward
            before computing returns. Needs REWARDS and GROUP_ID.
        eps: added to the global variance.
    """

    gamma: float = 1.0
    baseline: bool = False
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


def _reinforce_pp_reads(cfg: ReinforcePPConfig) -> tuple[str, ...]:
    extra = (K.REWARDS, K.GROUP_ID) if cfg.baseline else ()
    return (K.TOKEN_REWARDS, K.RESPONSE_MASK) + extra


@register_node(
    "advantage.reinforce_pp",
    reads=_reinforce_pp_reads,
    writes=(K.ADVANTAGES,),
    config=ReinforcePPConfig,
)
def reinforce_pp_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """ADVANTAGES (B, R): discounted returns of TOKEN_REWARDS whitened over the global batch."""
    cfg: ReinforcePPConfig = ctx.node_config
    mask = batch[K.RESPONSE_MASK].float()
    token_rewards = batch[K.TOKEN_REWARDS].float()
    if cfg.baseline:
        rewards, groups, mine = _gather_rewards_and_groups(ctx, batch)
        group_mean = group_mean_std(rewards, groups)[0][mine].to(mask.device)
        token_rewards = subtract_group_mean_at_last_token(token_rewards, mask, group_mean)
    batch[K.ADVANTAGES] = reinforce_pp_advantages(
        token_rewards, mask, cfg.gamma, ctx.all_reduce_sum, eps=cfg.eps
    )
    return batch
