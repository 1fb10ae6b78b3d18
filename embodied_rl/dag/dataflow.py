"""What flows along the DAG's edges: the batch keys each node reads and writes, and the
global batch size that enters each node.

Both are propagated in topological order from the source nodes; a node that reads a key no
upstream node writes, or whose batch cannot be split over its data-parallel ranks, gets a
:class:`~embodied_rl.dag.issues.DagIssue`.
"""

from __future__ import annotations

from collections.abc import Mapping

from embodied_rl import keys as K
from embodied_rl.dag.agents import check_agent_inputs, check_agent_writers
from embodied_rl.dag.graph import NodeSpec
from embodied_rl.dag.issues import DagIssue


def _resolve_keys(order: list[NodeSpec]) -> dict[str, list[str]]:
    """Set each node's ``reads``/``writes`` (an agent's per-agent fields in its namespace);
    returns every key's writers (node ids, in order)."""
    every_writer: dict[str, list[str]] = {}
    for node in order:
        node.reads = tuple(K.key_of_agent(node.agent, k) for k in node.type.read_keys(node.config))
        node.writes = tuple(
            K.key_of_agent(node.agent, k) for k in node.type.write_keys(node.config)
        )
        for key in node.writes:
            every_writer.setdefault(key, []).append(node.id)
    return every_writer


def check_batches_and_keys(order: list[NodeSpec], issues: list[DagIssue]) -> None:
    """Propagate global batch sizes and available keys along the DAG, checking each node."""
    every_writer = _resolve_keys(order)
    available: dict[str, set[str]] = {}
    writers: dict[str, list[NodeSpec]] = {}  # key -> the nodes before this one writing it
    for node in order:
        upstream: set[str] = set()
        for dep in node.deps:
            upstream |= available.get(dep, set())
        missing = [k for k in node.reads if k not in upstream]
        if missing and not node.type.source:
            _report_missing_reads(node, missing, every_writer, issues)
        if node.agent is not None:
            check_agent_inputs(node, upstream, writers, issues)
        check_agent_writers(node, writers, issues)
        for key in node.writes:
            writers.setdefault(key, []).append(node)
        available[node.id] = upstream | set(node.writes)
        node.global_batch = _global_batch(node, order, issues)
        if node.global_batch is not None and node.global_batch % node.layout.dp_size:
            issues.append(
                DagIssue(
                    node.id,
                    f"global batch of {node.global_batch} samples is not divisible by its "
                    f"data-parallel size {node.layout.dp_size}",
                    f"make the batch size a multiple of {node.layout.dp_size} or change the "
                    "node's workers/tp",
                )
            )


def _report_missing_reads(
    node: NodeSpec,
    missing: list[str],
    every_writer: Mapping[str, list[str]],
    issues: list[DagIssue],
) -> None:
    """One issue for the keys ``node`` reads that nothing upstream writes; an agent's output
    that does not reach it gets its own issue naming the agent."""
    plain = [k for k in missing if K.owning_agent(k) is None]
    if plain:
        issues.append(
            DagIssue(
                node.id,
                f"reads {plain} but no upstream node writes {'it' if len(plain) == 1 else 'them'}",
                "add a dep on a node that writes these keys, or change the node type"
                + (
                    " or its config (what it reads depends on it)"
                    if callable(node.type.reads)
                    else ""
                ),
            )
        )
    reader = f"(agent {node.agent!r}) " if node.agent is not None else ""
    for key in missing:
        agent = K.owning_agent(key)
        if agent is None:
            continue
        elsewhere = every_writer.get(key, [])
        why = (
            f"only {elsewhere} write(s) it, which do(es) not run before this node"
            if elsewhere
            else f"no node of agent {agent!r} writes it"
        )
        issues.append(
            DagIssue(
                node.id,
                f"{reader}reads {key!r}, an output of agent {agent!r}, but {why}",
                f"depend on the node of agent {agent!r} that writes it (an agent sees only "
                "agents that acted before it), or fix the agent's name in the config",
            )
        )


def _global_batch(node: NodeSpec, order: list[NodeSpec], issues: list[DagIssue]) -> int | None:
    """Samples per step entering ``node`` times its batch factor."""
    if node.type.source:
        size = getattr(node.config, "batch_size", None)
        if size is None:
            return None
        # A source may pad its batch to the ranks (data.tasks with each_pair_once).
        padded = getattr(node.config, "padded_batch_size", None)
        size = padded(node.layout.dp_size) if padded is not None else size
        return int(size) * node.type.factor(node.config)
    by_id = {n.id: n for n in order}
    sizes = {by_id[d].global_batch for d in node.deps if d in by_id}
    sizes.discard(None)
    if len(sizes) > 1:
        issues.append(
            DagIssue(
                node.id,
                f"its deps carry different batch sizes {sorted(sizes)}",
                "depend on nodes of one batch",
            )
        )
        return None
    return sizes.pop() * node.type.factor(node.config) if sizes else None
