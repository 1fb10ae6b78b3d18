"""Transports of the databuffer: how packed bytes move between the ranks of a group.

:func:`~embodied_rl.data.databuffer.redistribute` needs only the :class:`Transport` protocol,
so a different transport (or a central-controller baseline in a benchmark) plugs in without
touching the assignment logic. :class:`TransferStats` measures what one rank moved.

Two transports:

- :class:`AllToAllTransport`: one ``all_to_all_single`` on the process group. Works across
  machines and on accelerators (NCCL/HCCL move device memory directly).
- :class:`SharedMemoryTransport`: for CPU groups with several ranks on one node. gloo moves
  bytes through TCP loopback, several times slower than a memory copy, so between ranks of
  one node each sender copies its slices into ``/dev/shm`` files
  that each receiver keeps mapped: one memory copy and no socket. Slices between nodes go
  through one ``all_to_all_single`` on the group. Control (metadata, barriers) stays on gloo.

A "node" is a Ray node (:func:`node_identity`): several Ray nodes started on one machine (the
multi-node tests) are treated as the separate machines they stand for. Each transport counts
the payload bytes this rank sent through shared memory and through the network.

:func:`transport_for` picks one per process group, once, and caches it.
"""

from __future__ import annotations

import itertools
import os
import pickle
import socket
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from embodied_rl.shm import remove_orphans, shm_dir


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
        bytes_shm: Of ``bytes_sent``, what went through shared memory (same node).
        bytes_network: Of ``bytes_sent``, what went through the collective (another node, or
            any peer when the collective transport is used).
        metadata_bytes: Pickled metadata bytes this rank contributed to the all-gather.
        num_collectives: Collective operations issued (metadata and payload).
        metadata_seconds: Wall time of describing, gathering metadata and assigning units.
        payload_seconds: Wall time of packing, the payload all-to-all and unpacking.
    """

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_local: int = 0
    bytes_shm: int = 0
    bytes_network: int = 0
    metadata_bytes: int = 0
    num_collectives: int = 0
    metadata_seconds: float = 0.0
    payload_seconds: float = 0.0


class Transport(Protocol):
    """The collectives a redistribution needs, over the ranks of both layouts.

    Peers are addressed by their position in the group (``group_rank``). A transport counts its
    collectives in ``num_collectives`` so benchmarks can compare implementations, and the
    payload bytes it sent to other ranks by path in ``shm_bytes`` and ``network_bytes``.
    """

    num_collectives: int
    shm_bytes: int
    network_bytes: int

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
        self.shm_bytes = 0  # never: every byte goes through the collective
        self.network_bytes = 0

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
        me = dist.get_rank(self.group)
        self.network_bytes += sum(send_splits) - send_splits[me]
        dist.all_to_all_single(
            out,
            send.to(self.device),
            output_split_sizes=recv_splits,
            input_split_sizes=send_splits,
            group=self.group,
        )
        self.num_collectives += 1
        return out


SEGMENT_PREFIX = "erl-db-"  # then the sending process's pid: see embodied_rl.shm
_instance_ids = itertools.count()


class SharedMemoryTransport:
    """:class:`Transport` for CPU groups with several ranks per node: shared memory within a
    node, one collective between nodes.

    Each (sender, receiver) pair on one node has one file in ``/dev/shm``, named after the
    sender's pid and transport instance and the receiver, kept mapped on both sides for the
    transport's life and grown when a payload is larger. Reusing it matters: the first write to
    a fresh tmpfs page costs a page fault and zeroing, several times the copy itself.
    ``all_to_all`` is: barrier (receivers are done with the previous payload), every sender
    copies its same-node slices into its files, the slices for other nodes go through one
    ``all_to_all_single`` (only when the group spans nodes), barrier, every receiver returns
    views of its files or their concatenation with the network part. The views are valid until
    the next ``all_to_all`` on this transport, and
    :func:`~embodied_rl.data.databuffer.redistribute` copies out of them before returning.

    Construction is collective: the ranks exchange (node, pid, instance) once, so file names
    never collide between runs, groups or processes. Metadata all-gathers and the barriers go
    through ``group`` (gloo). Files are unlinked when the transport is collected or the process
    exits; a killed process's files are removed by the next transport that starts
    (:func:`embodied_rl.shm.remove_orphans`).

    Args:
        group: CPU process group.
        peers: The (node, pid, instance) of every group rank, from :func:`build_transport`'s
            handshake.
        instance: This rank's instance id, part of its file names.
    """

    def __init__(
        self, group: dist.ProcessGroup, peers: list[tuple[str, int, int]], instance: int
    ) -> None:
        self.collective = AllToAllTransport(group)
        self.group, self.peers, self.instance = group, peers, instance
        self.me = dist.get_rank(group)
        node = peers[self.me][0]
        self.same_node = [peer_node == node for peer_node, _, _ in peers]
        self.spans_nodes = not all(self.same_node)
        self.root = shm_dir()
        self.shm_bytes = 0
        self._outgoing: dict[int, torch.Tensor] = {}  # receiver -> mapping of our file
        self._incoming: dict[int, torch.Tensor] = {}  # sender -> mapping of its file
        own = [self._segment(self.me, p) for p in self._shm_peers()]
        weakref.finalize(self, _unlink_all, own)

    @property
    def num_collectives(self) -> int:
        return self.collective.num_collectives

    @property
    def network_bytes(self) -> int:
        return self.collective.network_bytes

    def size(self) -> int:
        return self.collective.size()

    def group_rank(self, global_rank: int) -> int:
        return self.collective.group_rank(global_rank)

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        return self.collective.all_gather_bytes(payload)

    def _shm_peers(self) -> list[int]:
        """Group ranks on this node other than this one."""
        return [p for p, same in enumerate(self.same_node) if same and p != self.me]

    def _segment(self, sender: int, receiver: int) -> Path:
        _, pid, instance = self.peers[sender]
        return self.root / f"{SEGMENT_PREFIX}{pid}-{instance}-{receiver}"

    def all_to_all(
        self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]
    ) -> torch.Tensor:
        offsets = [0, *itertools.accumulate(send_splits)]
        dist.barrier(group=self.group)  # nobody still reads the previous payload
        for p in self._shm_peers():
            if send_splits[p]:
                self._outgoing_view(p, send_splits[p]).copy_(send[offsets[p] : offsets[p + 1]])
                self.shm_bytes += send_splits[p]
        remote = self._exchange_between_nodes(send, offsets, send_splits, recv_splits)
        dist.barrier(group=self.group)  # every slice addressed to anyone is written
        self.collective.num_collectives += 2
        parts = []
        for q, nbytes in enumerate(recv_splits):
            if not nbytes:
                continue
            if q == self.me:
                parts.append(send[offsets[q] : offsets[q + 1]])
            elif self.same_node[q]:
                parts.append(self._incoming_view(q, nbytes))
            else:
                parts.append(remote[q])
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)

    def _exchange_between_nodes(
        self, send: torch.Tensor, offsets: list[int], send_splits: list[int], recv_splits: list[int]
    ) -> dict[int, torch.Tensor]:
        """The slices for other nodes through one collective; ``{sender: received slice}``."""
        if not self.spans_nodes:
            return {}
        remote = [not same for same in self.same_node]
        net_send = [n if far else 0 for n, far in zip(send_splits, remote)]
        net_recv = [n if far else 0 for n, far in zip(recv_splits, remote)]
        slices = [send[offsets[p] : offsets[p + 1]] for p, n in enumerate(net_send) if n]
        payload = torch.cat(slices) if slices else torch.empty(0, dtype=torch.uint8)
        received = self.collective.all_to_all(payload, net_send, net_recv)
        ends = [0, *itertools.accumulate(net_recv)]
        return {q: received[ends[q] : ends[q + 1]] for q, n in enumerate(net_recv) if n}

    def _outgoing_view(self, receiver: int, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of our file for ``receiver``, grown (never shrunk) to fit."""
        mapped = self._outgoing.get(receiver)
        if mapped is None or mapped.numel() < nbytes:
            path = self._segment(self.me, receiver)
            with open(path, "ab") as f:  # creates it, or keeps what is there
                os.ftruncate(f.fileno(), max(nbytes, os.fstat(f.fileno()).st_size))
            mapped = _map(path)
            self._outgoing[receiver] = mapped
        return mapped[:nbytes]

    def _incoming_view(self, sender: int, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of ``sender``'s file for us (remapped when it has grown)."""
        mapped = self._incoming.get(sender)
        if mapped is None or mapped.numel() < nbytes:
            mapped = _map(self._segment(sender, self.me))
            self._incoming[sender] = mapped
        return mapped[:nbytes]


def _map(path: Path) -> torch.Tensor:
    """The whole file as a shared ``(size,)`` uint8 tensor."""
    return torch.from_file(str(path), shared=True, size=path.stat().st_size, dtype=torch.uint8)


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


NODE_ENV = "EMBODIED_RL_NODE_ID"


def node_identity() -> str:
    """The node this process runs on: ``$EMBODIED_RL_NODE_ID`` if set, else the Ray node id
    inside a Ray worker, else the host name.

    Ray's node id, not the host name, so that Ray nodes started side by side on one machine
    (the multi-node tests, ``embodied_rl.runtime.local_cluster``) use the transport between
    machines as a real cluster would.
    """
    if os.environ.get(NODE_ENV):
        return os.environ[NODE_ENV]
    ray = sys.modules.get("ray")  # never import Ray just to ask
    if ray is not None and ray.is_initialized():
        return str(ray.get_runtime_context().get_node_id())
    return socket.gethostname()


def build_transport(group: dist.ProcessGroup, node: str | None = None) -> Transport:
    """A new transport for ``group``; collective over the group's ranks.

    Shared memory (:class:`SharedMemoryTransport`) when the backend is gloo and some ranks
    share a node, else :class:`AllToAllTransport`. ``EMBODIED_RL_TRANSPORT=collective`` forces
    the collective transport (for comparisons), ``shm`` demands shared memory.

    Args:
        group: The process group.
        node: This rank's node (default :func:`node_identity`).
    """
    transport: Transport = AllToAllTransport(group)
    wanted = os.environ.get("EMBODIED_RL_TRANSPORT", "auto")
    if wanted not in ("auto", "collective", "shm"):
        raise ValueError(f"EMBODIED_RL_TRANSPORT must be auto, collective or shm, got {wanted!r}")
    if wanted == "collective" or dist.get_backend(group) != "gloo":
        return transport
    instance = next(_instance_ids)
    me = pickle.dumps((node or node_identity(), os.getpid(), instance))
    peers = [pickle.loads(p) for p in transport.all_gather_bytes(me)]
    nodes = [peer_node for peer_node, _, _ in peers]
    if len(set(nodes)) < len(nodes):  # some rank has a peer on its node
        remove_orphans(SEGMENT_PREFIX)
        return SharedMemoryTransport(group, peers, instance)
    if wanted == "shm":
        raise ValueError("EMBODIED_RL_TRANSPORT=shm needs ranks that share a node")
    return transport


# One transport per process group, built at its first use (a collective of the group's ranks,
# who all reach the same redistribution together). Groups live for the whole run.
_TRANSPORTS: dict[int, tuple[dist.ProcessGroup, Transport]] = {}


def transport_for(group: dist.ProcessGroup) -> Transport:
    """The cached transport of ``group`` (:func:`build_transport`). Collective on first use."""
    cached = _TRANSPORTS.get(id(group))
    if cached is not None and cached[0] is group:
        return cached[1]
    transport = build_transport(group)
    _TRANSPORTS[id(group)] = (group, transport)
    return transport
