"""Global mini-batches: mini-batch ``i`` holds the same rows whatever the number of dp ranks.

Cutting each rank's shard into ``num_mini_batches`` pieces (what a single-machine trainer
does) makes the update depend on the data-parallel size: with 1 worker mini-batch 0 is the
first half of the batch, with 2 workers it is the first half of each shard, so the same data
gives different parameters. Here the cut is made over the global batch instead:

1. Every dp rank shares its rows' ``SAMPLE_ID`` (unique within a step), token counts and the
   trailing shape of each tensor key. Keys padded per rank to that rank's longest episode or
   response (embodied trajectories, ``RESPONSE_MASK`` widths) are zero-padded to the widest
   rank's shape, so rows of different ranks can share a mini-batch; padding is masked out.
2. All rows, ordered by ``SAMPLE_ID``, are cut into ``num_mini_batches`` consecutive pieces
   (``np.array_split`` sizes: the first ``N % M`` pieces one row longer).
3. The rows of each piece are balanced over the dp ranks by token count
   (:func:`~embodied_rl.data.balance.assign_units`), and one databuffer redistribution moves
   every row to its rank (:func:`~embodied_rl.data.databuffer.redistribute` with explicit
   destinations).

Gradients of a mini-batch are summed over the dp group and its loss is normalised by its
global counts, so which rank holds a row does not change the update: only the pieces matter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.balance import assign_units
from embodied_rl.data.batch import batch_len, tensor_keys
from embodied_rl.data.databuffer import redistribute, token_weights
from embodied_rl.data.layout import Layout

MINI_BATCH = "mini_batch"  # (B,) int64 global mini-batch of each row, while it moves


def plan_mini_batches(
    sample_ids: list[np.ndarray], weights: list[np.ndarray], num_mini_batches: int, dp_size: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Mini-batch and destination dp rank of every row; the same result on every rank.

    Args:
        sample_ids: ``(N_r,)`` int64 ``SAMPLE_ID`` of the rows of each dp rank ``r``.
        weights: ``(N_r,)`` float64 token count of each of those rows.
        num_mini_batches: pieces ``M`` of the global batch.
        dp_size: ranks to balance each piece over.

    Returns:
        For each dp rank: ``((N_r,) mini-batch index, (N_r,) destination dp rank)``.

    Raises:
        ValueError: if a ``SAMPLE_ID`` occurs twice (the order would depend on the layout).
    """
    counts = [len(ids) for ids in sample_ids]
    ids = np.concatenate(sample_ids) if counts else np.zeros(0, dtype=np.int64)
    load = np.concatenate(weights) if counts else np.zeros(0)
    if len(np.unique(ids)) != len(ids):
        raise ValueError(
            "SAMPLE_ID repeats within the training batch; global mini-batches order rows by "
            "it, so it must be unique per step (the rollouts assign unique ids)"
        )
    mini = np.empty(len(ids), dtype=np.int64)
    dest = np.empty(len(ids), dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    for index, piece in enumerate(np.array_split(order, num_mini_batches)):
        mini[piece] = index
        dest[piece] = assign_units(load[piece].tolist(), dp_size)
    bounds = np.cumsum(counts)[:-1]
    return list(zip(np.split(mini, bounds), np.split(dest, bounds)))


def global_mini_batches(
    batch: TensorDict,
    num_mini_batches: int,
    dp_group: dist.ProcessGroup | None,
    dp_ranks: tuple[int, ...],
    rank: int,
    gather_over_dp: Callable[[Any], list[Any]],
) -> list[TensorDict]:
    """This rank's rows of each global mini-batch (a collective over ``dp_group``).

    Args:
        batch: this rank's shard of the step's batch (``B`` rows with ``SAMPLE_ID``).
        num_mini_batches: ``M``.
        dp_group: the data-parallel group (ranks holding different rows); None when alone.
        dp_ranks: the global ranks of ``dp_group`` in dp order.
        rank: this worker's global rank.
        gather_over_dp: the all-gather over ``dp_group`` in dp order
            (:meth:`embodied_rl.runtime.context.NodeContext.gather_over_dp`).

    Returns:
        ``M`` batches: this rank's rows of each mini-batch, ordered by ``SAMPLE_ID``.
    """
    if num_mini_batches == 1:
        return [batch]
    ids = batch[K.SAMPLE_ID].detach().cpu().reshape(-1).to(torch.int64).numpy()
    mine = (ids, token_weights(batch), trailing_shapes(batch))
    every = gather_over_dp(mine)
    ids_per_rank, weights_per_rank = [e[0] for e in every], [e[1] for e in every]
    plan = plan_mini_batches(ids_per_rank, weights_per_rank, num_mini_batches, len(every))
    mini, dest = plan[dp_ranks.index(rank)]
    widest = widest_shapes([e[2] for e, n in zip(every, ids_per_rank) if len(n)])
    tagged = pad_to_shapes(batch, widest)
    tagged[MINI_BATCH] = torch.from_numpy(mini)
    if len(every) > 1:
        layout = Layout(tuple(dp_ranks))
        tagged = redistribute(
            tagged, layout, layout, rank, dp_group, keep_groups=False,
            destinations=torch.from_numpy(dest),
        )  # fmt: skip
    return _split_by_mini_batch(tagged, num_mini_batches)


def trailing_shapes(batch: TensorDict) -> dict[str, tuple[int, ...]]:
    """Tensor key -> its shape after the batch dimension."""
    return {key: tuple(batch.get(key).shape[1:]) for key in tensor_keys(batch)}


def widest_shapes(shapes: list[dict[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    """Per key, the elementwise largest trailing shape over the ranks that have the key.

    A key whose number of dimensions differs between ranks is left out: it cannot be padded,
    and the redistribution names it in its error.
    """
    out: dict[str, tuple[int, ...]] = {}
    for rank_shapes in shapes:
        for key, shape in rank_shapes.items():
            if key not in out:
                out[key] = shape
            elif len(out[key]) == len(shape):
                out[key] = tuple(max(a, b) for a, b in zip(out[key], shape))
    return out


def pad_to_shapes(batch: TensorDict, shapes: dict[str, tuple[int, ...]]) -> TensorDict:
    """A shallow copy of ``batch`` whose tensors are zero-padded at the end of each trailing
    dimension to ``shapes[key]`` (keys already that wide are shared, not copied)."""
    out = batch.clone(recurse=False)
    for key in tensor_keys(batch):
        value = batch.get(key)
        target = shapes.get(key, tuple(value.shape[1:]))
        if target == tuple(value.shape[1:]) or len(target) != value.dim() - 1:
            continue
        padded = value.new_zeros((value.shape[0], *target))
        padded[(slice(None), *(slice(0, n) for n in value.shape[1:]))] = value
        out[key] = padded
    return out


def _split_by_mini_batch(tagged: TensorDict, num_mini_batches: int) -> list[TensorDict]:
    """Rows of each mini-batch index, by ``SAMPLE_ID``, without the ``MINI_BATCH`` key."""
    order = torch.argsort(tagged[K.SAMPLE_ID], stable=True)
    tagged = tagged[order]
    index = tagged.pop(MINI_BATCH)
    pieces = []
    for i in range(num_mini_batches):
        rows = torch.nonzero(index == i).reshape(-1)
        pieces.append(tagged[rows] if batch_len(tagged) else tagged)
    return pieces
