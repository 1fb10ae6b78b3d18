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

The file access lives in ``embodied_rl.data.prompt_files`` and the row checks in
``embodied_rl.data.prompt_checks``; this module holds the loader.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.prompt_checks import (
    REASONS,
    REFUSED,
    RowCheck,
    answer_text,
    merge_checks,
    row_problem,
)
from embodied_rl.data.prompt_files import RawRow, index_jsonl, open_source
from embodied_rl.data.sampler import EpochSampler

__all__ = ["REASONS", "Exchange", "ShardedPromptLoader", "index_jsonl"]

logger = logging.getLogger(__name__)

_BAD_ROW_MODES = ("error", "drop")

# all-gather over the data-parallel group: this rank's object in, every rank's out
Exchange = Callable[[Any], list[Any]]


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
        self._source = open_source(self.path, self._fields)
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
        check = RowCheck(self._source, self._fields, first, stop, max_prompt_tokens, count_tokens)
        mine = (dp_rank, bytes(check.status), check.first_seen)
        return merge_checks(exchange(mine) if share else [mine])

    def _refuse_or_warn(self, first_seen: dict[str, tuple[int, str]], dp_rank: int) -> None:
        """Raise for the first refused row; otherwise warn once (rank 0) about dropped rows."""
        refused = [first_seen[r] for r in REFUSED if r in first_seen]
        if refused and self.on_bad_row == "error":
            row, problem = min(refused)
            count = sum(self.dropped.get(r, 0) for r in REFUSED)
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
        self, rows: Sequence[int], sample_ids: Sequence[int], records: Sequence[RawRow]
    ) -> TensorDict:
        prompts, answers = [], []
        for row, (record, error) in zip(rows, records):
            problem = error or row_problem(record, self._fields)
            if problem is not None:  # the row passed the checks: the file changed since
                raise ValueError(
                    f"{self.path}: {self._source.where(row)} {problem} but passed the checks "
                    "when the loader started; the file changed during the run. Restore it, or "
                    "start a fresh run"
                )
            prompts.append(record["prompt"])
            if self._has_answer:
                answers.append(answer_text(record["answer"]))
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
