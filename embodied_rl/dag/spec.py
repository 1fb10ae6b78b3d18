"""DAG specification: parse the ``dag.nodes`` YAML list and validate it without building models.

Every problem becomes a :class:`DagIssue` that names the node, says what is wrong and how to
fix it. :func:`validate_dag` collects all issues and raises one :class:`DagValidationError`,
so a user fixes a broken DAG in one pass instead of one error per run.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from embodied_rl import keys as K
from embodied_rl.dag.node_type import NodeConfigError, NodeType
from embodied_rl.data.layout import Layout
from embodied_rl.registry import NODE_TYPES

NODE_FIELDS = ("id", "type", "deps", "config", "parallel", "branch", "agent")
PARALLEL_FIELDS = ("workers", "num_workers", "tp")
BRANCH_FIELDS = ("workers", "num_workers")


@dataclass(frozen=True)
class DagIssue:
    """One validation problem: ``node`` is ``None`` for problems of the whole DAG; ``kind``
    says what ``node`` names (a ``node`` or a ``branch``)."""

    node: str | None
    problem: str
    fix: str
    kind: str = "node"

    def __str__(self) -> str:
        where = f"{self.kind} {self.node!r}: " if self.node is not None else "dag: "
        return f"{where}{self.problem}. Fix: {self.fix}"


class DagValidationError(ValueError):
    """The DAG cannot run; ``issues`` lists every problem found."""

    def __init__(self, issues: Sequence[DagIssue]) -> None:
        self.issues = list(issues)
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"invalid DAG ({len(self.issues)} problem(s)):\n{lines}")


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


def _suggest(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _placement_ranks(
    node_id: str, raw: Mapping[str, Any], everyone: tuple[int, ...], issues: list[DagIssue]
) -> tuple[int, ...] | None:
    """The ranks named by ``workers: [..]`` or ``num_workers: k`` (``None``: a bad value)."""
    workers, count = raw.get("workers"), raw.get("num_workers")
    if workers is not None:
        if isinstance(workers, list | tuple) and workers and all(map(_is_int, workers)):
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
    if not _is_int(count) or count < 1:
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


def _parse_layout(node_id: str, raw: Any, num_workers: int, issues: list[DagIssue]) -> Layout:
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
                + "".join(_suggest(k, PARALLEL_FIELDS) for k in unknown),
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
    if not _is_int(tp) or tp < 1:
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
        layout = _parse_layout(name, {k: spec[k] for k in spec if k != "tp"}, num_workers, found)
        unknown = sorted(map(str, fields_given - set(BRANCH_FIELDS)))
        if unknown:
            found.append(DagIssue(name, f"unknown key(s) {unknown}", f"use {list(BRANCH_FIELDS)}"))
        issues.extend(DagIssue(i.node, i.problem, i.fix, kind="branch") for i in found)
        if not found:
            branches[name] = layout
    return branches


def _branch_layout(
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


def _valid_agent_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name.strip()) and K.AGENT_SEPARATOR not in name


def _parse_deps(node_id: str, raw: Any, issues: list[DagIssue]) -> tuple[str, ...]:
    """``deps`` as node ids: a list of ids, one id, or nothing."""
    if raw is None:
        return ()
    listed = [raw] if isinstance(raw, str | int) and not isinstance(raw, bool) else raw
    if isinstance(listed, list | tuple) and all(isinstance(d, str) or _is_int(d) for d in listed):
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
    if isinstance(node_id, str) and node_id.strip() or _is_int(node_id):
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


def _parse_nodes(
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
        unknown = sorted(map(str, set(raw) - set(NODE_FIELDS)))
        if unknown:
            issues.append(
                DagIssue(
                    node_id,
                    f"unknown field(s) {unknown}"
                    + "".join(_suggest(k, NODE_FIELDS) for k in unknown),
                    f"use only {list(NODE_FIELDS)}",
                )
            )
        if node_id in seen:
            issues.append(
                DagIssue(node_id, "duplicate node id", "rename one of the nodes with this id")
            )
            continue
        seen.add(node_id)
        type_name = raw.get("type")
        if type_name is None:
            issues.append(DagIssue(node_id, "has no 'type'", "set type: to a registered type"))
            continue
        if not isinstance(type_name, str) or type_name not in NODE_TYPES:
            shown = type_name if isinstance(type_name, str) else str(type_name)
            issues.append(
                DagIssue(
                    node_id,
                    f"unknown node type {type_name!r}{_suggest(shown, NODE_TYPES.names())}",
                    f"use a registered type: {', '.join(NODE_TYPES.names())}",
                )
            )
            continue
        node_type: NodeType = NODE_TYPES.get(type_name)
        try:
            config = node_type.build_config(raw.get("config"))
        except NodeConfigError as err:
            issues.append(DagIssue(node_id, err.problem, err.fix))
            continue
        deps = _parse_deps(node_id, raw.get("deps"), issues)
        layout = _parse_layout(node_id, raw.get("parallel"), num_workers, issues)
        branch = raw.get("branch")
        if branch is not None:
            own = layout if raw.get("parallel") is not None else None
            layout = _branch_layout(node_id, branch, own, branches, issues)
            if layout is None:
                continue
        agent = raw.get("agent")
        if agent is not None and not _valid_agent_name(agent):
            issues.append(
                DagIssue(
                    node_id,
                    f"agent must be a name without {K.AGENT_SEPARATOR!r}, got {agent!r}",
                    "write e.g. agent: tens",
                )
            )
            continue
        nodes.append(NodeSpec(node_id, node_type, deps, config, layout, branch=branch, agent=agent))
    return nodes, seen


def _check_deps(nodes: list[NodeSpec], named: set[str], issues: list[DagIssue]) -> list[NodeSpec]:
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
                        f"unknown dependency {dep!r}{_suggest(dep, every_id)}",
                        f"use one of the node ids: {', '.join(every_id)}",
                    )
                )
        node.deps = tuple(d for d in node.deps if d in ids and d != node.id)
    return nodes


def _topological_order(nodes: list[NodeSpec], issues: list[DagIssue]) -> list[NodeSpec] | None:
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


def _check_reachable(order: list[NodeSpec], issues: list[DagIssue]) -> None:
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


def _check_batches_and_keys(order: list[NodeSpec], issues: list[DagIssue]) -> None:
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
            _check_agent_inputs(node, upstream, writers, issues)
        _check_agent_writers(node, writers, issues)
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


def _check_agent_inputs(
    node: NodeSpec,
    upstream: set[str],
    writers: Mapping[str, list[NodeSpec]],
    issues: list[DagIssue],
) -> None:
    """An agent's node must not be handed per-agent fields that belong to no agent: it would
    not know whose they are (it reads its own under ``<agent>/``)."""
    stray = sorted(upstream & K.AGENT_FIELDS)
    if stray:
        sources = sorted({n.id for k in stray for n in writers.get(k, [])})
        issues.append(
            DagIssue(
                node.id,
                f"(agent {node.agent!r}) is handed the per-agent field(s) {stray} that belong "
                f"to no agent (written by {sources})",
                f"give {sources[0]!r} (and any other node writing them) the agent they "
                "belong to (agent: <name>)",
            )
        )


def _check_agent_writers(
    node: NodeSpec, writers: Mapping[str, list[NodeSpec]], issues: list[DagIssue]
) -> None:
    """Two agents writing one key (e.g. both starting GRPO groups), or an agent that acts
    twice (two rollouts of one agent), would overwrite each other's outputs silently."""
    if node.agent is None:
        return
    for key in node.writes:
        others = [n for n in writers.get(key, []) if n.agent is not None]
        other_agent = next((n for n in others if n.agent != node.agent), None)
        if other_agent is not None:
            issues.append(
                DagIssue(
                    node.id,
                    f"(agent {node.agent!r}) writes {key!r}, which agent {other_agent.agent!r} "
                    f"already writes (node {other_agent.id!r})",
                    "let one agent write it: a later agent continues the earlier agents' "
                    "samples (type rollout.llm_agent writes no group or sample ids)",
                )
            )
        elif others and key == K.agent_key(node.agent, K.RESPONSE_IDS):
            issues.append(
                DagIssue(
                    node.id,
                    f"acts a second time for agent {node.agent!r} (node {others[0].id!r} "
                    "already writes its responses)",
                    "give each agent one rollout node; a new agent needs a name of its own",
                )
            )


