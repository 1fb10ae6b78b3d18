"""Distributed databuffer: move a node's output between two data-parallel layouts.

When consecutive DAG nodes run with different layouts (rollout on ranks ``(0, 1)`` with tp 2,
training on ``(0, 1, 2, 3)``), every rank of both layouts calls :func:`redistribute`
collectively. There is no coordinator actor and no driver hop:

1. Metadata: each source shard leader describes its shard (row count, token weight per sample,
   group ids, key schema, byte size of each sample's pickled string fields). The descriptions
   are all-gathered, so every rank holds the same picture (a few bytes per sample).
2. Assignment: every rank computes the same balanced assignment of units (samples, or whole
   GRPO groups) to destination shards with :func:`~embodied_rl.data.balance.assign_units`.
   Schema errors are detected here, on every rank at once, so nobody hangs in a collective.
3. Payload: each source leader packs the rows for each destination into one ``uint8`` buffer
   (the bytes of every tensor key, key after key, then the pickled string fields) and one
   ``all_to_all_single`` moves everything worker-to-worker. Receivers know every split size
   from the metadata, so no byte counts are exchanged separately.

Why one byte buffer for all keys and dtypes instead of one collective per key: each gloo
collective costs a round of messages between every pair of ranks, which dominates for the
small per-step batches of RL (measured: docs/benchmarks/code_figures.md). Packing costs one
``index_select`` copy per key on the sender and one ``cat``
per key on the receiver.

Fields are the batch's top-level keys: tensors (moved as raw bytes, any dtype) and non-tensor
fields (strings or other picklable per-sample values, see :func:`~embodied_rl.data.batch.strings`).
"""

from __future__ import annotations

import math
import pickle
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tensordict import NonTensorStack, TensorDict

from embodied_rl import keys as K
from embodied_rl.data.balance import assign_units
from embodied_rl.data.batch import batch_len, non_tensor_keys, strings, tensor_keys
from embodied_rl.data.layout import Layout
from embodied_rl.data.transport import (
    TransferStats,
    Transport,
    bytes_to_tensor,
    transport_for,
)

Schema = dict[str, tuple[torch.dtype, tuple[int, ...]]]


@dataclass(frozen=True)
class _SourceMeta:
    """What a source shard leader tells every rank about its shard.

    Attributes:
        num_rows: Samples in the shard, ``N``.
        weights: ``(N,)`` float64 real-token count per sample.
        group_ids: ``(N,)`` int64 ``GROUP_ID`` values, or None when groups are not kept.
        schema: Tensor key -> (dtype, trailing shape).
        object_keys: Sorted non-tensor keys.
        object_sizes: ``(N,)`` int64 bytes of each sample's pickled non-tensor values.
        destinations: ``(N,)`` int64 destination dp rank of each sample when the caller chose
            them (``redistribute(..., destinations=...)``), else None.
    """

    num_rows: int
    weights: np.ndarray
    group_ids: np.ndarray | None
    schema: Schema
    object_keys: tuple[str, ...]
    object_sizes: np.ndarray
    destinations: np.ndarray | None = None


def _row_sum(mask: torch.Tensor) -> torch.Tensor:
    """``(B, ...)`` mask -> ``(B,)`` float64 count of real entries per sample."""
    mask = mask.detach().to(torch.float64)
    if mask.dim() == 1:
        return mask
    return mask.sum(dim=tuple(range(1, mask.dim())))


def token_weights(batch: TensorDict) -> np.ndarray:
    """Real tokens per sample: the weight used for balancing.

    ``PROMPT_MASK`` + ``RESPONSE_MASK`` where present, else ``STEP_MASK``, else 1.

    Args:
        batch: A batch of ``B`` samples.

    Returns:
        ``(B,)`` float64 weights.
    """
    n = batch_len(batch)
    present = set(tensor_keys(batch))
    token_masks = [k for k in (K.PROMPT_MASK, K.RESPONSE_MASK) if k in present]
    if not token_masks and K.STEP_MASK in present:
        token_masks = [K.STEP_MASK]
    weights = (
        torch.zeros(n, dtype=torch.float64) if token_masks else torch.ones(n, dtype=torch.float64)
    )
    for key in token_masks:
        weights += _row_sum(batch.get(key)).cpu()
    return weights.numpy()


