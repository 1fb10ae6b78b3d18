"""``advantage.marft``: MARFT's agent-level advantages for the agents of a multi-agent DAG.

Reads each agent's critic values (its ``critic.values`` node with ``agent: <name>``) and the
team's REWARDS, and writes each agent's advantages and critic returns in its namespace
(``<agent>/advantages``, ``<agent>/returns``), broadcast over its response tokens, for that
agent's ``actor.train`` and ``critic.train`` nodes. The math is in
:mod:`embodied_rl.algorithms.marft`.

Shapes: ``B`` episodes on this rank, ``N`` agents, ``R_k`` response tokens of agent k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import masked_moments, whiten_with_moments
from embodied_rl.algorithms.marft import (
    agent_level_gae,
    agent_state_values,
    team_reward_on_last_agent,
)
from embodied_rl.dag.node_type import register_node
from embodied_rl.nodes.critic import log_moments
from embodied_rl.runtime.context import NodeContext


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
        if len(self.agents) < 2 or len(set(self.agents)) != len(self.agents):
            raise ValueError(
                f"advantage.marft needs two or more distinct agents in acting order, got "
                f"{self.agents}; list them as agents: [first, second, ...]"
            )
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


def _reads(cfg: MarftAdvantageConfig) -> tuple[str, ...]:
    per_agent = (K.agent_key(a, k) for a in cfg.agents for k in (K.VALUES, K.RESPONSE_MASK))
    return (K.REWARDS, *per_agent)


def _writes(cfg: MarftAdvantageConfig) -> tuple[str, ...]:
    return tuple(K.agent_key(a, k) for a in cfg.agents for k in (K.ADVANTAGES, K.RETURNS))


@register_node("advantage.marft", reads=_reads, writes=_writes, config=MarftAdvantageConfig)
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
