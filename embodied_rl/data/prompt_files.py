"""Random access to the rows of a prompt file, JSONL or Parquet (``open_source``).

A source parses only the rows asked for: ``read`` for a batch's rows, ``scan`` for a block
of rows in file order (the row-check pass). How the loader uses them, and what each file
type must hold, is described in ``embodied_rl.data.dataloader``.
"""

from __future__ import annotations

import bisect
import json
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_INDEX_CHUNK_BYTES = 1 << 20
_CHECK_BLOCK_BYTES = 1 << 22  # bytes read at once by the row-check pass over a JSONL file

# (parsed record or None, error text or None) for one requested row
RawRow = tuple[Any, "str | None"]


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


def _parse_json(raw: bytes) -> RawRow:
    try:
        return json.loads(raw), None
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        return None, f"is not valid JSON ({err})"


class JsonlSource:
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

    def read(self, rows: Sequence[int]) -> list[RawRow]:
        """Parse the given rows, in the given order; a row that fails to parse gets an error."""
        out: list[RawRow] = [(None, None)] * len(rows)
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


class ParquetSource:
    """Row access to a Parquet file: reads only the row groups that hold requested rows."""

    def __init__(self, path: Path, wanted_columns: Sequence[str]) -> None:
        self.path = path
        self.size = path.stat().st_size
        try:
            self._file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:  # not Parquet: garbage, truncated, empty
            raise ValueError(
                f"{path} cannot be read as Parquet ({type(err).__name__}: {err}). Fix: "
                "write it again (e.g. pandas DataFrame.to_parquet), or give a JSONL file"
            ) from None
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

    def read(self, rows: Sequence[int]) -> list[RawRow]:
        """Rows as dicts of the wanted columns, in the given order."""
        by_group: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_group.setdefault(self._group_of(row), []).append(i)
        out: list[RawRow] = [(None, None)] * len(rows)
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


def open_source(path: Path, wanted_columns: Sequence[str]) -> JsonlSource | ParquetSource:
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist; check the data path config")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return JsonlSource(path)
    if suffix in (".parquet", ".pq"):
        return ParquetSource(path, wanted_columns)
    raise ValueError(f"prompt file {path} has an unknown suffix {suffix!r}; use .jsonl or .parquet")
