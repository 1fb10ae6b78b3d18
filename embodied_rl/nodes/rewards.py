"""Simple reward nodes shared by embodied and LLM DAGs."""

from __future__ import annotations

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
