"""Advantage nodes (docs/ALGORITHMS.md, "Advantage estimators").

- ``advantage.grpo`` / ``advantage.rloo``: group estimators. They gather the small (reward,
  group id) pairs over the dp group, so a group may span ranks.
- ``advantage.reinforce_pp``: discounted returns of TOKEN_REWARDS whitened over the global
  batch (sums reduced over the dp group).
- ``advantage.gae``: PPO's GAE on the critic's VALUES, whitened over the global batch.
- ``advantage.marft``: MARFT's agent-level GAE over the agents of a multi-agent DAG.

Shapes: ``B`` samples on this rank, ``R`` response tokens (``R = T * K`` for trajectories),
``N`` agents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import (
    group_mean_std,
    grpo_advantages,
    masked_moments,
    place_on_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
    subtract_group_mean_at_last_token,
    whiten_with_moments,
)
from embodied_rl.algorithms.gae import gae
from embodied_rl.algorithms.marft import (
    agent_level_gae,
    agent_state_values,
    team_reward_on_last_agent,
)
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


# ------------------------------------------------------------------ group estimators
@dataclass
class GrpoConfig:
    """Options of ``advantage.grpo``.

    Attributes:
        norm_by_std: divide by the group std (GRPO); ``False`` is Dr. GRPO.
        eps: added to the std.
    """

    norm_by_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_range("eps", self.eps, 0)


def _gather_rewards_and_groups(
    ctx: NodeContext, batch: TensorDict
) -> tuple[torch.Tensor, torch.Tensor, slice]:
    """Every dp rank's REWARDS (N,) float32 and GROUP_ID (N,) int64, and this rank's slice."""
    local = torch.stack([batch[K.REWARDS].double(), batch[K.GROUP_ID].double()], dim=-1)
    everyone, mine = ctx.gather_rows_over_dp(local.cpu())
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
        check_range("gamma", self.gamma, 0, 1)
        check_range("eps", self.eps, 0)


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


# ------------------------------------------------------------------ advantage.gae
REWARD_SOURCES = ("token_rewards", "last_token")


@dataclass
class GaeConfig:
    """Options of ``advantage.gae`` (docs/ALGORITHMS.md, "GAE (PPO)").

    Attributes:
        gamma: discount per token.
        lam: GAE lambda (1: Monte-Carlo return minus V; 0: one-step TD error).
        whiten: normalise the advantages to mean 0, std 1 over the valid tokens of the
            GLOBAL batch (moments all-reduced over the dp group; no token is gathered).
        reward_source: ``token_rewards`` reads per-token rewards TOKEN_REWARDS (B, R);
            ``last_token`` places the scalar REWARDS (B,) on each sequence's last valid token.
        eps: added to the variance when whitening.
    """

    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    reward_source: str = "token_rewards"
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_fields(self, ("gamma", "lam"), 0, 1)
        check_range("eps", self.eps, 0)
        if self.reward_source not in REWARD_SOURCES:
            raise ValueError(
                f"reward_source must be one of {REWARD_SOURCES}, got {self.reward_source!r}"
            )


def _reward_key(cfg: GaeConfig) -> str:
    return K.REWARDS if cfg.reward_source == "last_token" else K.TOKEN_REWARDS


def _gae_reads(cfg: GaeConfig) -> tuple[str, ...]:
    return (_reward_key(cfg), K.VALUES, K.RESPONSE_MASK)


def _token_rewards(batch: TensorDict, cfg: GaeConfig) -> torch.Tensor:
    """(B, R) per-token rewards from the configured source."""
    mask = batch[K.RESPONSE_MASK]
    if cfg.reward_source == "last_token":
        return place_on_last_token(batch[K.REWARDS], mask)
    return batch[K.TOKEN_REWARDS].float()


@register_node(
    "advantage.gae", reads=_gae_reads, writes=(K.ADVANTAGES, K.RETURNS), config=GaeConfig
)
def gae_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """ADVANTAGES and RETURNS (B, R) by GAE; advantages whitened over the global batch."""
    cfg: GaeConfig = ctx.node_config
    mask = batch[K.RESPONSE_MASK].float()
    advantages, returns = gae(_token_rewards(batch, cfg), batch[K.VALUES], mask, cfg.gamma, cfg.lam)
    # [sum A, sum A^2, n] over the dp group: 3 numbers, not tokens (on the device: NCCL/HCCL).
    moments = ctx.all_reduce_sum(masked_moments(advantages, mask).to(ctx.device)).cpu()
    log_moments(ctx, moments, "advantage/raw_mean", "advantage/raw_std")
    if cfg.whiten:
        advantages = whiten_with_moments(advantages, mask, moments, eps=cfg.eps)
    batch[K.ADVANTAGES] = advantages
    batch[K.RETURNS] = returns
    return batch


def log_moments(ctx: NodeContext, moments: torch.Tensor, mean_name: str, std_name: str) -> None:
    """Log the mean and (population) std that global :func:`masked_moments` give; every rank
    holds the same numbers, so ``reduce="max"`` keeps them as they are."""
    total, total_sq, count = moments.tolist()
    if count <= 0:
        return
    mean = total / count
    var = max(total_sq / count - mean * mean, 0.0)
    ctx.metrics.log(mean_name, mean, reduce="max")
    ctx.metrics.log(std_name, var**0.5, reduce="max")


# ------------------------------------------------------------------ advantage.marft
@dataclass
class MarftAdvantageConfig:
    """Options of ``advantage.marft``.

    Attributes:
        agents: the agents in acting order (agent k sees agents 1..k-1); the team reward
            follows the last one's action.
        gamma: discount per agent step.
        lam: GAE lambda over agents (1: every agent gets ``R - V_k``; 0: an earlier agent
            gets only the change its action made to the team's expected reward).
        whiten: normalise each agent's advantages to mean 0, std 1 over the episodes of the
            GLOBAL batch (3 numbers per agent all-reduced over the dp group).
        eps: added to the variance when whitening.
    """

    agents: list[str] = field(default_factory=list)
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True
    eps: float = 1e-8

    def __post_init__(self) -> None:
        check_range("eps", self.eps, 0)
        if len(self.agents) < 2 or len(set(self.agents)) != len(self.agents):
            raise ValueError(
                f"advantage.marft needs two or more distinct agents in acting order, got "
                f"{self.agents}; list them as agents: [first, second, ...]"
            )
        check_fields(self, ("gamma", "lam"), 0, 1)


def _marft_reads(cfg: MarftAdvantageConfig) -> tuple[str, ...]:
    per_agent = (K.agent_key(a, k) for a in cfg.agents for k in (K.VALUES, K.RESPONSE_MASK))
    return (K.REWARDS, *per_agent)


def _marft_writes(cfg: MarftAdvantageConfig) -> tuple[str, ...]:
    return tuple(K.agent_key(a, k) for a in cfg.agents for k in (K.ADVANTAGES, K.RETURNS))


@register_node(
    "advantage.marft", reads=_marft_reads, writes=_marft_writes, config=MarftAdvantageConfig
)
def marft_advantage_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Per-agent ADVANTAGES and RETURNS (B, R_k) by agent-level GAE over the acting order.

    Logs ``marft/<agent>/value`` and ``value_std`` (V_k over the global batch), and
    ``marft/<agent>/advantage_raw`` and ``advantage_std`` (A_k before whitening).
    """
    cfg: MarftAdvantageConfig = ctx.node_config
    values = torch.stack(
        [agent_state_values(batch[K.agent_key(a, K.VALUES)]) for a in cfg.agents], dim=1
    )  # (B, N)
    rewards = team_reward_on_last_agent(batch[K.REWARDS], len(cfg.agents))
    advantages, returns = agent_level_gae(rewards, values, cfg.gamma, cfg.lam)
    for k, agent in enumerate(cfg.agents):
        mask = batch[K.agent_key(agent, K.RESPONSE_MASK)].float()  # (B, R_k)
        advantage = _whitened(ctx, agent, advantages[:, k : k + 1], values[:, k], cfg)
        batch[K.agent_key(agent, K.ADVANTAGES)] = advantage * mask
        batch[K.agent_key(agent, K.RETURNS)] = returns[:, k : k + 1] * mask
    return batch


def _whitened(
    ctx: NodeContext,
    agent: str,
    advantage: torch.Tensor,
    value: torch.Tensor,
    cfg: MarftAdvantageConfig,
) -> torch.Tensor:
    """One agent's advantages (B, 1), whitened over the global batch if configured; logs
    the agent's global mean value and raw advantage moments."""
    episodes = torch.ones_like(advantage)
    moments = ctx.all_reduce_sum(masked_moments(advantage, episodes).to(ctx.device)).cpu()
    value_moments = ctx.all_reduce_sum(masked_moments(value[:, None], episodes).to(ctx.device))
    prefix = f"marft/{agent}/"
    log_moments(ctx, value_moments.cpu(), prefix + "value", prefix + "value_std")
    log_moments(ctx, moments, prefix + "advantage_raw", prefix + "advantage_std")
    if not cfg.whiten:
        return advantage
    return whiten_with_moments(advantage, episodes, moments, eps=cfg.eps)
