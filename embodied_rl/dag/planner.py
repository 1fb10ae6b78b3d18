"""Turn a validated DAG into one plan per worker rank.

A plan is the rank's ordered list of steps: run a node (when the rank is in the node's
layout) or take part in a transfer (when a dependency's layout differs from the consumer's
and the rank holds or receives data). Every rank walks the DAG in the same topological order,
so collectives line up without a central scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied_rl.dag.spec import DagSpec
from embodied_rl.data.layout import Layout


@dataclass(frozen=True)
class RunNode:
    """Run node ``node_id`` on this rank."""

    node_id: str
    type_name: str
    layout: Layout
    dp_group: tuple[int, ...]


@dataclass(frozen=True)
class Transfer:
    """Move ``src_node``'s output from its layout to ``dst_node``'s layout.

    ``ranks`` are all participants (union of both layouts): the collective's group.
    """

    src_node: str
    dst_node: str
    src: Layout
    dst: Layout
    ranks: tuple[int, ...]


Step = RunNode | Transfer


@dataclass
class WorkerPlan:
    """The ordered steps one rank executes every training step."""

    rank: int
    steps: list[Step] = field(default_factory=list)

    def node_ids(self) -> list[str]:
        return [s.node_id for s in self.steps if isinstance(s, RunNode)]


def needs_transfer(src: Layout, dst: Layout) -> bool:
    return src != dst


def plan_dag(dag: DagSpec) -> list[WorkerPlan]:
    """One :class:`WorkerPlan` per rank ``0..num_workers-1``."""
    plans = [WorkerPlan(rank) for rank in range(dag.num_workers)]
    for node in dag.nodes:
        for dep_id in node.deps:
            dep = dag.by_id[dep_id]
            if not needs_transfer(dep.layout, node.layout):
                continue
            ranks = tuple(sorted(set(dep.layout.ranks) | set(node.layout.ranks)))
            transfer = Transfer(dep_id, node.id, dep.layout, node.layout, ranks)
            for rank in ranks:
                plans[rank].steps.append(transfer)
        for rank in node.layout.ranks:
            step = RunNode(node.id, node.type.name, node.layout, node.layout.dp_group_ranks(rank))
            plans[rank].steps.append(step)
    return plans


def process_groups(plans: list[WorkerPlan]) -> list[tuple[int, ...]]:
    """Every distinct rank set that needs a process group, in one canonical order.

    All ranks must create the same groups in the same order (torch.distributed requires
    ``new_group`` to be called by every rank), so the order depends only on the DAG.
    """
    groups: set[tuple[int, ...]] = set()
    for plan in plans:
        for step in plan.steps:
            groups.add(step.dp_group if isinstance(step, RunNode) else step.ranks)
    return sorted(groups, key=lambda ranks: (len(ranks), ranks))


def format_plan(dag: DagSpec, plans: list[WorkerPlan]) -> str:
    """Human-readable plan, as printed by ``embodied-rl plan``."""
    lines = [f"{dag.num_workers} worker(s); nodes in order: {', '.join(n.id for n in dag.nodes)}"]
    lines.append("code of each node (module:function):")
    for node in dag.nodes:
        lines.append(f"  {node.id} ({node.type.name}): {node.type.implementation()}")
    for plan in plans:
        lines.append(f"rank {plan.rank}:")
        if not plan.steps:
            lines.append("  (idle)")
        for step in plan.steps:
            lines.append("  " + _format_step(dag, plan.rank, step))
    groups = process_groups(plans)
    lines.append("process groups: " + ", ".join(str(list(g)) for g in groups))
    for name, ranks in dag.branches.items():
        members = [n.id for n in dag.nodes if n.branch == name]
        lines.append(
            f"branch {name}: workers {list(ranks)}, nodes {', '.join(members)} (metrics {name}/...)"
        )
    for agent in dict.fromkeys(n.agent for n in dag.nodes if n.agent is not None):
        members = [n for n in dag.nodes if n.agent == agent]
        ranks = sorted({r for n in members for r in n.layout.ranks})
        lines.append(
            f"agent {agent}: workers {ranks}, nodes {', '.join(n.id for n in members)} "
            f"(batch fields {agent}/..., metrics {agent}/...)"
        )
    return "\n".join(lines)


def _format_step(dag: DagSpec, rank: int, step: Step) -> str:
    if isinstance(step, Transfer):
        role = []
        if rank in step.src.shard_leaders():
            role.append("send")
        if rank in step.dst:
            role.append("receive")
        return (
            f"transfer {step.src_node} -> {step.dst_node}: dp {step.src.dp_size} "
            f"{list(step.src.ranks)} -> dp {step.dst.dp_size} {list(step.dst.ranks)} "
            f"[{'+'.join(role) or 'relay'}] group {list(step.ranks)}"
        )
    node = dag.by_id[step.node_id]
    batch = (
        f", {node.global_batch // node.layout.dp_size} of {node.global_batch} samples"
        if node.global_batch
        else ""
    )
    tp = (
        f", tp {step.layout.tp_rank(rank)}/{step.layout.tp_size}" if step.layout.tp_size > 1 else ""
    )
    return (
        f"node {step.node_id} ({step.type_name}): dp {step.layout.dp_rank(rank)}/"
        f"{step.layout.dp_size}{tp}{batch}, group {list(step.dp_group)}"
    )
