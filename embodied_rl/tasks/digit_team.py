"""The digit-team task: agents write one digit each of an arithmetic answer, in order.

A cooperative task for MARFT-style multi-agent RL (``configs/marft_llm.yaml``): for a prompt
such as ``"49+34="`` the first agent writes the tens digit (``8``), the second sees the prompt
and that digit (``"49+34=8"``) and writes the units digit (``3``). The team is scored on the
number the digits spell together, with :func:`embodied_rl.tasks.arithmetic.score` (1 for the
exact answer, partial credit for a near one), so neither agent earns anything on its own and
each one's best move depends on the other's: after a wrong tens digit the units agent does
best with the digit that brings the total closest (9 below the answer, 0 above it).

An agent's response counts only if it is exactly one digit; otherwise the team answer is
invalid and earns 0. Answers are written with as many digits as there are agents (``7`` is
``"07"`` for two), so answers must lie in ``[0, 10**agents)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, strings
from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, parse_integer, score


@dataclass
class DigitTeamRewardConfig(ArithmeticRewardConfig):
    """Options of ``reward.digit_team``: those of ``reward.arithmetic`` and

    Attributes:
        agents: the agents in acting order; agent k writes the k-th digit of the answer.
    """

    agents: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.agents or len(set(self.agents)) != len(self.agents):
            raise ValueError(
                f"reward.digit_team needs the distinct agents in acting order, got {self.agents}"
            )


def answer_digits(answer: str, num_digits: int) -> str:
    """The answer zero-padded to ``num_digits`` digits (``"7"`` -> ``"07"``)."""
    value = parse_integer(answer)
    if value is None or not 0 <= value < 10**num_digits:
        raise ValueError(
            f"answer {answer!r} is not an integer in [0, {10**num_digits}) and cannot be "
            f"written with {num_digits} digits, one per agent; use problems with such answers "
            "(scripts/make_arithmetic_data.py) or more agents"
        )
    return f"{value:0{num_digits}d}"


def team_answer(digits: list[str]) -> str:
    """The number the agents' responses spell, or ``""`` if one is not exactly one digit."""
    valid = all(len(d) == 1 and d in "0123456789" for d in digits)
    return "".join(digits) if valid else ""


def _reads(cfg: DigitTeamRewardConfig) -> tuple[str, ...]:
    return (K.ANSWER_TEXT, *(K.agent_key(a, K.RESPONSE_TEXT) for a in cfg.agents))


@register_node("reward.digit_team", reads=_reads, writes=(K.REWARDS,), config=DigitTeamRewardConfig)
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
