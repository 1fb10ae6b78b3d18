"""Outcome rewards: ``reward.success`` (binary episode success) and ``reward.turns``
(multi-turn conversations), shared by embodied and LLM DAGs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


@register_node("reward.success", reads=(K.SUCCESS,), writes=(K.REWARDS,))
def success_reward_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REWARDS (B,) = 1.0 for a successful episode, else 0.0 (binary GRPO)."""
    batch[K.REWARDS] = batch[K.SUCCESS].float()
    if len(batch):
        ctx.metrics.log("reward/mean", batch[K.REWARDS].mean().item(), weight=len(batch))
    return batch


@dataclass
class TurnRewardConfig:
    """Options of ``reward.turns``: how a conversation's turn rewards and final reward add up.

    ``REWARDS = turn_weight * mean(turn rewards of the turns taken) + final_weight * final``.
    The mean (not the sum) keeps a conversation that ends early from scoring less for having
    fewer turns; the final reward carries whether the whole episode was solved.
    """

    turn_weight: float = 1.0
    final_weight: float = 1.0

    def __post_init__(self) -> None:
        if (
            self.turn_weight < 0
            or self.final_weight < 0
            or self.turn_weight + self.final_weight == 0
        ):
            raise ValueError(
                "reward.turns needs turn_weight >= 0 and final_weight >= 0, not both 0; got "
                f"{self.turn_weight} and {self.final_weight}"
            )


@register_node(
    "reward.turns",
    reads=(K.TURN_REWARDS, K.NUM_TURNS, K.FINAL_REWARDS),
    writes=(K.REWARDS,),
    config=TurnRewardConfig,
)
def turn_reward_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REWARDS (B,) of multi-turn conversations (``rollout.llm_multiturn``).

    Logs ``reward/mean``, ``reward/final`` (share of episodes solved when the environment's
    final reward is 0/1), ``reward/turn_mean`` and ``reward/turn_<k>`` (the mean reward of
    model turn k over the conversations that reached it, k from 1).
    """
    cfg: TurnRewardConfig = ctx.node_config
    turns, taken = batch[K.TURN_REWARDS].float(), batch[K.NUM_TURNS].long()
    reached = torch.arange(turns.shape[1]).unsqueeze(0) < taken.unsqueeze(1)  # (B, U)
    turn_mean = (turns * reached).sum(dim=1) / taken.clamp(min=1)
    final = batch[K.FINAL_REWARDS].float()
    batch[K.REWARDS] = cfg.turn_weight * turn_mean + cfg.final_weight * final
    count = len(batch)
    if count:
        ctx.metrics.log("reward/mean", batch[K.REWARDS].mean(), weight=count)
        ctx.metrics.log("reward/final", final.mean(), weight=count)
        ctx.metrics.log("reward/turn_mean", turn_mean.mean(), weight=count)
        for k in range(turns.shape[1]):
            n_reached = int(reached[:, k].sum())
            if n_reached:
                mean = turns[reached[:, k], k].mean()
                ctx.metrics.log(f"reward/turn_{k + 1}", mean, weight=n_reached)
    return batch
