"""The validated DAG: :class:`NodeSpec` per node and the :class:`DagSpec` that orders them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from embodied_rl.dag.node_type import NodeType
from embodied_rl.data.layout import Layout


@dataclass
class NodeSpec:
    """One validated DAG node.

    ``agent``: the agent of a multi-agent DAG this node acts for (``None``: the node serves
    no single agent). Its ``reads``/``writes`` are already in the agent's namespace
    (``tens/response_ids``); the node function itself sees plain keys (the executor maps them).
    """

    id: str
    type: NodeType
    deps: tuple[str, ...]
    config: Any
    layout: Layout
    global_batch: int | None = None
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    branch: str | None = None
    agent: str | None = None


@dataclass
class DagSpec:
    """A validated DAG: nodes in a deterministic topological order.

    ``branches``: ``dag.branches``, name -> the worker ranks of that branch. A branch is a
    part of the DAG with its own workers (e.g. an LLM trained with GRPO beside a VLA trained
    with SRPO in one job); its nodes log their metrics as ``<branch>/<name>``.
    """

    nodes: list[NodeSpec]
    num_workers: int
    branches: dict[str, tuple[int, ...]] = field(default_factory=dict)
    by_id: dict[str, NodeSpec] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {n.id: n for n in self.nodes}

    def consumers(self, node_id: str) -> list[NodeSpec]:
        return [n for n in self.nodes if node_id in n.deps]

    def ancestors(self, node_id: str) -> set[str]:
        """Every node that feeds ``node_id``, directly or through other nodes."""
        found: set[str] = set()
        todo = list(self.by_id[node_id].deps)
        while todo:
            dep = todo.pop()
            if dep not in found:
                found.add(dep)
                todo.extend(self.by_id[dep].deps)
        return found
