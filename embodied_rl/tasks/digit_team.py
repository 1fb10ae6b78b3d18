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

from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, parse_integer


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
