"""Helpers on batches: ``tensordict.TensorDict`` with a leading sample dimension.

String fields are stored as non-tensor stacks (``td["prompt_text"] = [...]``) and travel with
their rows through indexing and concatenation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.tensorclass import NonTensorStack

from embodied_rl import keys as K


def make_batch(fields: Mapping[str, Any], batch_size: int | None = None) -> TensorDict:
    """Build a batch from tensors (leading dim B) and lists of strings (length B)."""
    if batch_size is None:
        first = next(iter(fields.values()))
        batch_size = len(first)
    td = TensorDict({}, batch_size=[batch_size])
    for key, value in fields.items():
        if len(value) != batch_size:
            raise ValueError(f"field {key!r} has {len(value)} rows, expected {batch_size}")
        if isinstance(value, torch.Tensor):
            td[key] = value
        elif batch_size == 0:  # an empty list would otherwise become a float tensor
            td[key] = NonTensorStack(batch_size=[0])
        else:
            td[key] = list(value)
    return td


def batch_len(batch: TensorDict | None) -> int:
    return 0 if batch is None else int(batch.batch_size[0])


def tensor_keys(batch: TensorDict) -> list[str]:
    return sorted(k for k in batch.keys() if isinstance(batch.get(k), torch.Tensor))


def non_tensor_keys(batch: TensorDict) -> list[str]:
    return sorted(k for k in batch.keys() if not isinstance(batch.get(k), torch.Tensor))


def strings(batch: TensorDict, key: str) -> list[Any]:
    """The per-sample Python values of a non-tensor field, as a list of length B."""
    value = batch.get(key)
    if isinstance(value, torch.Tensor):
        raise TypeError(f"batch field {key!r} is a tensor, not a list of strings")
    if batch_len(batch) == 0:
        return []
    return list(value.tolist()) if hasattr(value, "tolist") else [value.data]


def take(batch: TensorDict, index: torch.Tensor | Sequence[int]) -> TensorDict:
    """Rows ``index`` of ``batch`` (a copy), keeping string fields aligned."""
    index = torch.as_tensor(index, dtype=torch.long)
    return batch[index]


def concat(batches: Sequence[TensorDict]) -> TensorDict:
    """Concatenate batches along the sample dimension (empty ones are skipped)."""
    non_empty = [b for b in batches if batch_len(b) > 0]
    if not non_empty:
        return batches[0] if batches else TensorDict({}, batch_size=[0])
    if len(non_empty) == 1:
        return non_empty[0]
    return torch.cat(non_empty, dim=0)


def merge(batches: Sequence[TensorDict]) -> TensorDict:
    """Union of the fields of batches holding the same samples in the same order.

    Used when a node has several dependencies. Rows are matched by ``SAMPLE_ID`` where
    present; a mismatch means the dependencies were laid out differently, which is a bug.
    """
    if len(batches) == 1:
        return batches[0]
    out = batches[0].clone(recurse=False)
    for other in batches[1:]:
        if batch_len(other) != batch_len(out):
            raise ValueError(
                f"cannot merge dependency batches of {batch_len(out)} and {batch_len(other)} "
                "samples; nodes with several deps need deps with the same samples"
            )
        if K.SAMPLE_ID in out.keys() and K.SAMPLE_ID in other.keys():
            if not torch.equal(out[K.SAMPLE_ID], other[K.SAMPLE_ID]):
                raise ValueError("dependency batches hold different samples (sample ids differ)")
        for key in other.keys():
            if key not in out.keys():
                out[key] = other.get(key)
    return out


def repeat_interleave(batch: TensorDict, n: int) -> TensorDict:
    """Each sample repeated ``n`` times in place: rows ``[a, a, b, b]`` for ``n=2``."""
    index = torch.arange(batch_len(batch)).repeat_interleave(n)
    return take(batch, index)


def rename_keys(batch: TensorDict, names: Mapping[str, str]) -> TensorDict:
    """``batch`` (in place) with each present key ``old`` of ``names`` renamed to ``new``."""
    for old, new in names.items():
        if old in batch.keys():
            batch.rename_key_(old, new)
    return batch


def agent_view(batch: TensorDict | None, agent: str) -> TensorDict | None:
    """What a node of ``agent`` gets: a shallow copy of ``batch`` where the agent's own
    per-agent fields (``tens/response_ids``) appear under their plain names
    (``response_ids``); other agents' fields and shared fields are unchanged."""
    if batch is None:
        return None
    own = {K.agent_key(agent, key): key for key in K.AGENT_FIELDS}
    return rename_keys(batch.clone(recurse=False), own)


def from_agent_view(batch: TensorDict, agent: str) -> TensorDict:
    """The inverse of :func:`agent_view` on a node's output: the plain per-agent fields it
    holds (read or written by the node) go back into the agent's namespace."""
    return rename_keys(batch, {key: K.agent_key(agent, key) for key in K.AGENT_FIELDS})
