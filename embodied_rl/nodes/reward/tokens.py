"""Per-token rewards for REINFORCE++ and PPO: ``reward.token_rewards`` puts the scalar REWARDS
on each response's last valid token; ``reward.kl_penalty`` also subtracts a KL-to-reference
penalty on every valid token (KL as reward, docs/ALGORITHMS.md, "KL estimators").
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import place_on_last_token
from embodied_rl.algorithms.losses import KL_ESTIMATORS, kl_penalty
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


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
        check_range("beta", self.beta, 0)


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
