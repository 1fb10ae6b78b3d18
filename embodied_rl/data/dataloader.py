"""Distributed prompt loader: each data-parallel rank reads only its own rows of a file.

The global order is a pure function of ``(seed, epoch, step_in_epoch)``: epoch ``e`` uses the
permutation ``torch.randperm(U, generator=manual_seed(seed + e))`` of the ``U`` usable rows
(see below), global step ``k`` of the epoch takes ``perm[k*B:(k+1)*B]`` and data-parallel rank
``d`` takes the ``d``-th contiguous slice of ``B / dp_size`` of it. No rank needs to talk to
another to agree on the order, and at each step a rank opens and parses only its own rows.

Supported files:

- JSONL: one JSON object per line. The loader indexes the byte offset of every line once (a
  scan for ``b"\\n"``, no JSON parsing) and afterwards seeks to and parses only the rows it
  needs. Blank lines are not rows.
- Parquet: read through ``pyarrow.parquet.ParquetFile``; for each step only the row groups
  holding this rank's rows are read, and only the needed rows are converted to Python.

Fields: ``prompt`` becomes ``keys.PROMPT_TEXT``, ``answer`` (when ``required_fields`` names
it) becomes ``keys.ANSWER_TEXT``; ``keys.SAMPLE_ID`` is ``k * B + position`` for the loader's
k-th global batch (unique over the run on all ranks together) and ``keys.ROW_INDEX`` is the
row's index in the file.

Row checks: when the loader is built, one pass over the file decides which rows are usable,
so bad data fails at start-up rather than hours into a run, every step has full batches, and
every rank agrees on the usable rows (hence on the epoch length and the order):

- ``malformed`` (invalid JSON, not an object, a prompt that is not a string) and
  ``missing_field`` (a required field absent or null) refuse the file: ``ValueError`` naming
  the file, the line (JSONL, 1-based) or row (Parquet, 0-based), the field and the fix. With
  ``on_bad_row="drop"`` such rows are dropped and counted instead.
- ``empty`` (an empty or whitespace-only prompt) is dropped and counted: the row asks
  nothing, and one such row should not stop a large data set.
- ``too_long`` (more than ``max_prompt_tokens`` tokens) is dropped and counted: cutting the
  prompt would silently change the task, and the rollout refuses it mid-run.

Drops are never silent: a warning names the counts and the first line of each reason, and
``dropped`` holds the counts (the data node logs them as ``data/dropped_<reason>``). The
pass is shared out: given an ``exchange`` (an all-gather over the data-parallel group), each
rank checks only its contiguous ``1/dp_size`` block of rows and the ranks swap the results
(one byte per row); without one, a loader checks every row itself.
"""

from __future__ import annotations

import bisect
import json
import logging
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.sampler import EpochSampler

logger = logging.getLogger(__name__)

_INDEX_CHUNK_BYTES = 1 << 20
_CHECK_BLOCK_BYTES = 1 << 22  # bytes read at once by the row-check pass over a JSONL file
_TOKENIZE_CHUNK = 1024  # prompts per count_tokens call
_BAD_ROW_MODES = ("error", "drop")
# Why a row is not used; a row's status byte is 1 + its reason's index (0: usable).
REASONS = ("malformed", "missing_field", "empty", "too_long")
_REFUSED = ("malformed", "missing_field")  # errors unless on_bad_row="drop"

# (parsed record or None, error text or None) for one requested row
_RawRow = tuple[Any, "str | None"]
# all-gather over the data-parallel group: this rank's object in, every rank's out
Exchange = Callable[[Any], list[Any]]


