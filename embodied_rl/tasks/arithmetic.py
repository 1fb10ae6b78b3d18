"""Arithmetic task: small additions/subtractions and their rule-based score.

Prompts are as short as ``"12+7="`` so a tiny LM rolls them out fast; the expected response
is the integer, e.g. ``"19"``. Problems are drawn without replacement from the full set of
problems within the configured ranges, shuffled by a seed, so the same seed always yields
the same problems and a train/test split can be made disjoint by construction.

Reward (:func:`score`, applied by the node ``reward.arithmetic``), for a response ``r`` and an integer answer ``a``::

    1.0                                                    if int(r) == a
    partial_weight * max(0, 1 - |int(r) - a| / partial_scale)   if r is an integer
    0.0                                                    otherwise

The partial credit (at most ``partial_weight * (1 - 1/partial_scale)`` < 1) gives a
random-init model restricted to digit tokens a gradient towards answers of the right size
before it gets any exactly right. Responses are parsed with a strict regex (optional
whitespace, optional sign, ASCII digits); model text is never evaluated as code.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_rl.checks import check_range

OPERATORS = ("+", "-")
# At most 18 digits: a bound on what counts as a number, far above any answer here.
_INTEGER = re.compile(r"\s*([+-]?[0-9]{1,18})\s*")


def enumerate_problems(
    *,
    min_operand: int = 0,
    max_operand: int = 50,
    operators: Sequence[str] = OPERATORS,
    min_answer: int = 0,
    max_answer: int = 99,
) -> list[dict[str, str]]:
    """Every problem ``a op b`` with operands and answer in range, in a fixed order.

    Returns:
        Rows ``{"prompt": "12+7=", "answer": "19"}``.
    """
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        raise ValueError(f"unknown operators {unknown}; valid: {list(OPERATORS)}")
    if min_operand > max_operand or min_answer > max_answer:
        raise ValueError(
            f"empty range: operands [{min_operand}, {max_operand}], answers "
            f"[{min_answer}, {max_answer}]; each minimum must be <= its maximum"
        )
    problems = []
    for op in operators:
        for a in range(min_operand, max_operand + 1):
            for b in range(min_operand, max_operand + 1):
                answer = a + b if op == "+" else a - b
                if min_answer <= answer <= max_answer:
                    problems.append({"prompt": f"{a}{op}{b}=", "answer": str(answer)})
    return problems


def generate_problems(n: int, seed: int, **ranges: Any) -> list[dict[str, str]]:
    """``n`` distinct problems, deterministic in ``seed``.

    Args:
        n: number of problems.
        seed: shuffling seed.
        **ranges: ``min_operand``, ``max_operand``, ``operators``, ``min_answer``,
            ``max_answer`` of :func:`enumerate_problems` (defaults: operands 0..50,
            answers 0..99, ``+`` and ``-``).

    Returns:
        Rows ``{"prompt": ..., "answer": ...}``.
    """
    pool = enumerate_problems(**ranges)
    if n > len(pool):
        raise ValueError(
            f"asked for {n} problems but only {len(pool)} distinct ones fit the ranges; "
            "widen max_operand/max_answer or ask for fewer"
        )
    random.Random(seed).shuffle(pool)
    return pool[:n]


def make_splits(
    n_train: int, n_test: int, seed: int, **ranges: Any
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Disjoint train and test problems (the first ``n_train`` of one shuffle, then test)."""
    problems = generate_problems(n_train + n_test, seed, **ranges)
    return problems[:n_train], problems[n_train:]


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line (UTF-8, ``\\n`` line ends)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def parse_integer(text: str) -> int | None:
    """The integer ``text`` spells (surrounding whitespace allowed), else ``None``."""
    match = _INTEGER.fullmatch(text)
    return int(match.group(1)) if match else None


def score(
    response: str, answer: str, *, partial_weight: float = 0.5, partial_scale: float = 10.0
) -> float:
    """Reward in [0, 1] of ``response`` for the integer ``answer`` (formula: module doc).

    Example: answer "19": "19" -> 1.0, "17" -> 0.5 * (1 - 2/10) = 0.4, "40" -> 0.0,
    "19 apples" -> 0.0.
    """
    target = parse_integer(answer)
    if target is None:
        raise ValueError(f"ground-truth answer {answer!r} is not an integer; fix the task data")
    predicted = parse_integer(response)
    if predicted is None:
        return 0.0
    if predicted == target:
        return 1.0
    return partial_weight * max(0.0, 1.0 - abs(predicted - target) / partial_scale)


@dataclass
class ArithmeticRewardConfig:
    """Options of the ``reward.arithmetic`` node (see :func:`score`).

    Attributes:
        partial_weight: the most a wrong integer can earn, in [0, 1).
        partial_scale: distance to the answer at which partial credit reaches 0.
    """

    partial_weight: float = 0.5
    partial_scale: float = 10.0

    def __post_init__(self) -> None:
        only_exact = " so only exact answers earn 1"
        check_range("partial_weight", self.partial_weight, 0, 1, high_open=True, note=only_exact)
        check_range("partial_scale", self.partial_scale, 0, low_open=True)
