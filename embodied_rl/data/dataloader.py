"""Distributed prompt loader: each data-parallel rank reads only its own rows of a file.

The global order is a pure function of ``(seed, epoch, step_in_epoch)``: epoch ``e`` uses the
permutation ``torch.randperm(N, generator=manual_seed(seed + e))`` of all row indices, global
step ``k`` of the epoch takes ``perm[k*B:(k+1)*B]`` and data-parallel rank ``d`` takes the
``d``-th contiguous slice of ``B / dp_size`` of it. No rank needs to talk to another to agree on
the order, and a rank opens and parses only the rows of its slice.

Supported files:

- JSONL: one JSON object per line. The loader indexes the byte offset of every line once (a
  scan for ``b"\\n"``, no JSON parsing) and afterwards seeks to and parses only the rows it
  needs. Blank lines are not rows.
- Parquet: read through ``pyarrow.parquet.ParquetFile``; for each step only the row groups
  holding this rank's rows are read, and only the needed rows are converted to Python.

Fields: ``prompt`` becomes ``keys.PROMPT_TEXT``, ``answer`` (when the file has it) becomes
``keys.ANSWER_TEXT``; ``keys.SAMPLE_ID`` is ``k * B + position`` for the loader's k-th global
batch (unique over the run on all ranks together) and ``keys.ROW_INDEX`` is the row's index
in the file.
"""

from __future__ import annotations

import bisect
import json
import logging
from array import array
from collections.abc import Iterator, Sequence
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
_BAD_ROW_MODES = ("error", "drop")

# (parsed record or None, error text or None) for one requested row
_RawRow = tuple[Any, "str | None"]


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


