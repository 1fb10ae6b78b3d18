"""Task manifests: explicit held-out split, sharding over ranks, resume."""

from __future__ import annotations

import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.tasks import TaskManifestLoader, manifest, split_init_states


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
