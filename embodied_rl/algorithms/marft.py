"""Agent-level credit assignment of MARFT (Liao et al. 2025, arXiv 2504.16129).

N agents act in order on one task (agent k sees the task and the actions of agents 1..k-1);
the team is rewarded once the last agent has acted. MARFT's action-level PPO treats each
agent's whole response as one action and runs GAE over the *sequence of agents*: the state
agent k acts in is (task, a_1..a_{k-1}), valued by V_k = V(task, a_1..a_{k-1}), and the next
state is the one agent k+1 acts in. For one round of N agents (r_k: reward given after agent
k's action, usually 0 before the last agent and the team reward R after it):

    delta_k = r_k + gamma * V_{k+1} - V_k          (V_{N+1} = 0: the episode ends)
    A_k     = delta_k + gamma * lam * A_{k+1}       (A_{N+1} = 0)
    R_k     = A_k + V_k                             (agent k's critic target)

So an earlier agent is credited for how much its message raised what the team is expected to
earn (``V_{k+1} - V_k``), plus ``gamma * lam`` of what later agents made of it: with
``lam = 1`` every agent gets ``R - V_k``; with ``lam = 0`` agent k < N gets only the change in
the team's expected reward that its own action caused. This is GAE with agents in the place of
tokens, so it reuses :func:`embodied_rl.algorithms.gae.gae` on (B, N) tensors.

Shapes: ``B`` episodes, ``N`` agents, ``R`` response tokens of one agent.
"""

from __future__ import annotations

import torch

from embodied_rl.algorithms.gae import gae


def agent_state_values(token_values: torch.Tensor) -> torch.Tensor:
    """V_k (B,) of the state agent k acts in, from its critic's token values (B, R).

    The critic's value before an agent's first response token is the value of the agent's
    whole prompt (the task and the earlier agents' responses), i.e. of the state it acts in.
    """
    return token_values[:, 0].float()


def team_reward_on_last_agent(rewards: torch.Tensor, num_agents: int) -> torch.Tensor:
    """(B, N) per-agent rewards: 0 for every agent but the last, which gets REWARDS (B,)."""
    per_agent = torch.zeros(rewards.shape[0], num_agents, dtype=torch.float32)
    per_agent[:, -1] = rewards.float()
    return per_agent


def agent_level_gae(
    agent_rewards: torch.Tensor, agent_values: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MARFT's per-agent advantages and returns (formula: module doc).

    Args:
        agent_rewards: (B, N) r_k, the reward after agent k's action.
        agent_values: (B, N) V_k, the value of the state agent k acts in.
        gamma: discount per agent step, in [0, 1].
        lam: GAE lambda over agents, in [0, 1].

    Returns:
        advantages A (B, N) and returns R = A + V (B, N), float32.
    """
    return gae(agent_rewards, agent_values, torch.ones_like(agent_values), gamma, lam)