class _JsonlSource:
    """Random access to the rows of a JSONL file through a line-offset index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size
        self._starts, self._lengths, self._line_numbers = index_jsonl(path)
        self.num_rows = len(self._starts)
        self.columns: frozenset[str] | None = None  # unknown until rows are parsed
        self.rows_parsed = 0

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
                raw = f.read(self._lengths[rows[i]])
                self.rows_parsed += 1
                try:
                    out[i] = (json.loads(raw), None)
                except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
                    out[i] = (None, f"is not valid JSON ({err})")
        return out


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


def _open_source(path: Path, wanted_columns: Sequence[str]) -> _JsonlSource | _ParquetSource:
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist; check the data path config")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _JsonlSource(path)
    if suffix in (".parquet", ".pq"):
        return _ParquetSource(path, wanted_columns)
    raise ValueError(f"prompt file {path} has an unknown suffix {suffix!r}; use .jsonl or .parquet")


def _row_problem(record: Any, fields: Sequence[str]) -> str | None:
    """Why a parsed row cannot be used, or ``None`` when it is fine."""
    if not isinstance(record, dict):
        return f"is not a JSON object (got {type(record).__name__})"
    for name in fields:
        if record.get(name) is None:
            return f"lacks the required field {name!r}"
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        return f"has a prompt of type {type(prompt).__name__}, expected a string"
    if not prompt.strip():
        return "has an empty prompt"
    return None


class ShardedPromptLoader:
    """Yields this data-parallel rank's share of every global prompt batch.

    The loader is a pure function of its position ``(epoch, step_in_epoch)``: epochs advance
    by themselves when the rows run out, and ``state_dict``/``load_state_dict`` move the
    position, so a resumed run sees the same batches as an uninterrupted one. The state holds
    global positions only, so it may be loaded with a different ``dp_size``.

    Bad rows (invalid JSON, a missing required field, an empty prompt) raise ``ValueError``
    naming the file, the line and the fix; with ``on_bad_row="drop"`` they are removed from
    the batch instead (so that rank's batch is shorter), counted in ``dropped_rows`` and logged.
    When the first valid row has an ``answer``, ``answer`` is required of every row, so all
    ranks agree on whether batches carry ``keys.ANSWER_TEXT``.

    Attributes:
        num_rows: rows in the file.
        steps_per_epoch: global steps per epoch.
        epoch / step_in_epoch: the position of the next batch.
        dropped_rows: bad rows dropped so far (each time one is met).
        rows_parsed: rows this loader parsed or converted so far, for checking sharding.
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
    ) -> None:
        """Index the file (JSONL) or read its metadata (Parquet); no rows are loaded yet.

        Args:
            path: a ``.jsonl`` or ``.parquet`` file.
            global_batch_size: prompts per step over all data-parallel ranks (``B``).
            dp_rank / dp_size: this rank's place in the data-parallel group.
            seed: shuffling seed; epoch ``e`` is shuffled with ``seed + e``.
            shuffle: ``False`` keeps file order in every epoch.
            required_fields: fields each row must have (``prompt`` is always required).
            drop_last: skip the partial last batch of an epoch; with ``False`` it is filled
                up with rows from the start of the same epoch's order, so every step has
                ``B`` rows.
            on_bad_row: ``"error"`` (default: raise ``ValueError``) or ``"drop"``.
        """
        if on_bad_row not in _BAD_ROW_MODES:
            raise ValueError(f"on_bad_row must be one of {_BAD_ROW_MODES}, got {on_bad_row!r}")
        self.path = Path(path)
        self.on_bad_row = on_bad_row
        fields = tuple(dict.fromkeys(("prompt", *required_fields)))
        self._source = _open_source(self.path, (*fields, "answer"))
        self._check_columns(fields)
        self.num_rows = self._source.num_rows
        self.sampler = EpochSampler(
            self.num_rows,
            global_batch_size=global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            source=str(self.path),
        )
        self.dropped_rows = 0
        self._has_answer = self._probe_answer(fields)
        self._fields = fields + (("answer",) if self._has_answer else ())

    @property
    def rows_parsed(self) -> int:
        return self._source.rows_parsed

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
        """The order of all row indices in ``epoch`` (the same on every rank)."""
        return self.sampler.permutation(epoch)

    def global_rows(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        """Row indices of the whole global batch at a position (all ranks together)."""
        return self.sampler.global_rows(epoch, step_in_epoch)

    def _check_columns(self, fields: Sequence[str]) -> None:
        columns = self._source.columns
        missing = [f for f in fields if columns is not None and f not in columns]
        if missing:
            raise ValueError(
                f"{self.path} has no column(s) {missing} (columns: {sorted(columns or ())}); "
                "add them to the file or remove them from required_fields"
            )

    def _probe_answer(self, fields: Sequence[str]) -> bool:
        """Whether the file carries answers: the schema, or the first valid JSONL row."""
        if self._source.columns is not None:
            return "answer" in self._source.columns
        for row in range(self.num_rows):
            record, error = self._source.read([row])[0]
            error = error or _row_problem(record, fields)
            if error is None:
                return "answer" in record
            if self.on_bad_row == "error":
                self._bad_row(row, error)
            # In drop mode the bad row is counted and logged when a batch meets it.
        raise ValueError(f"{self.path} has no valid rows; every row was bad (see the log)")

    def _bad_row(self, row: int, problem: str) -> None:
        """Raise for a bad row, or count and log it in drop mode."""
        message = f"{self.path}: {self._source.where(row)} {problem}"
        if self.on_bad_row == "error":
            raise ValueError(
                f"{message}. Fix or remove that row, or pass on_bad_row='drop' to skip bad "
                "rows (they are counted in dropped_rows and logged)"
            )
        self.dropped_rows += 1
        logger.warning("dropping bad prompt row: %s", message)

    def next_batch(self) -> TensorDict:
        """This rank's rows of the next global step, as a batch; advances the position."""
        rows, sample_ids = self.sampler.current()
        batch = self._to_batch(rows, sample_ids, self._source.read(rows))
        # Advance only after the rows were read, so a raised error leaves the position as is.
        self.sampler.advance()
        return batch

    def _to_batch(
        self, rows: Sequence[int], positions: Sequence[int], records: Sequence[_RawRow]
    ) -> TensorDict:
        kept_rows, kept_positions, prompts, answers = [], [], [], []
        for row, position, (record, error) in zip(rows, positions, records):
            error = error or _row_problem(record, self._fields)
            if error is not None:
                self._bad_row(row, error)
                continue
            kept_rows.append(row)
            kept_positions.append(position)
            prompts.append(record["prompt"])
            if self._has_answer:
                answer = record["answer"]
                answers.append(answer if isinstance(answer, str) else str(answer))
        fields: dict[str, Any] = {
            K.PROMPT_TEXT: prompts,
            K.SAMPLE_ID: torch.tensor(kept_positions, dtype=torch.int64),
            K.ROW_INDEX: torch.tensor(kept_rows, dtype=torch.int64),
        }
        if self._has_answer:
            fields[K.ANSWER_TEXT] = answers
        return make_batch(fields, batch_size=len(kept_rows))

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        return self.next_batch()

    def fingerprint(self) -> dict[str, Any]:
        """What identifies the data file: its name, size in bytes and row count."""
        return {"name": self.path.name, "size": self._source.size, "rows": self.num_rows}

    def state_dict(self) -> dict[str, Any]:
        """The position and the settings it depends on; plain Python values only."""
        state = self.sampler.state_dict()
        state.update(dropped_rows=self.dropped_rows, file=self.fingerprint())
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
        self.dropped_rows = int(state["dropped_rows"])

    def _check_same_file(self, saved: dict[str, Any]) -> None:
        current = self.fingerprint()
        if (saved["size"], saved["rows"]) != (current["size"], current["rows"]):
            raise ValueError(
                f"loader state was saved for {saved['name']} with {saved['size']} bytes and "
                f"{saved['rows']} rows, but {self.path} has {current['size']} bytes and "
                f"{current['rows']} rows; resume with the same data file or start a fresh run"
            )