def index_jsonl(path: Path, chunk_bytes: int = _INDEX_CHUNK_BYTES) -> tuple[array, array, array]:
    """Byte offset, byte length and 1-based line number of every non-blank line of a file.

    The file is read in chunks and scanned for ``b"\\n"``; nothing is JSON-parsed, so indexing
    a large file costs one sequential read.

    Args:
        path: the JSONL file.
        chunk_bytes: read size; lines longer than a chunk are carried over to the next one.

    Returns:
        ``(starts, lengths, line_numbers)`` as ``array("q")``, one entry per row.
    """
    starts, lengths, line_numbers = array("q"), array("q"), array("q")
    carry, carry_offset, line_no = b"", 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            data = carry + chunk
            pos = 0
            while (newline := data.find(b"\n", pos)) != -1:
                line_no += 1
                if data[pos:newline].strip():
                    starts.append(carry_offset + pos)
                    lengths.append(newline - pos)
                    line_numbers.append(line_no)
                pos = newline + 1
            carry, carry_offset = data[pos:], carry_offset + pos
    if carry.strip():  # last line without a trailing newline
        starts.append(carry_offset)
        lengths.append(len(carry))
        line_numbers.append(line_no + 1)
    return starts, lengths, line_numbers


def _parse_json(raw: bytes) -> _RawRow:
    try:
        return json.loads(raw), None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        return None, f"is not valid JSON ({err})"


