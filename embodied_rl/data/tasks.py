"""Task manifests for embodied RL: each data-parallel rank draws its own (task, init state) rows.

A manifest row is a ``(task_id, init_state_id)`` pair. The split of init states is explicit
and deterministic, so evaluation never sees a training start state:

- every ``heldout_every``-th init state is held out (ids 4, 9, 14, ... for 5), the rest train;
- the held-out states alternate between ``validation`` (the 1st, 3rd, ... held-out id: 4, 14,
  24, ...), the only states to look at when choosing a configuration, and ``test`` (the 2nd,
  4th, ...: 9, 19, 29, ...), touched once per reported run;
- ``heldout`` is validation and test together (what every run before the three-way split
  evaluated), ``all`` every state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.sampler import EpochSampler

SPLITS = ("train", "validation", "test", "heldout", "all")
# Splits that must never share an init state with the training split.
EVALUATION_SPLITS = ("validation", "test", "heldout")


def split_size(num_init_states: int, heldout_every: int, split: str) -> int:
    """How many init states ``split`` holds, without listing them; errors say what to change.

    Raises:
        ValueError: an unknown split, or a split that would be empty.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    held = num_init_states // heldout_every if heldout_every > 0 else 0
    sizes = {
        "all": num_init_states,
        "heldout": held,
        "validation": (held + 1) // 2,  # the 1st, 3rd, ... held-out ids
        "test": held // 2,
        "train": num_init_states - held,
    }
    size = sizes[split]
    if size < 1:
        raise ValueError(
            f"split {split!r} of {num_init_states} init states with heldout_every={heldout_every} "
            f"is empty ({held} held out: validation {sizes['validation']}, test {sizes['test']}); "
            "change heldout_every (0 holds nothing out) or num_init_states"
        )
    return size


def is_heldout(init_state_id: int, heldout_every: int) -> bool:
    """Whether an init state is held out: every ``heldout_every``-th id (4, 9, 14, ... for 5);
    ``heldout_every <= 0`` holds nothing out."""
    return heldout_every > 0 and init_state_id % heldout_every == heldout_every - 1


def split_of(init_state_id: int, heldout_every: int) -> str:
    """``train``, ``validation`` or ``test``: the one split an init state belongs to."""
    if not is_heldout(init_state_id, heldout_every):
        return "train"
    # The n-th held-out id (n = id // heldout_every) alternates validation, test, validation...
    return "validation" if (init_state_id // heldout_every) % 2 == 0 else "test"


def split_init_states(num_init_states: int, heldout_every: int, split: str) -> list[int]:
    """Init-state ids of a split (see the module docstring), ascending.

    ``heldout_every <= 0`` holds nothing out (train = all; the other splits are then errors).
    """
    split_size(num_init_states, heldout_every, split)
    ids = list(range(num_init_states))
    if split == "all":
        return ids
    if split == "heldout":
        return [i for i in ids if is_heldout(i, heldout_every)]
    return [i for i in ids if split_of(i, heldout_every) == split]


def shared_with_training(
    trained: Sequence[tuple[int, int]], evaluated: Sequence[tuple[int, int]], split: str
) -> list[tuple[int, int]]:
    """The (task, init state) pairs an evaluation of ``split`` shares with training's rows,
    sorted; always empty for ``train``/``all``, which evaluate training states on purpose."""
    if split not in EVALUATION_SPLITS:
        return []
    return sorted(set(trained) & set(evaluated))


def check_task_ids(tasks: Sequence[int], num_tasks: int) -> None:
    """Task ids must exist in the suite (``0..num_tasks-1``) and be listed once each.

    Raises:
        ValueError: naming the bad ids and what to change.
    """
    if not tasks:
        raise ValueError("tasks is an empty list; list task ids, or set tasks: null for all")
    unknown = sorted({t for t in tasks if not 0 <= t < num_tasks})
    if unknown:
        raise ValueError(
            f"task ids {unknown} do not exist: a suite of num_tasks={num_tasks} has ids "
            f"0..{num_tasks - 1}; remove them from tasks"
        )
    repeated = sorted(t for t, count in Counter(tasks).items() if count > 1)
    if repeated:
        raise ValueError(f"task ids {repeated} are listed more than once; list each task once")


def padded_batch_size(batch_size: int, dp_size: int) -> int:
    """``batch_size`` rounded up to a multiple of ``dp_size``."""
    return -(-batch_size // dp_size) * dp_size


def manifest(tasks: Sequence[int], init_states: Sequence[int]) -> list[tuple[int, int]]:
    """All (task, init state) pairs, task-major."""
    return [(t, s) for t in tasks for s in init_states]


class TaskManifestLoader:
    """Yields this rank's (task, init state) rows per step; resumable like the prompt loader.

    A manifest comes from the config, not a file: a bad task id is a config error (see
    :func:`check_task_ids`), so ``dropped`` is always empty (the prompt loader's counterpart).

    With ``each_pair_once`` (evaluations: one episode per pair) the global batch may be any
    size: it is padded up to a multiple of ``dp_size``, and every row that only repeats a pair
    (the padding, or the rows that fill a batch larger than the manifest) is marked PADDED:
    rollouts run it like any row, evaluations leave it out.
    """

    @property
    def dropped(self) -> dict[str, int]:
        return {}

    def __init__(
        self,
        rows: Sequence[tuple[int, int]],
        *,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        each_pair_once: bool = False,
    ) -> None:
        self.rows = list(rows)
        self.batch_size, self.each_pair_once = global_batch_size, each_pair_once
        if each_pair_once:
            global_batch_size = padded_batch_size(global_batch_size, dp_size)
        # Manifests are small: repeat rows rather than drop a partial last batch.
        self.sampler = EpochSampler(
            len(self.rows),
            global_batch_size=global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=False,
            source="the task manifest",
        )

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def next_batch(self) -> TensorDict:
        """TASK_ID, INIT_STATE_ID and SAMPLE_ID (B / dp,) of this rank's next rows, and with
        ``each_pair_once`` PADDED (B / dp,) bool."""
        indices, sample_ids = self.sampler.current()
        padded = self._padded()
        self.sampler.advance()
        pairs = [self.rows[i] for i in indices]
        fields = {
            K.TASK_ID: torch.tensor([p[0] for p in pairs], dtype=torch.int64),
            K.INIT_STATE_ID: torch.tensor([p[1] for p in pairs], dtype=torch.int64),
            K.SAMPLE_ID: torch.tensor(list(sample_ids), dtype=torch.int64),
        }
        if self.each_pair_once:
            fields[K.PADDED] = torch.tensor(padded, dtype=torch.bool)
        return make_batch(fields)

    def _padded(self) -> list[bool]:
        """Per row of this rank's next step: whether it lies past the configured batch (the
        padding to a multiple of dp_size) or past the manifest (a repeated pair)."""
        sampler = self.sampler
        step_start = sampler.step_in_epoch * sampler.global_batch_size
        return [
            position - step_start >= self.batch_size or position >= len(self.rows)
            for position in sampler.current_positions()
        ]

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "rows": len(self.rows)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["rows"] != len(self.rows):
            raise ValueError(
                f"task loader state was saved for a manifest of {state['rows']} rows, this one "
                f"has {len(self.rows)}; resume with the same tasks and split"
            )
        self.sampler.load_state_dict(state)
