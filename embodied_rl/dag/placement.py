"""Where DAG nodes run: ``parallel`` blocks, ``dag.branches`` and a node's place in its branch.

A node's ``parallel: {workers: [..] | num_workers: k, tp: t}`` becomes a
:class:`~embodied_rl.data.layout.Layout`; ``dag.branches`` names groups of workers that a
part of the DAG runs on. Problems are appended to ``issues`` (see ``embodied_rl.dag.issues``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embodied_rl.dag.graph import DagSpec
from embodied_rl.dag.issues import DagIssue, is_int, suggest
from embodied_rl.data.layout import Layout

PARALLEL_FIELDS = ("workers", "num_workers", "tp")
BRANCH_FIELDS = ("workers", "num_workers")


def _placement_ranks(
    node_id: str, raw: Mapping[str, Any], everyone: tuple[int, ...], issues: list[DagIssue]
) -> tuple[int, ...] | None:
    """The ranks named by ``workers: [..]`` or ``num_workers: k`` (``None``: a bad value)."""
    workers, count = raw.get("workers"), raw.get("num_workers")
    if workers is not None:
        if isinstance(workers, list | tuple) and workers and all(map(is_int, workers)):
            return tuple(workers)
        issues.append(
            DagIssue(
                node_id,
                f"parallel.workers must be a non-empty list of worker ranks, got {workers!r}",
                "write e.g. parallel: {workers: [0, 1]}",
            )
        )
        return None
    if count is None:
        return everyone
    if not is_int(count) or count < 1:
        issues.append(
            DagIssue(
                node_id,
                f"parallel.num_workers must be an int >= 1, got {count!r}",
                "write e.g. parallel: {num_workers: 2}",
            )
        )
    elif count > len(everyone):
        issues.append(
            DagIssue(
                node_id,
                f"placed on {count} workers but the run has only {len(everyone)} worker(s)",
                f"raise workers.num_workers to at least {count} or place the node on fewer workers",
            )
        )
    else:
        return everyone[:count]
    return None


def parse_layout(node_id: str, raw: Any, num_workers: int, issues: list[DagIssue]) -> Layout:
    """Resolve ``parallel: {workers: [..] | num_workers: k, tp: t}`` into a Layout."""
    everyone = Layout(tuple(range(num_workers)))
    if raw is None:
        return everyone
    if not isinstance(raw, Mapping):
        issues.append(
            DagIssue(node_id, "'parallel' must be a mapping", "write e.g. parallel: {tp: 1}")
        )
        return everyone
    unknown = sorted(map(str, set(raw) - set(PARALLEL_FIELDS)))
    if unknown:
        issues.append(
            DagIssue(
                node_id,
                f"unknown parallel key(s) {unknown}"
                + "".join(suggest(k, PARALLEL_FIELDS) for k in unknown),
                f"use only {list(PARALLEL_FIELDS)}",
            )
        )
    if "workers" in raw and "num_workers" in raw:
        issues.append(
            DagIssue(node_id, "both 'workers' and 'num_workers' given", "keep one of them")
        )
    tp = raw.get("tp", 1)
    if tp is None:
        tp = 1
    if not is_int(tp) or tp < 1:
        issues.append(
            DagIssue(node_id, f"parallel.tp must be an int >= 1, got {tp!r}", "set e.g. tp: 1")
        )
        return everyone
    ranks = _placement_ranks(node_id, raw, everyone.ranks, issues)
    if ranks is None:
        return everyone
    bad = [r for r in ranks if not 0 <= r < num_workers]
    if bad or len(ranks) > num_workers:
        issues.append(
            DagIssue(
                node_id,
                f"placed on workers {list(ranks)} but the run has only {num_workers} worker(s) "
                f"(ranks 0..{num_workers - 1})",
                f"raise workers.num_workers to at least {max(max(ranks) + 1, len(ranks))} "
                "or place the node on fewer workers"
                if min(ranks) >= 0
                else "use worker ranks >= 0",
            )
        )
        return everyone
    try:
        return Layout(ranks, tp)
    except ValueError as err:
        issues.append(DagIssue(node_id, str(err), "change 'parallel' so the sizes fit"))
        return everyone


def parse_branches(raw: Any, num_workers: int, issues: list[DagIssue]) -> dict[str, Layout]:
    """``dag.branches``: branch name -> ``{workers: [..]}`` or ``{num_workers: k}``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        issues.append(
            DagIssue(
                None,
                f"dag.branches must map branch names to their workers, got {str(raw)[:60]!r}",
                "write e.g. branches: {llm: {workers: [0, 1]}, vla: {workers: [2, 3]}}",
            )
        )
        return {}
    branches: dict[str, Layout] = {}
    for name, spec in raw.items():
        name = str(name)
        fields_given = set(spec) if isinstance(spec, Mapping) else set()
        if not fields_given & set(BRANCH_FIELDS) or spec.get("workers") == []:
            issues.append(
                DagIssue(
                    name,
                    "has no workers",
                    "give it workers of its own, e.g. workers: [0, 1] (or num_workers: 2)",
                    kind="branch",
                )
            )
            continue
        found: list[DagIssue] = []
        layout = parse_layout(name, {k: spec[k] for k in spec if k != "tp"}, num_workers, found)
        unknown = sorted(map(str, fields_given - set(BRANCH_FIELDS)))
        if unknown:
            found.append(DagIssue(name, f"unknown key(s) {unknown}", f"use {list(BRANCH_FIELDS)}"))
        issues.extend(DagIssue(i.node, i.problem, i.fix, kind="branch") for i in found)
        if not found:
            branches[name] = layout
    return branches