class _JsonlSource:
    """Random access to the rows of a JSONL file through a line-offset index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._starts, self._lengths, self._line_numbers = index_jsonl(path)
        self.num_rows = len(self._starts)
        self.columns: frozenset[str] | None = None  # unknown until rows are parsed
        self.rows_parsed = 0
        self.rows_checked = 0

    def where(self, row: int) -> str:
        return f"line {self._line_numbers[row]}"

    def read(self, rows: Sequence[int]) -> list[_RawRow]:
        """Parse the given rows, in the given order; a row that fails to parse gets an error."""
        out: list[_RawRow] = [(None, None)] * len(rows)
        # Visit rows in file order so the reads move forward through the file.
        order = sorted(range(len(rows)), key=lambda i: self._starts[rows[i]])
        with open(self.path, "rb") as f:
            for i in order:
                f.seek(self._starts[rows[i]])
                out[i] = _parse_json(f.read(self._lengths[rows[i]]))
                self.rows_parsed += 1
        return out

    def scan(self, first: int, stop: int) -> Iterator[tuple[int, Any, str | None]]:
        """``(row, record, error)`` for rows ``first..stop-1``, read in large sequential pieces."""
        with open(self.path, "rb") as f:
            row = first
            while row < stop:
                base, end = self._starts[row], row + 1
                while end < stop and self._starts[end] + self._lengths[end] - base <= (
                    _CHECK_BLOCK_BYTES
                ):
                    end += 1
                f.seek(base)
                data = f.read(self._starts[end - 1] + self._lengths[end - 1] - base)
                for r in range(row, end):
                    offset = self._starts[r] - base
                    self.rows_checked += 1
                    yield r, *_parse_json(data[offset : offset + self._lengths[r]])
                row = end


class _ParquetSource:
    """Row access to a Parquet file: reads only the row groups that hold requested rows."""

    def __init__(self, path: Path, wanted_columns: Sequence[str]) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._file = pq.ParquetFile(path)
        metadata = self._file.metadata
        self.num_rows = metadata.num_rows
        self.columns = frozenset(self._file.schema_arrow.names)
        self._read_columns = [c for c in dict.fromkeys(wanted_columns) if c in self.columns]
        self._group_starts = [0]
        for g in range(metadata.num_row_groups):
            self._group_starts.append(self._group_starts[-1] + metadata.row_group(g).num_rows)
        self.rows_parsed = 0
        self.rows_checked = 0

    def where(self, row: int) -> str:
        return f"row {row} (0-based)"

    def _group_of(self, row: int) -> int:
        return bisect.bisect_right(self._group_starts, row) - 1

    def read(self, rows: Sequence[int]) -> list[_RawRow]:
        """Rows as dicts of the wanted columns, in the given order."""
        by_group: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_group.setdefault(self._group_of(row), []).append(i)
        out: list[_RawRow] = [(None, None)] * len(rows)
        for group, positions in sorted(by_group.items()):
            table = self._file.read_row_group(group, columns=self._read_columns)
            local = pa.array([rows[i] - self._group_starts[group] for i in positions])
            for i, record in zip(positions, table.take(local).to_pylist()):
                out[i] = (record, None)
            self.rows_parsed += len(positions)
        return out

    def scan(self, first: int, stop: int) -> Iterator[tuple[int, Any, str | None]]:
        """``(row, record, None)`` for rows ``first..stop-1``, one row group at a time."""
        if first >= stop:
            return
        for group in range(self._group_of(first), self._group_of(stop - 1) + 1):
            start = self._group_starts[group]
            lo, hi = max(first, start), min(stop, self._group_starts[group + 1])
            table = self._file.read_row_group(group, columns=self._read_columns)
            for i, record in enumerate(table.slice(lo - start, hi - lo).to_pylist()):
                self.rows_checked += 1
                yield lo + i, record, None


def _open_source(path: Path, wanted_columns: Sequence[str]) -> _JsonlSource | _ParquetSource:
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist; check the data path config")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _JsonlSource(path)
    if suffix in (".parquet", ".pq"):
        return _ParquetSource(path, wanted_columns)
    raise ValueError(f"prompt file {path} has an unknown suffix {suffix!r}; use .jsonl or .parquet")


def _row_problem(record: Any, fields: Sequence[str]) -> tuple[str, str] | None:
    """``(reason, what is wrong)`` for a parsed row that cannot be used, else ``None``."""
    if not isinstance(record, dict):
        return "malformed", f"is not a JSON object (got {type(record).__name__})"
    for name in fields:
        if record.get(name) is None:
            return "missing_field", f"lacks the required field {name!r}"
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        return "malformed", f"has a prompt of type {type(prompt).__name__}, expected a string"
    if not prompt.strip():
        return "empty", "has an empty prompt"
    return None


class _RowCheck:
    """The row-check pass over rows ``first..stop-1`` of a source (see the module docstring).

    Attributes:
        status: one byte per row of the block: 0 usable, else 1 + the index in ``REASONS``.
        first_seen: per reason, the first ``(row, problem)`` in the block.
    """

    def __init__(
        self,
        source: _JsonlSource | _ParquetSource,
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
            problem = ("malformed", error) if error else _row_problem(record, fields)
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


def _merge_checks(
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


class ShardedPromptLoader:
    """Yields this data-parallel rank's share of every global prompt batch.

    The loader is a pure function of its position ``(epoch, step_in_epoch)``: epochs advance
    by themselves when the rows run out, and ``state_dict``/``load_state_dict`` move the
    position, so a resumed run sees the same batches as an uninterrupted one. The state holds
    global positions only, so it may be loaded with a different ``dp_size``.

    Attributes:
        num_rows: rows in the file.
        num_usable: rows left after the row checks; epochs and the order are over these.
        dropped: rows dropped by the row checks, per reason (``REASONS``; absent when 0).
        steps_per_epoch: global steps per epoch.
        epoch / step_in_epoch: the position of the next batch.
        rows_parsed: rows this loader parsed for batches so far, for checking sharding.
        rows_checked: rows this loader parsed in the row-check pass.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        required_fields: Sequence[str] = ("prompt",),
        drop_last: bool = True,
        on_bad_row: str = "error",
        max_prompt_tokens: int | None = None,
        count_tokens: Callable[[list[str]], Sequence[int]] | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        """Index the file, check its rows (see the module docstring); no batch is loaded yet.

        Args:
            path: a ``.jsonl`` or ``.parquet`` file.
            global_batch_size: prompts per step over all data-parallel ranks (``B``).
            dp_rank / dp_size: this rank's place in the data-parallel group.
            seed: shuffling seed; epoch ``e`` is shuffled with ``seed + e``.
            shuffle: ``False`` keeps file order in every epoch.
            required_fields: fields each row must have (``prompt`` is always required);
                ``answer`` among them makes batches carry ``keys.ANSWER_TEXT``.
            drop_last: skip the partial last batch of an epoch; with ``False`` it is filled
                up with rows from the start of the same epoch's order, so every step has
                ``B`` rows.
            on_bad_row: ``"error"`` (default: a malformed row or a missing field raises
                ``ValueError``) or ``"drop"`` (they are dropped and counted).
            max_prompt_tokens: drop (and count) prompts with more tokens; needs
                ``count_tokens``. ``None``: no length check.
            count_tokens: token counts of a list of prompts, as the rollout tokenizes them.
            exchange: all-gather over the data-parallel group (every rank calls it once,
                with its ``(dp_rank, ...)`` tuple); with it each rank checks only its block.

        Raises:
            ValueError: a refused row (file and line), no usable rows, or a bad layout.
        """
        if on_bad_row not in _BAD_ROW_MODES:
            raise ValueError(f"on_bad_row must be one of {_BAD_ROW_MODES}, got {on_bad_row!r}")
        if (max_prompt_tokens is None) != (count_tokens is None):
            raise ValueError("max_prompt_tokens and count_tokens go together; pass both or none")
        self.path = Path(path)
        self.on_bad_row = on_bad_row
        self._fields = tuple(dict.fromkeys(("prompt", *required_fields)))
        self._has_answer = "answer" in self._fields
        self._source = _open_source(self.path, self._fields)
        self._check_columns(self._fields)
        self.num_rows = self._source.num_rows
        status, first_seen = self._check_rows(
            dp_rank, dp_size, max_prompt_tokens, count_tokens, exchange
        )
        self.dropped = {r: status.count(1 + i) for i, r in enumerate(REASONS) if 1 + i in status}
        self._refuse_or_warn(first_seen, dp_rank)
        self._usable = array("q", (row for row, code in enumerate(status) if code == 0))
        self.num_usable = len(self._usable)
        if self.num_usable == 0:
            raise ValueError(
                f"{self.path} has no usable rows ({self._summary()}); give it rows with a "
                "non-empty prompt" + (" that fits max_prompt_tokens" if max_prompt_tokens else "")
            )
        self.sampler = EpochSampler(
            self.num_usable,
            global_batch_size=global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            source=f"{self.path} (usable rows: {self._summary()})",
        )

    @property
    def rows_parsed(self) -> int:
        return self._source.rows_parsed

    @property
    def rows_checked(self) -> int:
        return self._source.rows_checked

    # The position and layout live in the sampler; these read them for callers and tests.
    global_batch_size = property(lambda self: self.sampler.global_batch_size)
    dp_rank = property(lambda self: self.sampler.dp_rank)
    dp_size = property(lambda self: self.sampler.dp_size)
    seed = property(lambda self: self.sampler.seed)
    shuffle = property(lambda self: self.sampler.shuffle)
    drop_last = property(lambda self: self.sampler.drop_last)
    steps_per_epoch = property(lambda self: self.sampler.steps_per_epoch)
    local_batch_size = property(lambda self: self.sampler.local_batch_size)
    epoch = property(lambda self: self.sampler.epoch)
    step_in_epoch = property(lambda self: self.sampler.step_in_epoch)

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of all file row indices in ``epoch`` (the same on every rank)."""
        return torch.tensor(self._usable.tolist(), dtype=torch.int64)[
            self.sampler.permutation(epoch)
        ]

    def global_rows(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        """File row indices of the whole global batch at a position (all ranks together)."""
        positions = self.sampler.global_rows(epoch, step_in_epoch)
        return torch.tensor([self._usable[p] for p in positions.tolist()], dtype=torch.int64)

    def _check_columns(self, fields: Sequence[str]) -> None:
        columns = self._source.columns
        missing = [f for f in fields if columns is not None and f not in columns]
        if missing:
            raise ValueError(
                f"{self.path} has no column(s) {missing} (columns: {sorted(columns or ())}); "
                "add them to the file or remove them from required_fields"
            )

    def _check_rows(
        self,
        dp_rank: int,
        dp_size: int,
        max_prompt_tokens: int | None,
        count_tokens: Callable[[list[str]], Sequence[int]] | None,
        exchange: Exchange | None,
    ) -> tuple[bytes, dict[str, tuple[int, str]]]:
        """Status byte of every row and the first problem per reason (all ranks agree)."""
        n, share = self.num_rows, exchange is not None and dp_size > 1
        first, stop = (n * dp_rank // dp_size, n * (dp_rank + 1) // dp_size) if share else (0, n)
        check = _RowCheck(self._source, self._fields, first, stop, max_prompt_tokens, count_tokens)
        mine = (dp_rank, bytes(check.status), check.first_seen)
        return _merge_checks(exchange(mine) if share else [mine])

    def _refuse_or_warn(self, first_seen: dict[str, tuple[int, str]], dp_rank: int) -> None:
        """Raise for the first refused row; otherwise warn once (rank 0) about dropped rows."""
        refused = [first_seen[r] for r in _REFUSED if r in first_seen]
        if refused and self.on_bad_row == "error":
            row, problem = min(refused)
            count = sum(self.dropped.get(r, 0) for r in _REFUSED)
            raise ValueError(
                f"{self.path}: {self._source.where(row)} {problem} ({count} such row(s) in the "
                "file). Fix or remove those rows, or set on_bad_row='drop' to skip them (they "
                "are counted as data/dropped_malformed and data/dropped_missing_field)"
            )
        if self.dropped and dp_rank == 0:
            firsts = "; ".join(
                f"{reason}: first at {self._source.where(first_seen[reason][0])}, which "
                f"{first_seen[reason][1]}"
                for reason in self.dropped
            )
            logger.warning("%s: dropped rows (%s). %s", self.path, self._summary(), firsts)

    def _summary(self) -> str:
        drops = ", ".join(f"{count} {reason}" for reason, count in self.dropped.items())
        usable = self.num_rows - sum(self.dropped.values())
        return f"{usable} of {self.num_rows}" + (f"; dropped {drops}" if drops else "")

    def next_batch(self) -> TensorDict:
        """This rank's rows of the next global step, as a batch; advances the position."""
        positions, sample_ids = self.sampler.current()
        rows = [self._usable[p] for p in positions]
        batch = self._to_batch(rows, sample_ids, self._source.read(rows))
        # Advance only after the rows were read, so a raised error leaves the position as is.
        self.sampler.advance()
        return batch

    def _to_batch(
        self, rows: Sequence[int], sample_ids: Sequence[int], records: Sequence[_RawRow]
    ) -> TensorDict:
        prompts, answers = [], []
        for row, (record, error) in zip(rows, records):
            problem = error or _row_problem(record, self._fields)
            if problem is not None:  # the row passed the checks: the file changed since
                raise ValueError(
                    f"{self.path}: {self._source.where(row)} {problem} but passed the checks "
                    "when the loader started; the file changed during the run. Restore it, or "
                    "start a fresh run"
                )
            prompts.append(record["prompt"])
            if self._has_answer:
                answer = record["answer"]
                answers.append(answer if isinstance(answer, str) else str(answer))
        fields: dict[str, Any] = {
            K.PROMPT_TEXT: prompts,
            K.SAMPLE_ID: torch.tensor(list(sample_ids), dtype=torch.int64),
            K.ROW_INDEX: torch.tensor(list(rows), dtype=torch.int64),
        }
        if self._has_answer:
            fields[K.ANSWER_TEXT] = answers
        return make_batch(fields, batch_size=len(rows))

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        return self.next_batch()

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data: file name, size in bytes, rows and usable rows."""
        return {
            "name": self.path.name,
            "size": self._source.size,
            "rows": self.num_rows,
            "usable": self.num_usable,
        }

    def state_dict(self) -> dict[str, Any]:
        """The position and the settings it depends on; plain Python values only."""
        state = self.sampler.state_dict()
        state.update(dropped=dict(self.dropped), file=self.fingerprint())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses a different file or batch layout.

        The saved seed wins over the constructor's (a warning says so when they differ),
        because the resumed run must see the batches the interrupted one would have seen.
        """
        self._check_same_file(state["file"])
        if state["seed"] != self.seed:
            logger.warning("resuming loader with saved seed %s, not %s", state["seed"], self.seed)
        self.sampler.load_state_dict(state)

    def _check_same_file(self, saved: dict[str, Any]) -> None:
        current = self.fingerprint()
        if (saved["size"], saved["rows"]) != (current["size"], current["rows"]):
            raise ValueError(
                f"loader state was saved for {saved['name']} with {saved['size']} bytes and "
                f"{saved['rows']} rows, but {self.path} has {current['size']} bytes and "
                f"{current['rows']} rows; resume with the same data file or start a fresh run"
            )
        if saved.get("usable", current["usable"]) != current["usable"]:
            raise ValueError(
                f"loader state was saved when {saved['usable']} rows of {self.path.name} were "
                f"usable, now {current['usable']} are; the row checks changed (e.g. "
                "max_prompt_length or the tokenizer). Resume with the same settings or start "
                "a fresh run"
            )
