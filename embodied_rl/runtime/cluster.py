"""What the launcher asks of a Ray cluster: reachable, big enough, where each rank landed.

Every check here turns a cluster problem into one message that names what is missing and the
fix, instead of a hang (an unreachable address, a placement group that can never be placed)
or a bare Ray exception:

- :func:`check_reachable`: ``ray.address=host:port`` answers a TCP connection within
  ``ray.connect_timeout_s``.
- :func:`check_capacity`: the alive nodes can hold one bundle per worker at all.
- :func:`wait_placed`: the placement group is placed within ``ray.placement_timeout_s``.
- :func:`placement` and :func:`format_placement`: which Ray node each rank runs on (the
  launcher writes it to ``<run_dir>/placement.json``; ``embodied-rl plan`` prints it).
- :func:`wait_for_lost`: whether a rank's node died, to name it when workers die with it.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any


class ClusterError(RuntimeError):
    """The cluster cannot run the job; the message names what is missing and the fix."""


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node as the launcher reports it."""

    node_id: str
    ip: str
    alive: bool
    resources: dict[str, float]

    @property
    def name(self) -> str:
        """Short readable name: the first 8 hex digits of the node id and its IP."""
        return f"{self.node_id[:8]} ({self.ip})"


def nodes() -> list[NodeInfo]:
    """Every node the cluster knows, alive or dead (``ray.nodes()``)."""
    import ray

    return [
        NodeInfo(
            str(n["NodeID"]),
            str(n.get("NodeManagerAddress", "?")),
            bool(n.get("Alive")),
            {k: float(v) for k, v in (n.get("Resources") or {}).items()},
        )
        for n in ray.nodes()
    ]


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of an explicit GCS address; None for ``auto``/``local``/``ray://``."""
    if address in ("auto", "local") or "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(
            f"ray.address={address!r} is not host:port. Fix: give the head node's GCS address "
            "(e.g. ray.address=10.0.0.1:6379), ray.address=auto on a node of a running cluster, "
            "or ray.address=null for an embedded cluster on this machine"
        )
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float) -> None:
    """Refuse an explicit ``host:port`` that does not accept a TCP connection in time.

    Ray itself retries an unreachable GCS for about a minute before it gives up, with messages
    that do not say what to do.
    """
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else str(err)
        raise ClusterError(
            f"cannot reach the Ray cluster at ray.address={address} ({reason}, waited up to "
            f"{timeout_s:g} s). Fix: start its head with `ray start --head --port={target[1]}` "
            "(see README, 'Running on a Ray cluster'), check the host and port and that no "
            "firewall blocks them, or set ray.address=null to run on an embedded cluster here"
        ) from None


def connect_error(address: str, err: Exception) -> ClusterError:
    """The message for ``ray.init(address=...)`` failing after the address was reachable."""
    return ClusterError(
        f"could not join the Ray cluster at ray.address={address}: {err}. Fix: with "
        "ray.address=auto run on a node of a running cluster (`ray start --head` or "
        "`ray start --address=<head>:6379` first) or give the head's host:port; "
        "ray.address=null runs on an embedded cluster here"
    )


def bundles_that_fit(resources: dict[str, float], bundle: dict[str, float]) -> int:
    """How many copies of ``bundle`` a node with ``resources`` holds (0 if one is missing)."""
    # + 1e-6: Ray reports fractional resources with float noise (0.9999999 CPU)
    counts = [int(resources.get(k, 0.0) / v + 1e-6) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 0


def check_capacity(num_workers: int, bundle: dict[str, float], strategy: str) -> None:
    """Refuse a job the cluster's alive nodes can never hold, naming the shortfall.

    Counts total (not currently free) resources: a bundle that fits but is held by another
    job is waited for by :func:`wait_placed` instead.
    """
    alive = [n for n in nodes() if n.alive]
    per_node = {n.name: bundles_that_fit(n.resources, bundle) for n in alive}
    if strategy == "STRICT_PACK":
        fits = max(per_node.values(), default=0)
    elif strategy == "STRICT_SPREAD":
        fits = sum(1 for count in per_node.values() if count > 0)
    else:
        fits = sum(per_node.values())
    if fits >= num_workers:
        return
    holds = ", ".join(f"{name}: {count}" for name, count in per_node.items()) or "none"
    raise ClusterError(
        f"the DAG needs {num_workers} workers of {bundle} each (ray.placement_strategy="
        f"{strategy}); the cluster's {len(alive)} alive node(s) hold {fits} (per node: "
        f"{holds}). Fix: add nodes or resources to the cluster, or lower workers.num_workers "
        "or workers.cpus_per_worker"
    )


def wait_placed(group: Any, timeout_s: float, num_workers: int, bundle: dict[str, float]) -> None:
    """Wait for the placement group; on timeout name what is free per node and the fix."""
    import ray

    try:
        ray.get(group.ready(), timeout=timeout_s)
        return
    except ray.exceptions.GetTimeoutError:
        pass
    free = ray.available_resources()
    alive = ", ".join(n.name for n in nodes() if n.alive) or "none"
    raise ClusterError(
        f"the cluster did not place {num_workers} workers of {bundle} each within "
        f"ray.placement_timeout_s={timeout_s:g} s (free now: {free}; alive nodes: {alive}). "
        "A node may have been lost while starting, or other jobs hold the resources. Fix: "
        "check `ray status`, restart lost nodes, or lower workers.num_workers"
    )


def placement(group: Any) -> list[str]:
    """The Ray node id of each bundle (= rank) of a placed placement group."""
    from ray.util import placement_group_table

    by_bundle = placement_group_table(group)["bundles_to_node_id"]
    return [str(by_bundle[i]) for i in range(len(by_bundle))]


def format_placement(rank_nodes: list[str]) -> str:
    """One line per node: its short name and its ranks, nodes in order of their first rank."""
    known = {n.node_id: n for n in nodes()}
    ranks: dict[str, list[int]] = {}
    for rank, node_id in enumerate(rank_nodes):
        ranks.setdefault(node_id, []).append(rank)
    lines = [f"placement: {len(rank_nodes)} worker(s) on {len(ranks)} Ray node(s)"]
    for node_id, members in ranks.items():
        name = known[node_id].name if node_id in known else node_id[:8]
        lines.append(f"  node {name}: ranks {', '.join(map(str, members))}")
    return "\n".join(lines)


def wait_for_lost(node_id: str, timeout_s: float, poll_s: float = 0.5) -> NodeInfo | None:
    """The node once the cluster has marked it dead; None if it is still alive after
    ``timeout_s`` (the worker died on a healthy node) or Ray cannot be asked."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = {n.node_id: n for n in nodes()}
        except Exception:  # noqa: BLE001 - only used to improve a failure message
            return None
        if node_id in state and not state[node_id].alive:
            return state[node_id]
        if node_id not in state or time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)
