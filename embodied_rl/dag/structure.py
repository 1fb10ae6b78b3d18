"""The DAG's shape: dependencies, a deterministic topological order, cycles and reachability
from the source nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from embodied_rl.dag.graph import NodeSpec
from embodied_rl.dag.issues import DagIssue, suggest


def check_deps(nodes: list[NodeSpec], named: set[str], issues: list[DagIssue]) -> list[NodeSpec]:
    """Drop deps that name no valid node; report self-deps and deps on ids nobody has.

    A dep on an entry that is itself invalid (``named`` but not in ``nodes``) is dropped
    without a report: that entry's own issue says what to fix.
    """
    ids = [n.id for n in nodes]
    every_id = sorted(named)
    for node in nodes:
        for dep in node.deps:
            if dep == node.id:
                issues.append(
                    DagIssue(node.id, "depends on itself", f"remove {dep!r} from its deps")
                )
            elif dep not in named:
                issues.append(
                    DagIssue(
                        node.id,
                        f"unknown dependency {dep!r}{suggest(dep, every_id)}",
                        f"use one of the node ids: {', '.join(every_id)}",
                    )
                )
        node.deps = tuple(d for d in node.deps if d in ids and d != node.id)
    return nodes


def topological_order(nodes: list[NodeSpec], issues: list[DagIssue]) -> list[NodeSpec] | None:
    """Kahn's algorithm with YAML order as tie-break; reports one cycle path if any."""
    by_id = {n.id: n for n in nodes}
    remaining = {n.id: len(set(n.deps)) for n in nodes}
    order: list[NodeSpec] = []
    ready = [n.id for n in nodes if remaining[n.id] == 0]
    while ready:
        current = ready.pop(0)
        order.append(by_id[current])
        for node in nodes:
            if current in node.deps and node.id in remaining:
                remaining[node.id] -= 1
                if remaining[node.id] == 0:
                    ready.append(node.id)
        del remaining[current]
    if not remaining:
        return order
    cycle = _find_cycle({i: by_id[i].deps for i in remaining})
    issues.append(
        DagIssue(
            cycle[0],
            f"cycle in deps: {' -> '.join(cycle + [cycle[0]])}",
            "remove one dependency of the cycle (the DAG must be acyclic; a training loop is "
            "expressed by steps, not by edges)",
        )
    )
    return None


def _find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str]:
    """A cycle among ``deps`` (every node listed is on or leads to a cycle)."""
    path: list[str] = []
    node = next(iter(deps))
    while node not in path:
        path.append(node)
        node = next(d for d in deps[node] if d in deps)
    return path[path.index(node) :]


def check_reachable(order: list[NodeSpec], issues: list[DagIssue]) -> None:
    """Every node must be fed, through deps, by a source node (e.g. the dataloader)."""
    reached: set[str] = set()
    for node in order:
        if node.type.source:
            if node.deps:
                issues.append(
                    DagIssue(
                        node.id,
                        f"source node type {node.type.name!r} cannot have deps",
                        "remove its deps",
                    )
                )
            reached.add(node.id)
        elif node.deps and all(d in reached for d in node.deps):
            reached.add(node.id)
    sources = [n.id for n in order if n.type.source]
    for node in order:
        if node.id not in reached:
            feed = (
                f"add {sources[0]!r} (or a node it feeds) to its deps"
                if sources
                else "add a source node (e.g. data.prompts)"
            )
            issues.append(DagIssue(node.id, "unreachable: no source node feeds it", feed))
