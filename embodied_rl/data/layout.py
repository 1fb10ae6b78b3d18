"""Data-parallel layouts: which global ranks hold which shard of a node's batch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The workers a node runs on and how they split its batch.

    ``ranks`` are global worker ranks in dp-major order: the ranks of data-parallel shard ``d``
    are ``ranks[d * tp_size : (d + 1) * tp_size]``. All ``tp_size`` ranks of one shard hold
    the same samples (they split the model, not the data).
    """

    ranks: tuple[int, ...]
    tp_size: int = 1

    def __post_init__(self) -> None:
        if not self.ranks:
            raise ValueError("a layout needs at least one rank")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"layout ranks repeat: {self.ranks}")
        if self.tp_size < 1 or len(self.ranks) % self.tp_size:
            raise ValueError(
                f"{len(self.ranks)} ranks cannot be split into tensor-parallel groups of "
                f"{self.tp_size}; use a tp size that divides the number of workers"
            )

    @property
    def dp_size(self) -> int:
        return len(self.ranks) // self.tp_size

    def __contains__(self, rank: int) -> bool:
        return rank in self.ranks

    def dp_rank(self, rank: int) -> int:
        return self.ranks.index(rank) // self.tp_size

    def tp_rank(self, rank: int) -> int:
        return self.ranks.index(rank) % self.tp_size

    def shard_ranks(self, dp_rank: int) -> tuple[int, ...]:
        """The ranks holding data-parallel shard ``dp_rank`` (all its tp members)."""
        return self.ranks[dp_rank * self.tp_size : (dp_rank + 1) * self.tp_size]

    def shard_leaders(self) -> tuple[int, ...]:
        """One rank per data-parallel shard (tp rank 0): the ones that send its data."""
        return tuple(self.shard_ranks(d)[0] for d in range(self.dp_size))

    def dp_group_ranks(self, rank: int) -> tuple[int, ...]:
        """Ranks that share ``rank``'s tp position: the gradient all-reduce group."""
        tp = self.tp_rank(rank)
        return tuple(self.ranks[d * self.tp_size + tp] for d in range(self.dp_size))
