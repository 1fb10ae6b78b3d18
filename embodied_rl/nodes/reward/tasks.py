"""Rule-based rewards of the text tasks in :mod:`embodied_rl.tasks`: ``reward.arithmetic``
(one response scored against its integer answer) and ``reward.digit_team`` (the number that
several agents' one-digit responses spell). The scoring rules live with the tasks."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, strings
from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, score
from embodied_rl.tasks.digit_team import DigitTeamRewardConfig, answer_digits, team_answer


@register_node(
    "reward.arithmetic",
    reads=(K.RESPONSE_TEXT, K.ANSWER_TEXT),
    writes=(K.REWARDS,),
    config=ArithmeticRewardConfig,
)
def arithmetic_reward(ctx: Any, batch: TensorDict) -> TensorDict:
    """Score each response against its answer.

    Args:
        ctx: the node context (``ctx.node_config`` is an :class:`ArithmeticRewardConfig`).
        batch: B samples with RESPONSE_TEXT and ANSWER_TEXT.

    Returns:
        The batch with REWARDS (B,) float32 added.
    """
    cfg: ArithmeticRewardConfig = ctx.node_config
    count = batch_len(batch)
    out = batch.clone(recurse=False)
    if count == 0:
        out[K.REWARDS] = torch.zeros(0, dtype=torch.float32)
        return out
    responses, answers = strings(batch, K.RESPONSE_TEXT), strings(batch, K.ANSWER_TEXT)
    rewards = torch.tensor(
        [
            score(r, a, partial_weight=cfg.partial_weight, partial_scale=cfg.partial_scale)
            for r, a in zip(responses, answers)
        ],
        dtype=torch.float32,
    )
    out[K.REWARDS] = rewards
    ctx.metrics.log("reward/mean", rewards.mean(), weight=count)
    ctx.metrics.log("reward/exact_match", (rewards == 1.0).float().mean(), weight=count)
    return out


def _digit_team_reads(cfg: DigitTeamRewardConfig) -> tuple[str, ...]:
    return (K.ANSWER_TEXT, *(K.agent_key(a, K.RESPONSE_TEXT) for a in cfg.agents))


@register_node(
    "reward.digit_team", reads=_digit_team_reads, writes=(K.REWARDS,), config=DigitTeamRewardConfig
)
def digit_team_reward(ctx: Any, batch: TensorDict) -> TensorDict:
    """REWARDS (B,): the team's answer scored against ANSWER_TEXT.

    Logs ``reward/mean``, ``reward/exact_match``, ``reward/all_digits`` (the share of episodes
    in which every agent wrote one digit) and ``reward/<agent>_digit`` (the share in which
    that agent wrote its digit of the answer).
    """
    cfg: DigitTeamRewardConfig = ctx.node_config
    count = batch_len(batch)
    responses = [strings(batch, K.agent_key(a, K.RESPONSE_TEXT)) for a in cfg.agents]
    answers = [answer_digits(a, len(cfg.agents)) for a in strings(batch, K.ANSWER_TEXT)]
    teams = [team_answer([r[i].strip() for r in responses]) for i in range(count)]
    rewards = torch.tensor(
        [
            score(
                team,
                answer,
                partial_weight=cfg.partial_weight,
                partial_scale=cfg.partial_scale,
            )
            for team, answer in zip(teams, answers)
        ],
        dtype=torch.float32,
    )
    batch[K.REWARDS] = rewards
    if count:
        ctx.metrics.log("reward/mean", rewards.mean(), weight=count)
        ctx.metrics.log("reward/exact_match", (rewards == 1.0).float().mean(), weight=count)
        ctx.metrics.log("reward/all_digits", sum(map(bool, teams)) / count, weight=count)
        for k, agent in enumerate(cfg.agents):
            right = [r.strip() == a[k] for r, a in zip(responses[k], answers)]
            ctx.metrics.log(f"reward/{agent}_digit", sum(right) / count, weight=count)
    return batch
