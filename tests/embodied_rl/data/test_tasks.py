"""Task manifests: explicit held-out split, sharding over ranks, resume."""

from __future__ import annotations

import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.tasks import (
    TaskManifestLoader,
    check_task_ids,
    manifest,
    shared_with_training,
    split_init_states,
    split_of,
    split_size,
)


def test_split_is_explicit_and_disjoint():
    assert split_init_states(10, 5, "heldout") == [4, 9]
    assert split_init_states(10, 5, "train") == [0, 1, 2, 3, 5, 6, 7, 8]
    assert split_init_states(10, 0, "train") == list(range(10))
    with pytest.raises(ValueError, match="is empty"):
        split_init_states(10, 0, "heldout")


def test_held_out_states_alternate_between_validation_and_test():
    # 50 states, every 5th held out: 4, 9, ..., 49; validation takes the 1st, 3rd, ...
    assert split_init_states(50, 5, "validation") == [4, 14, 24, 34, 44]
    assert split_init_states(50, 5, "test") == [9, 19, 29, 39, 49]
    # every 2nd of 50 held out: 25 states, 13 validation (1, 5, 9, ...) and 12 test (3, 7, ...)
    validation, test = split_init_states(50, 2, "validation"), split_init_states(50, 2, "test")
    assert validation[:3] == [1, 5, 9] and test[:3] == [3, 7, 11]
    assert (
        (len(validation), len(test))
        == (13, 12)
        == (split_size(50, 2, "validation"), split_size(50, 2, "test"))
    )
    for n, every in [(50, 5), (50, 2), (37, 3), (10, 4)]:
        parts = [set(split_init_states(n, every, s)) for s in ("train", "validation", "test")]
        assert sum(map(len, parts)) == n and set.union(*parts) == set(range(n))  # a partition
        assert parts[1] | parts[2] == set(split_init_states(n, every, "heldout"))
        assert all(split_of(i, every) == "test" for i in parts[2])
    # heldout_every=5 with 5 states: one held-out state, which is validation; test is empty
    assert split_init_states(5, 5, "validation") == [4]
    with pytest.raises(ValueError, match="1 held out: validation 1, test 0"):
        split_init_states(5, 5, "test")


def test_an_evaluation_of_held_out_states_shares_nothing_with_training():
    train = manifest([0, 1], split_init_states(20, 5, "train"))
    test = manifest([0, 1], split_init_states(20, 5, "test"))
    assert shared_with_training(train, test, "test") == []
    everything = manifest([0, 1], split_init_states(20, 5, "all"))
    assert shared_with_training(everything, test, "test") == [(0, 9), (0, 19), (1, 9), (1, 19)]
    # training states evaluated on purpose (eval.split=train) are not a leak
    assert shared_with_training(train, train, "train") == []


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
        split_size(10, 5, "val")
    for n, every in [(3, 5), (10, 0), (7, 1)]:
        split = "train" if every == 1 else "heldout"
        with pytest.raises(ValueError, match="is empty .*change heldout_every"):
            split_size(n, every, split)
        with pytest.raises(ValueError, match="is empty .*change heldout_every"):
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


def _evaluation_rows(size: int, batch: int, dp: int) -> list[list[tuple[int, int, bool]]]:
    """Per rank, (task, init state, padded) of an evaluation loader's first step."""
    rows = manifest([0, 1], list(range(size)))[:size]
    out = []
    for rank in range(dp):
        loader = TaskManifestLoader(
            rows, global_batch_size=batch, dp_rank=rank, dp_size=dp, seed=0, shuffle=False,
            each_pair_once=True,
        )  # fmt: skip
        b = loader.next_batch()
        out.append(
            list(zip(b[K.TASK_ID].tolist(), b[K.INIT_STATE_ID].tolist(), b[K.PADDED].tolist()))
        )
    return out


def test_an_evaluation_batch_is_padded_to_the_ranks_and_repeats_are_marked():
    # 5 pairs on 2 ranks: padded to 6, the sixth (a repeat of the first pair) marked.
    rank0, rank1 = _evaluation_rows(5, 5, 2)
    assert rank0 == [(0, 0, False), (0, 1, False), (0, 2, False)]
    assert rank1 == [(0, 3, False), (0, 4, False), (0, 0, True)]
    # A batch larger than the manifest: every pair once, the filling repeats marked.
    (alone,) = _evaluation_rows(3, 5, 1)
    assert [p for *_, p in alone] == [False, False, False, True, True]
    assert {(t, s) for t, s, p in alone if not p} == {(0, 0), (0, 1), (0, 2)}
    # Divisible and no larger than the manifest: nothing marked, nothing added.
    assert all(not p for rank in _evaluation_rows(6, 6, 3) for *_, p in rank)
    # Training loaders are unchanged: no PADDED key, the batch must divide over the ranks.
    train = TaskManifestLoader(
        manifest([0], [0, 1]), global_batch_size=2, dp_rank=0, dp_size=2, seed=0
    )
    assert K.PADDED not in train.next_batch().keys()
    with pytest.raises(ValueError, match="not a positive multiple"):
        TaskManifestLoader(
            manifest([0], [0, 1, 2]), global_batch_size=3, dp_rank=0, dp_size=2, seed=0
        )
