"""Running sum: a multi-turn text environment in which every turn needs the last one.

The conversation opens with a small addition (``"3+4="``). After each model answer the
environment says whether it was right, gives the correct total when it was not, and adds the
next operand; the model must answer with the new total::

    user:      3+4=
    assistant: 7
    user:      correct. +5=
    assistant: 11
    user:      no, 12. -2=
    assistant: 10

The operand of a turn exists only in the environment's message, and the total it applies to
only in the conversation so far, so a model that ignores the environment turns cannot score.

Data rows (``assets/data/running_sum_{train,test}.jsonl``): ``prompt`` is the opening problem
and ``answer`` its total followed by the signed operands of the later turns, space-separated
(``"7 +5 -2"``). Rewards: each turn scores its answer against the correct running total with
the arithmetic task's :func:`~embodied_rl.tasks.arithmetic.score` (1 for exact, partial credit
for a near integer); the final reward is 1 when every turn of the episode was exact (all turns
taken), else 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from embodied_rl.checks import check_range
from embodied_rl.interfaces import TurnResult
from embodied_rl.registry import TEXT_ENVS
from embodied_rl.tasks.arithmetic import parse_integer, score


def parse_script(answer: str) -> tuple[int, list[int]]:
    """``"7 +5 -2"`` -> (7, [5, -2]): the first total and the later operands."""
    parts = answer.split()
    values = [parse_integer(part) for part in parts]
    if not parts or any(v is None for v in values):
        raise ValueError(
            f"running_sum answer {answer!r} must be the first total then signed operands, "
            "space-separated integers (e.g. '7 +5 -2'); fix the data file"
        )
    return values[0], values[1:]


def format_move(operand: int) -> str:
    return f"{operand:+d}="


@dataclass
class RunningSumEpisode:
    """One conversation; ``totals[k]`` is the correct answer of model turn ``k``."""

    totals: list[int]
    partial_weight: float
    partial_scale: float
    turn: int = 0
    exact_turns: int = 0

    def step(self, response: str) -> TurnResult:
        if self.turn >= len(self.totals):
            raise RuntimeError("running_sum episode stepped after it ended")
        target = self.totals[self.turn]
        reward = score(
            response,
            str(target),
            partial_weight=self.partial_weight,
            partial_scale=self.partial_scale,
        )
        self.exact_turns += reward == 1.0
        self.turn += 1
        if self.turn == len(self.totals):
            return TurnResult(observation=None, reward=reward, done=True)
        verdict = "correct." if reward == 1.0 else f"no, {target}."
        operand = self.totals[self.turn] - target
        return TurnResult(
            observation=f"{verdict} {format_move(operand)}", reward=reward, done=False
        )

    def final_reward(self) -> float:
        return float(self.exact_turns == len(self.totals))


@TEXT_ENVS.register("running_sum")
class RunningSum:
    """The running-sum environment (module doc); options are the per-turn score's."""

    def __init__(self, partial_weight: float = 0.5, partial_scale: float = 10.0) -> None:
        check_range("running_sum partial_weight", partial_weight, 0, 1, high_open=True)
        check_range("running_sum partial_scale", partial_scale, 0, low_open=True)
        self.partial_weight, self.partial_scale = partial_weight, partial_scale

    def start(self, prompt: str, answer: str) -> RunningSumEpisode:
        first, operands = parse_script(answer)
        totals = [first]
        for operand in operands:
            totals.append(totals[-1] + operand)
        return RunningSumEpisode(totals, self.partial_weight, self.partial_scale)


def generate_episodes(
    n: int, seed: int, *, turns: int = 3, max_operand: int = 9, max_total: int = 30
) -> list[dict[str, str]]:
    """``n`` distinct episodes (rows ``{"prompt", "answer"}``), deterministic in ``seed``.

    The opening problem adds two operands in ``0..max_operand``; each later turn adds or
    subtracts ``1..max_operand`` while the total stays in ``0..max_total``.
    """
    check_range("turns", turns, 1)
    rng = random.Random(seed)
    rows: dict[str, dict[str, str]] = {}
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 100 * n:
            raise ValueError(f"could not draw {n} distinct episodes; ask for fewer")
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        total, operands = a + b, []
        for _ in range(turns - 1):
            choices = [
                d
                for d in range(-max_operand, max_operand + 1)
                if d != 0 and 0 <= total + d <= max_total
            ]
            operand = rng.choice(choices)
            operands.append(operand)
            total += operand
        answer = " ".join([str(a + b), *(f"{d:+d}" for d in operands)])
        rows.setdefault(f"{a}+{b}= {answer}", {"prompt": f"{a}+{b}=", "answer": answer})
    return list(rows.values())
