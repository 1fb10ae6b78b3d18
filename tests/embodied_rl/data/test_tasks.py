"""Task manifests: explicit held-out split, sharding over ranks, resume."""

from __future__ import annotations

import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.tasks import (
    TaskManifestLoader,
    check_task_ids,
    manifest,
    split_init_states,
    split_size,
)


def test_split_is_explicit_and_disjoint():
    assert split_init_states(10, 5, "heldout") == [4, 9]
    assert split_init_states(10, 5, "train") == [0, 1, 2, 3, 5, 6, 7, 8]
    assert split_init_states(10, 0, "train") == list(range(10))
    with pytest.raises(ValueError, match="is empty; change heldout_every"):
        split_init_states(10, 0, "heldout")


def test_ranks_share_each_step_without_overlap_and_resume_matches():
    rows = manifest([0, 2], split_init_states(10, 5, "train"))  # 16 rows
    loaders = [
        TaskManifestLoader(rows, global_batch_size=4, dp_rank=d, dp_size=2, seed=3) for d in (0, 1)
    ]
    seen = []
    for _ in range(4):  # one full epoch
        batches = [loader.next_batch() for loader in loaders]
        pairs = [
            (t, s)
            for b in batches
            for t, s in zip(b[K.TASK_ID].tolist(), b[K.INIT_STATE_ID].tolist())
        ]
        assert len(pairs) == 4
        seen += pairs
    assert sorted(seen) == sorted(rows)  # every training pair exactly once per epoch
    assert all(s % 5 != 4 for _, s in seen)  # never a held-out init state
    state = loaders[0].state_dict()
    expected = loaders[0].next_batch()
    fresh = TaskManifestLoader(rows, global_batch_size=4, dp_rank=0, dp_size=2, seed=3)
    fresh.load_state_dict(state)
    again = fresh.next_batch()
    assert torch.equal(again[K.TASK_ID], expected[K.TASK_ID])
    assert torch.equal(again[K.SAMPLE_ID], expected[K.SAMPLE_ID])
    assert expected[K.SAMPLE_ID].tolist() == [16, 17]  # unique over the run: 5th batch of 4


def test_split_size_is_computed_without_listing_the_ids():
    assert split_size(10, 5, "heldout") == 2 and split_size(10, 5, "train") == 8
    assert split_size(10**15, 4, "train") == 3 * 10**15 // 4  # instant: nothing is listed
    with pytest.raises(ValueError, match="split must be one of"):
        split_size(10, 5, "test")
    for n, every in [(3, 5), (10, 0), (7, 1)]:
        split = "train" if every == 1 else "heldout"
        with pytest.raises(ValueError, match="is empty; change heldout_every"):
            split_size(n, every, split)
        with pytest.raises(ValueError, match="is empty; change heldout_every"):
            split_init_states(n, every, split)


def test_task_ids_must_exist_and_be_listed_once():
    check_task_ids([0, 2, 9], 10)
    with pytest.raises(ValueError, match=r"task ids \[-1, 10\] do not exist: a suite of"):
        check_task_ids([10, 3, -1], 10)
    with pytest.raises(ValueError, match=r"task ids \[2\] are listed more than once"):
        check_task_ids([2, 0, 2], 10)
    with pytest.raises(ValueError, match="tasks is an empty list"):
        check_task_ids([], 10)


def test_a_manifest_drops_nothing():
    loader = TaskManifestLoader(
        manifest([0], [0, 1]), global_batch_size=2, dp_rank=0, dp_size=1, seed=0
    )
    assert loader.dropped == {}