def _describe(
    batch: TensorDict | None, keep_groups: bool, destinations: torch.Tensor | None
) -> tuple[_SourceMeta, list[bytes]]:
    """Metadata of a source shard, plus each sample's pickled non-tensor values."""
    if batch is None:
        batch = TensorDict({}, batch_size=[0])
    n = batch_len(batch)
    chosen = None
    if destinations is not None:
        chosen = destinations.detach().cpu().reshape(-1).to(torch.int64).numpy()
        if len(chosen) != n:
            raise ValueError(f"destinations has {len(chosen)} entries for a shard of {n} rows")
    t_keys = tensor_keys(batch)
    schema = {k: (batch.get(k).dtype, tuple(batch.get(k).shape[1:])) for k in t_keys}
    object_keys = tuple(non_tensor_keys(batch))
    rows: list[bytes] = []
    if object_keys and n:
        columns = [strings(batch, k) for k in object_keys]
        rows = [pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL) for values in zip(*columns)]
    group_ids = None
    if keep_groups and K.GROUP_ID in schema:
        group_ids = batch.get(K.GROUP_ID).detach().cpu().reshape(n).to(torch.int64).numpy()
    sizes = np.array([len(r) for r in rows] if rows else [0] * n, dtype=np.int64)
    meta = _SourceMeta(n, token_weights(batch), group_ids, schema, object_keys, sizes, chosen)
    return meta, rows


def _gather_sources(transport: Transport, src: Layout, payload: bytes) -> list[_SourceMeta]:
    """All-gather the leaders' pickled metadata; returns it indexed by source dp rank."""
    gathered = transport.all_gather_bytes(payload)
    # Metadata comes from peers of the same job (as in dist.all_gather_object).
    return [pickle.loads(gathered[transport.group_rank(r)]) for r in src.shard_leaders()]


def _consensus_schema(metas: list[_SourceMeta]) -> tuple[Schema, tuple[str, ...]]:
    """The key schema all non-empty source shards share.

    Empty shards are skipped: a shard with no rows may not know the node's fields.

    Raises:
        ValueError: If two non-empty shards differ in keys, or in a key's dtype or trailing
            shape (naming the key and the shapes).
    """
    filled = [(i, m) for i, m in enumerate(metas) if m.num_rows > 0]
    if not filled:
        return metas[0].schema, metas[0].object_keys
    ref_index, ref = filled[0]
    for index, meta in filled[1:]:
        if set(meta.schema) != set(ref.schema) or meta.object_keys != ref.object_keys:
            raise ValueError(
                f"source shards disagree on batch keys: shard {ref_index} has "
                f"{sorted(ref.schema) + list(ref.object_keys)}, shard {index} has "
                f"{sorted(meta.schema) + list(meta.object_keys)}; every shard of a node must "
                "write the same fields"
            )
        for key in sorted(ref.schema):
            if meta.schema[key] != ref.schema[key]:
                (d0, s0), (d1, s1) = ref.schema[key], meta.schema[key]
                raise ValueError(
                    f"batch key {key!r} differs between source shards: shard {ref_index} has "
                    f"{d0} rows of shape {list(s0)}, shard {index} has {d1} rows of shape "
                    f"{list(s1)}. Redistribution needs the same dtype and trailing shape on "
                    "every shard: pad variable-length fields to a fixed length (e.g. set "
                    "max_prompt_length / max_response_length) instead of padding per batch"
                )
    return ref.schema, ref.object_keys


def _assign(metas: list[_SourceMeta], use_groups: bool, num_bins: int) -> list[np.ndarray]:
    """Destination dp rank of every sample, per source shard (``(N_s,)`` int64 each)."""
    counts = [m.num_rows for m in metas]
    weights = np.concatenate([m.weights for m in metas]) if metas else np.zeros(0)
    total = int(sum(counts))
    if use_groups and total:
        ids = np.concatenate([m.group_ids for m in metas if m.num_rows > 0])
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        # np.unique sorts by value; renumber units by first appearance, as the spec orders them.
        unit_of_unique = np.empty(len(first), dtype=np.int64)
        unit_of_unique[np.argsort(first, kind="stable")] = np.arange(len(first))
        unit_of_sample = unit_of_unique[inverse.reshape(-1)]
        unit_weights = np.bincount(unit_of_sample, weights=weights, minlength=len(first))
    else:
        unit_of_sample = np.arange(total, dtype=np.int64)
        unit_weights = weights
    bins = np.asarray(assign_units(unit_weights.tolist(), num_bins), dtype=np.int64)
    dest = bins[unit_of_sample] if total else np.zeros(0, dtype=np.int64)
    return np.split(dest, np.cumsum(counts)[:-1])