def branch_layout(
    node_id: str,
    branch: Any,
    own: Layout | None,
    branches: Mapping[str, Layout],
    issues: list[DagIssue],
) -> Layout | None:
    """The node's layout inside its branch: its own ``parallel`` (which must stay within the
    branch's workers) or, without one, all of the branch's workers."""
    if not isinstance(branch, str) or branch not in branches:
        known = ", ".join(sorted(branches)) or "none: dag.branches is empty"
        issues.append(
            DagIssue(
                node_id,
                f"names branch {branch!r}, which dag.branches does not define (known: {known})",
                "define it under dag.branches with its workers, or fix the node's branch",
            )
        )
        return None
    workers = branches[branch].ranks
    if own is None:
        return Layout(workers)
    outside = sorted(set(own.ranks) - set(workers))
    if outside:
        issues.append(
            DagIssue(
                node_id,
                f"is placed on worker(s) {outside} outside its branch {branch!r} (workers "
                f"{list(workers)})",
                "place it on the branch's workers (or drop its 'parallel' to use them all)",
            )
        )
        return None
    return own


def check_branches_used(
    branches: Mapping[str, Layout], raw_nodes: Any, issues: list[DagIssue]
) -> None:
    """A defined branch that no node names is a mistake (a typo in a node's branch)."""
    entries = raw_nodes if isinstance(raw_nodes, list | tuple) else []
    named = {str(n.get("branch")) for n in entries if isinstance(n, Mapping) and "branch" in n}
    for name in sorted(set(branches) - named):
        issues.append(
            DagIssue(
                name,
                "has no nodes",
                "set 'branch: " + name + "' on the nodes it should run, or remove it",
                kind="branch",
            )
        )


def check_resampling(dag: DagSpec, issues: list[DagIssue]) -> None:
    """A resampling node re-runs its ancestors; all their workers must take part in it."""
    for node in dag.nodes:
        if not node.type.resamples:
            continue
        outside = sorted(
            {r for a in dag.ancestors(node.id) for r in dag.by_id[a].layout.ranks}
            - set(node.layout.ranks)
        )
        if outside:
            issues.append(
                DagIssue(
                    node.id,
                    f"re-runs its upstream nodes, which also run on worker(s) {outside} "
                    "where it does not run",
                    "place the node on every worker its upstream nodes use",
                )
            )
