"""Global mini-batches: the cut by SAMPLE_ID and the balance of each piece, by hand.

That 1, 2 and 4 ranks train to the same weights with 2 mini-batches is checked with the other
loss variants in ``tests/embodied_rl/algorithms/test_dp_invariance.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied_rl.data.mini_batches import plan_mini_batches


def test_plan_cuts_the_global_order_and_balances_each_piece_by_hand():
    ids = [np.array([5, 1, 7]), np.array([0, 3, 6, 2, 4])]
    weights = [np.ones(3), np.ones(5)]
    (mini0, dest0), (mini1, dest1) = plan_mini_batches(ids, weights, 2, dp_size=2)
    # Sorted ids 0..7: pieces {0, 1, 2, 3} and {4, 5, 6, 7}; equal weights go to bins 0, 1,
    # 0, 1 in id order within each piece.
    assert mini0.tolist() == [1, 0, 1] and dest0.tolist() == [1, 1, 1]
    assert mini1.tolist() == [0, 0, 1, 0, 1] and dest1.tolist() == [0, 1, 0, 0, 0]


def test_plan_balances_tokens_and_sizes_pieces_like_array_split():
    ids = [np.arange(7)]
    ((mini, dest),) = plan_mini_batches(ids, [np.array([9.0, 1, 1, 1, 5, 5, 2])], 2, dp_size=2)
    assert mini.tolist() == [0, 0, 0, 0, 1, 1, 1]  # 7 rows: 4 + 3
    # Piece 0 weights 9, 1, 1, 1: the 9 alone on one rank. Piece 1 weights 5, 5, 2.
    assert dest.tolist() == [0, 1, 1, 1, 0, 1, 0]


def test_repeated_sample_ids_are_refused():
    with pytest.raises(ValueError, match="SAMPLE_ID repeats"):
        plan_mini_batches([np.array([0, 1]), np.array([1, 2])], [np.ones(2)] * 2, 2, 2)


def test_keys_padded_per_rank_are_zero_padded_to_the_widest_rank():
    from embodied_rl.data.batch import make_batch
    from embodied_rl.data.mini_batches import pad_to_shapes, widest_shapes

    widest = widest_shapes(
        [{"mask": (3,), "image": (2, 4, 4)}, {"mask": (5,), "image": (1, 4, 4)}, {"ids": (2,)}]
    )
    assert widest == {"mask": (5,), "image": (2, 4, 4), "ids": (2,)}
    batch = make_batch(
        {
            "mask": torch.ones(2, 3, dtype=torch.bool),
            "image": torch.full((2, 1, 4, 4), 7, dtype=torch.uint8),
        }
    )
    padded = pad_to_shapes(batch, widest)
    assert padded["mask"].tolist() == [[True] * 3 + [False] * 2] * 2
    assert padded["image"].shape == (2, 2, 4, 4) and padded["image"].dtype == torch.uint8
    assert (padded["image"][:, 0] == 7).all() and (padded["image"][:, 1] == 0).all()
    assert batch["mask"].shape == (2, 3)  # the input is left as it was
