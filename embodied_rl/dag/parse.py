"""One ``dag.nodes`` entry at a time: its fields, id, type, config, deps and placement.

Each entry is checked on its own here; how the entries fit together (deps, order, keys,
batch sizes) is checked afterwards by ``embodied_rl.dag.structure`` and
``embodied_rl.dag.dataflow``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embodied_rl.dag.agents import check_agent_name
from embodied_rl.dag.graph import NodeSpec
from embodied_rl.dag.issues import DagIssue, is_int, suggest
from embodied_rl.dag.node_type import NodeConfigError, NodeType
from embodied_rl.dag.placement import branch_layout, parse_layout
from embodied_rl.data.layout import Layout
from embodied_rl.registry import NODE_TYPES

NODE_FIELDS = ("id", "type", "deps", "config", "parallel", "branch", "agent")


def _parse_deps(node_id: str, raw: Any, issues: list[DagIssue]) -> tuple[str, ...]:
    """``deps`` as node ids: a list of ids, one id, or nothing."""
    if raw is None:
        return ()
    listed = [raw] if isinstance(raw, str | int) and not isinstance(raw, bool) else raw
    if isinstance(listed, list | tuple) and all(isinstance(d, str) or is_int(d) for d in listed):
        return tuple(str(d) for d in listed)
    issues.append(
        DagIssue(
            node_id,
            f"'deps' must be a list of node ids, got {raw!r}",
            "write e.g. deps: [prompts]",
        )
    )
    return ()


def _node_id(index: int, raw: Any, issues: list[DagIssue]) -> str | None:
    """The id of node entry ``index`` (a non-empty string or an int), or ``None``."""
    node_id = raw.get("id") if isinstance(raw, Mapping) else None
    if isinstance(node_id, str) and node_id.strip() or is_int(node_id):
        return str(node_id)
    got = "it is not a mapping" if not isinstance(raw, Mapping) else f"got id {node_id!r}"
    issues.append(
        DagIssue(
            None,
            f"node #{index} has no usable 'id' ({got})",
            "give every node a unique id: a non-empty name such as 'rollout'",
        )
    )
    return None


def parse_nodes(
    raw_nodes: Any, num_workers: int, issues: list[DagIssue], branches: Mapping[str, Layout]
) -> tuple[list[NodeSpec], set[str]]:
    """Check each node entry on its own: fields, id, type, config and placement.

    Returns:
        The valid nodes, and the ids of all entries (valid or not).
    """
    if not isinstance(raw_nodes, list | tuple) or not raw_nodes:
        issues.append(
            DagIssue(
                None,
                f"dag.nodes must be a non-empty list, got {str(raw_nodes)[:60]!r}",
                "list the DAG's nodes",
            )
        )
        return [], set()
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_nodes):
        node_id = _node_id(index, raw, issues)
        if node_id is None:
            continue
        _check_fields(node_id, raw, issues)
        if node_id in seen:
            issues.append(
                DagIssue(node_id, "duplicate node id", "rename one of the nodes with this id")
            )
            continue
        seen.add(node_id)
        node = _parse_node(node_id, raw, num_workers, issues, branches)
        if node is not None:
            nodes.append(node)
    return nodes, seen


def _check_fields(node_id: str, raw: Mapping[Any, Any], issues: list[DagIssue]) -> None:
    """Report the entry's fields that are not ``NODE_FIELDS`` (with the closest one)."""
    unknown = sorted(map(str, set(raw) - set(NODE_FIELDS)))
    if unknown:
        issues.append(
            DagIssue(
                node_id,
                f"unknown field(s) {unknown}" + "".join(suggest(k, NODE_FIELDS) for k in unknown),
                f"use only {list(NODE_FIELDS)}",
            )
        )


def _parse_node(
    node_id: str,
    raw: Mapping[Any, Any],
    num_workers: int,
    issues: list[DagIssue],
    branches: Mapping[str, Layout],
) -> NodeSpec | None:
    """The entry as a node (type, config, deps, layout, branch, agent), or ``None`` when one
    of them is unusable; issues come in that order, the deps' and layout's together."""
    node_type = _node_type(node_id, raw.get("type"), issues)
    if node_type is None:
        return None
    try:
        config = node_type.build_config(raw.get("config"))
    except NodeConfigError as err:
        issues.append(DagIssue(node_id, err.problem, err.fix))
        return None
    deps = _parse_deps(node_id, raw.get("deps"), issues)
    layout = parse_layout(node_id, raw.get("parallel"), num_workers, issues)
    branch = raw.get("branch")
    if branch is not None:
        own = layout if raw.get("parallel") is not None else None
        layout = branch_layout(node_id, branch, own, branches, issues)
        if layout is None:
            return None
    agent = raw.get("agent")
    if not check_agent_name(node_id, agent, issues):
        return None
    return NodeSpec(node_id, node_type, deps, config, layout, branch=branch, agent=agent)


def _node_type(node_id: str, type_name: Any, issues: list[DagIssue]) -> NodeType | None:
    """The registered node type named by the entry's ``type``, or ``None`` (reported)."""
    if type_name is None:
        issues.append(DagIssue(node_id, "has no 'type'", "set type: to a registered type"))
        return None
    if not isinstance(type_name, str) or type_name not in NODE_TYPES:
        shown = type_name if isinstance(type_name, str) else str(type_name)
        issues.append(
            DagIssue(
                node_id,
                f"unknown node type {type_name!r}{suggest(shown, NODE_TYPES.names())}",
                f"use a registered type: {', '.join(NODE_TYPES.names())}",
            )
        )
        return None
    return NODE_TYPES.get(type_name)
