"""The row-check pass of the prompt loader: which rows of a file are usable, and why not.

The rules (``REASONS``, which of them refuse the file) are described in
``embodied_rl.data.dataloader``. Each data-parallel rank may check one block of rows;
``merge_checks`` joins the blocks of all ranks into the whole file's result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from embodied_rl.data.prompt_files import JsonlSource, ParquetSource

_TOKENIZE_CHUNK = 1024  # prompts per count_tokens call
# Why a row is not used; a row's status byte is 1 + its reason's index (0: usable).
REASONS = ("malformed", "missing_field", "empty", "too_long")
REFUSED = ("malformed", "missing_field")  # errors unless on_bad_row="drop"


def answer_text(value: Any) -> str:
    """An answer as text: strings as they are, integers in digits, and a float that holds an
    integer as that integer (``19.0`` -> ``"19"``: a Parquet column of integers with a missing
    value is stored as float, and ``"19.0"`` would fail an integer reward); other floats in
    their shortest round-trip form (``2.5`` -> ``"2.5"``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return value if isinstance(value, str) else str(value)


def _answer_problem(value: Any) -> tuple[str, str] | None:
    """Why an answer value cannot be used: NaN (a Parquet null of a float column) is missing;
    only text and finite numbers are answers."""
    if isinstance(value, float) and value != value:
        return "missing_field", "lacks the required field 'answer' (NaN)"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return (
            "malformed",
            f"has an answer of type {type(value).__name__}, expected text or a number",
        )
    if isinstance(value, float) and not math.isfinite(value):
        return "malformed", f"has the answer {value}, expected text or a finite number"
    return None


def row_problem(record: Any, fields: Sequence[str]) -> tuple[str, str] | None:
    """``(reason, what is wrong)`` for a parsed row that cannot be used, else ``None``."""
    if not isinstance(record, dict):
        return "malformed", f"is not a JSON object (got {type(record).__name__})"
    for name in fields:
        if record.get(name) is None:
            return "missing_field", f"lacks the required field {name!r}"
    if "answer" in fields:
        problem = _answer_problem(record["answer"])
        if problem is not None:
            return problem
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        return "malformed", f"has a prompt of type {type(prompt).__name__}, expected a string"
    if not prompt.strip():
        return "empty", "has an empty prompt"
    return None


class RowCheck:
    """The row-check pass over rows ``first..stop-1`` of a source (the rules are in the
    docstring of ``embodied_rl.data.dataloader``).

    Attributes:
        status: one byte per row of the block: 0 usable, else 1 + the index in ``REASONS``.
        first_seen: per reason, the first ``(row, problem)`` in the block.
    """

    def __init__(
        self,
        source: JsonlSource | ParquetSource,
        fields: Sequence[str],
        first: int,
        stop: int,
        max_prompt_tokens: int | None,
        count_tokens: Callable[[list[str]], Sequence[int]] | None,
    ) -> None:
        self.first = first
        self.status = bytearray(stop - first)
        self.first_seen: dict[str, tuple[int, str]] = {}
        self._limit, self._count_tokens = max_prompt_tokens, count_tokens
        pending: list[tuple[int, str]] = []  # usable so far; their length is checked in chunks
        for row, record, error in source.scan(first, stop):
            problem = ("malformed", error) if error else row_problem(record, fields)
            if problem is not None:
                self._mark(row, *problem)
            elif max_prompt_tokens is not None:
                pending.append((row, record["prompt"]))
                if len(pending) == _TOKENIZE_CHUNK:
                    self._check_lengths(pending)
                    pending = []
        self._check_lengths(pending)

    def _mark(self, row: int, reason: str, problem: str) -> None:
        self.status[row - self.first] = 1 + REASONS.index(reason)
        self.first_seen.setdefault(reason, (row, problem))

    def _check_lengths(self, pending: list[tuple[int, str]]) -> None:
        if not pending or self._limit is None or self._count_tokens is None:
            return
        counts = self._count_tokens([prompt for _, prompt in pending])
        for (row, _), count in zip(pending, counts):
            if count > self._limit:
                self._mark(
                    row, "too_long", f"has a prompt of {count} tokens, more than {self._limit}"
                )


def merge_checks(
    parts: Sequence[tuple[int, bytes, dict[str, tuple[int, str]]]],
) -> tuple[bytes, dict[str, tuple[int, str]]]:
    """The whole file's status bytes and first problems from every rank's ``(dp_rank, ...)``."""
    ordered = sorted(parts, key=lambda part: part[0])
    status = b"".join(part[1] for part in ordered)
    first_seen: dict[str, tuple[int, str]] = {}
    for _, _, seen in ordered:
        for reason, found in seen.items():
            if reason not in first_seen or found[0] < first_seen[reason][0]:
                first_seen[reason] = found
    return status, first_seen


def check_file_head(
    source: JsonlSource | ParquetSource,
    fields: Sequence[str],
    on_bad_row: str,
    rows: int = 256,
    batch_size: int = 1,
) -> None:
    """The driver's quick check of a prompt file before workers start: the file opened (the
    caller did), its columns, the refused problems of its first ``rows`` rows, and that it
    holds ``batch_size`` usable rows (read on past the head only until it is known); the
    workers' full row-check pass still covers every row (and the prompt-length limit).

    Raises:
        ValueError: naming the file, the line or row, the problem and the fix.
    """
    if source.num_rows == 0:
        raise ValueError(f"{source.path} has no rows. Fix: give it rows with a prompt")
    missing = [f for f in fields if source.columns is not None and f not in source.columns]
    if missing:
        raise ValueError(
            f"{source.path} has no column(s) {missing} (columns: {sorted(source.columns)}). "
            "Fix: add them to the file, or set with_answers: false for data without answers"
        )
    check = RowCheck(source, fields, 0, min(rows, source.num_rows), None, None)
    refused = sorted(check.first_seen[r] for r in REFUSED if r in check.first_seen)
    if refused and on_bad_row == "error":
        row, problem = refused[0]
        raise ValueError(
            f"{source.path}: {source.where(row)} {problem}. Fix: correct or remove that row, or "
            "set on_bad_row: drop to skip such rows (counted as data/dropped_<reason>)"
        )
    check_one_batch(source, fields, check, batch_size)


def check_one_batch(
    source: JsonlSource | ParquetSource, fields: Sequence[str], head: RowCheck, batch_size: int
) -> None:
    """Refuse a file with fewer usable rows than one batch (all prompts empty, or too few
    rows), reading past the ``head`` block only as far as needed."""
    usable, checked = head.status.count(0), len(head.status)
    while usable < batch_size and checked < source.num_rows:
        stop = min(source.num_rows, checked + 4096)
        usable += RowCheck(source, fields, checked, stop, None, None).status.count(0)
        checked = stop
    if usable < batch_size:
        raise ValueError(
            f"{source.path} has {usable} usable prompt(s) of {source.num_rows} row(s) (empty "
            f"prompts and dropped rows do not count), fewer than one batch of {batch_size}. "
            "Fix: give the file at least that many rows with a prompt, or lower data.batch_size"
        )