def _chosen_destinations(metas: list[_SourceMeta], num_dst: int) -> list[np.ndarray]:
    """The destinations the source leaders chose, checked on every rank alike (no hang)."""
    dests = []
    for s, meta in enumerate(metas):
        chosen = meta.destinations
        if chosen is None:
            raise ValueError(
                f"source shard {s} passed no destinations while others did; every source "
                "leader must pass destinations=..."
            )
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= num_dst):
            raise ValueError(
                f"source shard {s} sends to dp rank {int(chosen.max())} or {int(chosen.min())};"
                f" the destination layout has dp ranks 0..{num_dst - 1}"
            )
        dests.append(chosen)
    return dests


def _row_nbytes(schema: Schema) -> dict[str, int]:
    """Bytes per sample of each tensor key (sorted by key)."""
    return {
        k: math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        for k, (dtype, shape) in sorted(schema.items())
    }


def _pair_bytes(
    metas: list[_SourceMeta], dests: list[np.ndarray], row_bytes: int, num_dst: int
) -> np.ndarray:
    """``(S, D)`` int64 payload bytes from each source shard to each destination shard."""
    out = np.zeros((len(metas), num_dst), dtype=np.int64)
    for s, (meta, dest) in enumerate(zip(metas, dests)):
        rows = np.bincount(dest, minlength=num_dst)
        objects = np.bincount(dest, weights=meta.object_sizes, minlength=num_dst)
        out[s] = rows * row_bytes + objects.astype(np.int64)
    return out


