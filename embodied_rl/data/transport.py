"""Transports of the databuffer: how packed bytes move between the ranks of a group.

:func:`~embodied_rl.data.databuffer.redistribute` needs only the :class:`Transport` protocol,
so a different transport (or a central-controller baseline in a benchmark) plugs in without
touching the assignment logic. :class:`TransferStats` measures what one rank moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist


def bytes_to_tensor(data: bytes) -> torch.Tensor:
    """A ``(len(data),)`` uint8 tensor owning a copy of ``data``."""
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    # bytearray: frombuffer needs a writable buffer to avoid a warning.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@dataclass
class TransferStats:
    """What one rank spent on redistributions (accumulates over calls).

    Attributes:
        calls: Number of :func:`redistribute` calls that communicated.
        bytes_sent: Payload bytes this rank sent to other ranks.
        bytes_received: Payload bytes this rank received from other ranks.
        bytes_local: Payload bytes this rank sent to itself (a copy, no network).
        metadata_bytes: Pickled metadata bytes this rank contributed to the all-gather.
        num_collectives: Collective operations issued (metadata and payload).
        metadata_seconds: Wall time of describing, gathering metadata and assigning units.
        payload_seconds: Wall time of packing, the payload all-to-all and unpacking.
    """

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_local: int = 0
    metadata_bytes: int = 0
    num_collectives: int = 0
    metadata_seconds: float = 0.0
    payload_seconds: float = 0.0


class Transport(Protocol):
    """The collectives a redistribution needs, over the ranks of both layouts.

    Peers are addressed by their position in the group (``group_rank``). A transport counts its
    collectives in ``num_collectives`` so benchmarks can compare implementations.
    """

    num_collectives: int

    def size(self) -> int:
        """Number of ranks in the group."""
        ...

    def group_rank(self, global_rank: int) -> int:
        """Position of a global worker rank in the group."""
        ...

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, indexed by group rank."""
        ...

    def all_to_all(
        self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]
    ) -> torch.Tensor:
        """Exchange slices of a flat ``uint8`` tensor.

        Args:
            send: ``(sum(send_splits),)`` uint8; slice ``p`` goes to group rank ``p``.
            send_splits: Bytes for each group rank, length ``size()``.
            recv_splits: Bytes expected from each group rank, length ``size()``.

        Returns:
            ``(sum(recv_splits),)`` uint8, the slices of all ranks in group-rank order.
        """
        ...


class AllToAllTransport:
    """:class:`Transport` over a ``torch.distributed`` process group (gloo, NCCL, HCCL).

    Args:
        group: The process group holding exactly the ranks of both layouts.
        device: Where communication buffers live: ``cpu`` for gloo, the local accelerator
            for NCCL/HCCL. Received tensors stay on this device.
    """

    def __init__(self, group: dist.ProcessGroup, device: torch.device | str = "cpu") -> None:
        self.group = group
        self.device = torch.device(device)
        self.num_collectives = 0

    def size(self) -> int:
        return dist.get_world_size(self.group)

    def group_rank(self, global_rank: int) -> int:
        return dist.get_group_rank(self.group, global_rank)

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.size())]
        dist.all_gather(sizes, size, group=self.group)
        self.num_collectives += 1
        lengths = [int(s.item()) for s in sizes]
        longest = max(lengths)
        if longest == 0:  # every rank knows this from the sizes: skip consistently
            return [b"" for _ in lengths]
        # gloo's all_gather needs equal sizes: pad every payload to the longest.
        buffer = torch.zeros(longest, dtype=torch.uint8)
        buffer[: len(payload)] = bytes_to_tensor(payload)
        buffer = buffer.to(self.device)
        gathered = [torch.empty_like(buffer) for _ in lengths]
        dist.all_gather(gathered, buffer, group=self.group)
        self.num_collectives += 1
        return [g[:n].cpu().numpy().tobytes() for g, n in zip(gathered, lengths)]

    def all_to_all(
        self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]
    ) -> torch.Tensor:
        out = torch.empty(sum(recv_splits), dtype=send.dtype, device=self.device)
        dist.all_to_all_single(
            out,
            send.to(self.device),
            output_split_sizes=recv_splits,
            input_split_sizes=send_splits,
            group=self.group,
        )
        self.num_collectives += 1
        return out
