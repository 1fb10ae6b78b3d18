"""DAG specification: parse the ``dag.nodes`` YAML list and validate it without building models.

Every problem becomes a :class:`DagIssue` that names the node, says what is wrong and how to
fix it. :func:`validate_dag` collects all issues and raises one :class:`DagValidationError`,
so a user fixes a broken DAG in one pass instead of one error per run.

The checks live beside this module, one purpose each: ``issues`` (the error types),
``graph`` (:class:`NodeSpec`, :class:`DagSpec`), ``parse`` (one node entry at a time),
``placement`` (``parallel`` blocks and ``dag.branches``), ``structure`` (deps, order,
reachability), ``dataflow`` (keys and batch sizes along the edges) and ``agents``
(multi-agent DAGs). Their public names are importable from here.
"""

from __future__ import annotations

from typing import Any

from embodied_rl.dag.dataflow import check_batches_and_keys
from embodied_rl.dag.graph import DagSpec, NodeSpec
from embodied_rl.dag.issues import DagIssue, DagValidationError, is_int
from embodied_rl.dag.parse import NODE_FIELDS, parse_nodes
from embodied_rl.dag.placement import (
    BRANCH_FIELDS,
    PARALLEL_FIELDS,
    check_branches_used,
    check_resampling,
    parse_branches,
)
from embodied_rl.dag.structure import check_deps, check_reachable, topological_order

__all__ = [
    "BRANCH_FIELDS",
    "NODE_FIELDS",
    "PARALLEL_FIELDS",
    "DagIssue",
    "DagSpec",
    "DagValidationError",
    "NodeSpec",
    "parse_branches",
    "validate_dag",
]


def validate_dag(raw_nodes: Any, num_workers: int, raw_branches: Any = None) -> DagSpec:
    """Validate the raw ``dag.nodes`` list (plain Python data) for ``num_workers`` workers,
    with the optional ``dag.branches`` (branch name -> its workers).

    Raises:
        DagValidationError: listing every problem, each naming the node and the fix.
    """
    issues: list[DagIssue] = []
    if not is_int(num_workers) or num_workers < 1:
        raise DagValidationError(
            [DagIssue(None, f"{num_workers!r} workers", "set workers.num_workers >= 1")]
        )
    branches = parse_branches(raw_branches, num_workers, issues)
    parsed, named = parse_nodes(raw_nodes, num_workers, issues, branches)
    check_branches_used(branches, raw_nodes, issues)
    nodes = check_deps(parsed, named, issues)
    order = topological_order(nodes, issues) if nodes else None
    # With an invalid entry left out, feeds and batch keys would report its absence again.
    if order is not None and len(nodes) == len(named):
        check_reachable(order, issues)
        check_batches_and_keys(order, issues)
    if issues:
        raise DagValidationError(issues)
    dag = DagSpec(order, num_workers, {name: b.ranks for name, b in branches.items()})
    check_resampling(dag, issues)
    if issues:
        raise DagValidationError(issues)
    return dag
