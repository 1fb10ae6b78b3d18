"""Which rows a data-parallel rank takes at each global step (prompts, task manifests, ...).

Every rank computes the same per-epoch permutation (seeded with ``seed + epoch``); global step
``k`` of an epoch uses ``perm[k*B : (k+1)*B]`` and rank ``d`` takes the ``d``-th contiguous
slice of ``B / dp_size``. The position ``(epoch, step_in_epoch)`` is the whole state, so a
resumed run sees the batches the interrupted one would have seen.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def check_layout(global_batch_size: int, dp_rank: int, dp_size: int) -> None:
    """Clear errors for a batch that cannot be split over the data-parallel ranks."""
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"need 0 <= dp_rank < dp_size, got dp_rank={dp_rank}, dp_size={dp_size}")
    if global_batch_size < 1 or global_batch_size % dp_size != 0:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a positive multiple of "
            f"dp_size={dp_size}; change the batch size to a multiple of {dp_size} (e.g. "
            f"{max(dp_size, global_batch_size // dp_size * dp_size)}) or change the layout"
        )


class EpochSampler:
    """Deterministic, sharded, resumable order over ``num_rows`` rows.

    Attributes:
        steps_per_epoch: global steps per epoch.
        epoch / step_in_epoch: the position of the next batch.
    """

    def __init__(
        self,
        num_rows: int,
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = True,
        source: str = "the data",
    ) -> None:
        """Args:
        num_rows: rows to draw from.
        global_batch_size: rows per step over all ranks (``B``).
        dp_rank / dp_size: this rank's place in the data-parallel group.
        seed: epoch ``e`` is shuffled with ``seed + e``.
        shuffle: ``False`` keeps row order in every epoch.
        drop_last: skip a partial last batch; with ``False`` it is filled up with rows from
            the start of the same epoch's order, so every step has ``B`` rows.
        source: how error messages name what the rows come from.
        """
        check_layout(global_batch_size, dp_rank, dp_size)
        self.num_rows, self.global_batch_size = num_rows, global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        steps = (
            num_rows // global_batch_size if drop_last else math.ceil(num_rows / global_batch_size)
        )
        if steps == 0:
            raise ValueError(
                f"{source} has {num_rows} rows, fewer than global_batch_size={global_batch_size}; "
                "lower the batch size, add rows, or pass drop_last=False to repeat rows within "
                "an epoch"
            )
        self.steps_per_epoch = steps
        self.epoch, self.step_in_epoch = 0, 0
        self._perm: tuple[int, torch.Tensor] | None = None

    @property
    def local_batch_size(self) -> int:
        return self.global_batch_size // self.dp_size

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of all row indices in ``epoch`` (the same on every rank)."""
        if self._perm is None or self._perm[0] != epoch:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                perm = torch.randperm(self.num_rows, generator=generator)
            else:
                perm = torch.arange(self.num_rows)
            self._perm = (epoch, perm)
        return self._perm[1]

    def global_rows(self, epoch: int, step_in_epoch: int) -> torch.Tensor:
        """Row indices of the whole global batch at a position (all ranks together)."""
        start = step_in_epoch * self.global_batch_size
        # The modulo only matters with drop_last=False (filling the last batch).
        positions = torch.arange(start, start + self.global_batch_size) % self.num_rows
        return self.permutation(epoch)[positions]

    def current(self) -> tuple[list[int], range]:
        """This rank's rows of the next step and their sample ids (unique over the run).

        Sample ids are ``k * B + position`` for the k-th global batch, so batches drawn again
        within one training step (dynamic-sampling refills) never share an id.
        """
        b = self.local_batch_size
        first = self.dp_rank * b
        rows = self.global_rows(self.epoch, self.step_in_epoch)[first : first + b].tolist()
        offset = (self.epoch * self.steps_per_epoch + self.step_in_epoch) * self.global_batch_size
        return rows, range(offset + first, offset + first + b)

    def current_positions(self) -> range:
        """Positions of this rank's rows of the next step in the epoch's order (a position
        ``>= num_rows`` is a row repeated to fill the epoch's last batch)."""
        b = self.local_batch_size
        start = self.step_in_epoch * self.global_batch_size + self.dp_rank * b
        return range(start, start + b)

    def advance(self) -> None:
        self.step_in_epoch += 1
        if self.step_in_epoch >= self.steps_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step_in_epoch": self.step_in_epoch,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses a different batch layout."""
        for name in ("global_batch_size", "shuffle", "drop_last"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"loader state was saved with {name}={state[name]!r} but this loader has "
                    f"{name}={getattr(self, name)!r}; resume with the same setting or start "
                    "a fresh run"
                )
        if not 0 <= state["step_in_epoch"] < self.steps_per_epoch:
            raise ValueError(f"saved step_in_epoch {state['step_in_epoch']} is out of range")
        self.seed = int(state["seed"])
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self._perm = None