def _global_batch(node: NodeSpec, order: list[NodeSpec], issues: list[DagIssue]) -> int | None:
    """Samples per step entering ``node`` times its batch factor."""
    if node.type.source:
        size = getattr(node.config, "batch_size", None)
        return None if size is None else int(size) * node.type.factor(node.config)
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


def validate_dag(raw_nodes: Any, num_workers: int, raw_branches: Any = None) -> DagSpec:
    """Validate the raw ``dag.nodes`` list (plain Python data) for ``num_workers`` workers,
    with the optional ``dag.branches`` (branch name -> its workers).

    Raises:
        DagValidationError: listing every problem, each naming the node and the fix.
    """
    issues: list[DagIssue] = []
    if not _is_int(num_workers) or num_workers < 1:
        raise DagValidationError(
            [DagIssue(None, f"{num_workers!r} workers", "set workers.num_workers >= 1")]
        )
    branches = parse_branches(raw_branches, num_workers, issues)
    parsed, named = _parse_nodes(raw_nodes, num_workers, issues, branches)
    _check_branches_used(branches, raw_nodes, issues)
    nodes = _check_deps(parsed, named, issues)
    order = _topological_order(nodes, issues) if nodes else None
    # With an invalid entry left out, feeds and batch keys would report its absence again.
    if order is not None and len(nodes) == len(named):
        _check_reachable(order, issues)
        _check_batches_and_keys(order, issues)
    if issues:
        raise DagValidationError(issues)
    dag = DagSpec(order, num_workers, {name: b.ranks for name, b in branches.items()})
    _check_resampling(dag, issues)
    if issues:
        raise DagValidationError(issues)
    return dag


def _check_branches_used(
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


def _check_resampling(dag: DagSpec, issues: list[DagIssue]) -> None:
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