def _byte_rows(tensor: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """``(n, ...)`` tensor of any dtype -> ``(n, width)`` uint8 view of its bytes."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).reshape(n, width)


def _pack(
    batch: TensorDict, schema: Schema, rows: list[bytes], dest: np.ndarray, targets: list[int]
) -> torch.Tensor:
    """This leader's send buffer: one segment per send slot.

    A segment for destination shard ``d`` holds that shard's rows in local order, key-major:
    ``m x width`` bytes of each tensor key (keys sorted), then the ``m`` pickled object rows.
    Key-major lets ``index_select`` write each key straight into the buffer (one copy) and
    lets the receiver rebuild each key with one concatenation.

    Args:
        batch: The source shard, ``N`` samples.
        schema: Tensor key -> (dtype, trailing shape) of the batch.
        rows: ``N`` pickled object rows, or empty when there are no object keys.
        dest: ``(N,)`` destination dp rank per sample.
        targets: Destination dp rank of each send slot, in group-rank order.

    Returns:
        Flat uint8 tensor, the segments of ``targets`` back to back.
    """
    n = len(dest)
    nbytes = _row_nbytes(schema)
    columns = {k: _byte_rows(batch.get(k), n, w) for k, w in nbytes.items()}
    device = next(iter(columns.values())).device if columns else torch.device("cpu")
    picks = {d: np.flatnonzero(dest == d) for d in set(targets)}
    objects = {d: b"".join(rows[i] for i in pick) if rows else b"" for d, pick in picks.items()}
    row_bytes = sum(nbytes.values())
    total = sum(len(picks[d]) * row_bytes + len(objects[d]) for d in targets)
    send = torch.empty(total, dtype=torch.uint8, device=device)
    offset = 0
    for d in targets:
        index = torch.from_numpy(picks[d]).to(device)
        for key, width in nbytes.items():
            size = len(index) * width
            out = send[offset : offset + size].view(len(index), width)
            torch.index_select(columns[key], 0, index, out=out)
            offset += size
        size = len(objects[d])
        send[offset : offset + size] = bytes_to_tensor(objects[d]).to(device)
        offset += size
    return send


def _source_segments(
    recv: torch.Tensor, recv_splits: list[int], src: Layout, transport: Transport
) -> list[torch.Tensor]:
    """Split the received buffer into one flat uint8 segment per source dp rank."""
    offsets = np.concatenate([[0], np.cumsum(recv_splits)]).tolist()
    segments = []
    for leader in src.shard_leaders():
        p = transport.group_rank(leader)
        segments.append(recv[offsets[p] : offsets[p + 1]])
    return segments


def _unpack(
    segments: list[torch.Tensor],
    metas: list[_SourceMeta],
    dests: list[np.ndarray],
    schema: Schema,
    object_keys: tuple[str, ...],
    my_dp: int,
) -> TensorDict:
    """Rebuild this destination shard from the per-source segments (source dp order).

    Args:
        segments: One flat uint8 tensor per source shard, laid out as in ``_pack``.
        metas: Metadata per source shard.
        dests: Destination dp rank per sample, per source shard.
        schema: Tensor key -> (dtype, trailing shape).
        object_keys: Non-tensor keys, in pickled tuple order.
        my_dp: This rank's destination dp rank.

    Returns:
        A batch of ``M`` rows ordered by (source dp rank, local index).
    """
    nbytes = _row_nbytes(schema)
    mine = [dest == my_dp for dest in dests]
    counts = [int(m.sum()) for m in mine]
    total = sum(counts)
    out = TensorDict({}, batch_size=[total])
    offsets = [0] * len(segments)  # read position inside each source segment
    for key, width in nbytes.items():
        parts = []
        for s, segment in enumerate(segments):
            parts.append(segment[offsets[s] : offsets[s] + counts[s] * width])
            offsets[s] += counts[s] * width
        # A fresh buffer at offset 0, so the dtype view below is aligned. One part (the usual
        # case: one source per destination) is cloned: torch.cat of a single 1-D uint8 tensor
        # is slower than clone on CPU (docs/benchmarks/code_figures.md).
        data = parts[0].clone() if len(parts) == 1 else torch.cat(parts)
        dtype, shape = schema[key]
        out[key] = data.view(dtype).reshape(total, *shape)
    objects = []
    for s, segment in enumerate(segments):
        if object_keys and counts[s]:
            data = segment[offsets[s] :].cpu().numpy().tobytes()
            ends = np.cumsum(metas[s].object_sizes[mine[s]]).tolist()
            objects.extend(pickle.loads(data[a:b]) for a, b in zip([0] + ends[:-1], ends))
    for j, key in enumerate(object_keys):
        values = [row[j] for row in objects]
        # tensordict turns an empty list into a tensor; an empty stack keeps the field a
        # non-tensor field so empty shards have the same keys as full ones.
        out[key] = values if values else NonTensorStack(batch_size=[0])
    return out


def _exchange(
    batch: TensorDict | None,
    rows: list[bytes],
    metas: list[_SourceMeta],
    dests: list[np.ndarray],
    schema: Schema,
    object_keys: tuple[str, ...],
    layouts: tuple[Layout, Layout],
    rank: int,
    transport: Transport,
    stats: TransferStats,
) -> TensorDict | None:
    """Move the payload with one all-to-all and unpack this rank's destination shard."""
    src, dst = layouts
    pair = _pair_bytes(metas, dests, sum(_row_nbytes(schema).values()), dst.dp_size)
    size = transport.size()
    peers = {transport.group_rank(r): r for r in set(src.ranks) | set(dst.ranks)}
    send_splits, recv_splits = [0] * size, [0] * size
    leaders = src.shard_leaders()
    send = torch.empty(0, dtype=torch.uint8)
    if rank in leaders and metas[leaders.index(rank)].num_rows > 0:
        s = leaders.index(rank)
        slots = [p for p in range(size) if peers[p] in dst]
        targets = [dst.dp_rank(peers[p]) for p in slots]
        for p, d in zip(slots, targets):
            send_splits[p] = int(pair[s, d])
        send = _pack(batch, schema, rows, dests[s], targets)
    if rank in dst:
        for s, leader in enumerate(leaders):
            recv_splits[transport.group_rank(leader)] = int(pair[s, dst.dp_rank(rank)])
    me = transport.group_rank(rank)
    stats.bytes_sent += sum(send_splits) - send_splits[me]
    stats.bytes_received += sum(recv_splits) - recv_splits[me]
    stats.bytes_local += send_splits[me]
    if int(pair.sum()) > 0:  # every rank sees the same matrix, so all skip or none does
        recv = transport.all_to_all(send, send_splits, recv_splits)
    else:
        recv = torch.empty(0, dtype=torch.uint8)
    if rank not in dst:
        return None
    segments = _source_segments(recv, recv_splits, src, transport)
    return _unpack(segments, metas, dests, schema, object_keys, dst.dp_rank(rank))


def redistribute(
    batch: TensorDict | None,
    src: Layout,
    dst: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    *,
    keep_groups: bool = True,
    transport: Transport | None = None,
    stats: TransferStats | None = None,
    destinations: torch.Tensor | None = None,
) -> TensorDict | None:
    """Move a node's output from layout ``src`` to layout ``dst``; collective over both.

    Every rank in ``set(src.ranks) | set(dst.ranks)`` must call this with the same layouts and
    options. Only source shard leaders (tp rank 0) send; every tp member of a destination shard
    receives the full shard. Samples (or, with ``keep_groups``, whole ``GROUP_ID`` groups) are
    balanced over destination shards by real-token count (see :func:`token_weights`) with
    :func:`~embodied_rl.data.balance.assign_units`; within a destination shard samples keep
    the order (source dp rank, local index).

    Args:
        batch: This rank's source shard (``B`` samples) if ``rank in src``, else ignored.
        src: Layout of the node that produced the batch.
        dst: Layout of the node that consumes it.
        rank: This worker's global rank.
        group: Process group of exactly the ranks of both layouts (ranks sorted); may be None
            when ``src == dst`` or when ``transport`` is given.
        keep_groups: Keep all samples sharing a ``GROUP_ID`` on one destination shard.
        transport: How bytes move; default :func:`transport_for` ``(group)`` (shared memory
            between ranks of one node, one ``all_to_all_single`` between nodes).
        stats: Accumulates bytes, collectives and time spent by this rank.
        destinations: ``(B,)`` int64 destination dp rank of each row of this source shard,
            chosen by the caller instead of the balanced assignment (e.g. the global
            mini-batches of :mod:`embodied_rl.data.mini_batches`); every source leader passes
            its own. With destinations the rows move even when ``src == dst``.

    Returns:
        This rank's destination shard (``M`` samples) if ``rank in dst``, else None. With
        ``src == dst`` the input ``batch`` object itself, untouched.

    Raises:
        ValueError: If the rank is not in either layout, the group does not match the layouts,
            or non-empty source shards disagree on a key's dtype or trailing shape.
    """
    explicit = destinations is not None
    if src == dst and not explicit:
        return batch if rank in src else None
    union = sorted(set(src.ranks) | set(dst.ranks))
    if rank not in union:
        raise ValueError(f"rank {rank} is in neither layout {src.ranks} nor {dst.ranks}")
    if transport is None:
        if group is None:
            raise ValueError("redistribute between different layouts needs a process group")
        transport = transport_for(group)
    if transport.size() != len(union):
        raise ValueError(
            f"the process group has {transport.size()} ranks, the layouts {len(union)} "
            f"({union}); create it with dist.new_group({union})"
        )
    stats = stats if stats is not None else TransferStats()
    start, collectives = time.perf_counter(), transport.num_collectives
    shm_before, network_before = transport.shm_bytes, transport.network_bytes
    leader = rank in src.shard_leaders()
    meta, rows = _describe(batch, keep_groups, destinations) if leader else (None, [])
    payload = b"" if meta is None else pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    metas = _gather_sources(transport, src, payload)
    schema, object_keys = _consensus_schema(metas)
    if explicit:
        dests = _chosen_destinations(metas, dst.dp_size)
    else:
        dests = _assign(metas, keep_groups and K.GROUP_ID in schema, dst.dp_size)
    middle = time.perf_counter()
    out = _exchange(
        batch, rows, metas, dests, schema, object_keys, (src, dst), rank, transport, stats
    )
    stats.calls += 1
    stats.metadata_bytes += len(payload)
    stats.num_collectives += transport.num_collectives - collectives
    stats.bytes_shm += transport.shm_bytes - shm_before
    stats.bytes_network += transport.network_bytes - network_before
    stats.metadata_seconds += middle - start
    stats.payload_seconds += time.perf_counter() - middle
    return out
