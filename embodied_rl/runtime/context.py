"""What a node function sees: its config, its place in the layout, models, metrics, state."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from embodied_rl.data.layout import Layout

# Key of ``NodeContext.shared`` holding the worker's :class:`StopFlag`.
STOP_REQUESTED = "stop_requested"


class RunStopped(RuntimeError):
    """The run is stopping: the walk ends at the next node or env step and writes nothing
    more (no metrics, report or checkpoint from a step cut short)."""


class StopFlag:
    """Set when the driver stops the run (Ctrl-C, another rank failed) while a walk runs.

    The driver's ``close()`` runs in another thread of the worker than the walk. Rollouts
    step their simulators inside :meth:`simulating`, so :meth:`request` (set the flag, then
    take the lock) returns only between two env steps, and the simulators can be closed
    without an episode running on them; the rollout then stops at its next step. A rank
    blocked in a collective (waiting for a peer that already stopped) holds no lock and
    delays nothing.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()

    def raise_if_set(self, where: str) -> None:
        if self._event.is_set():
            raise RunStopped(f"stopped by the driver during {where}")

    @contextmanager
    def simulating(self, where: str) -> Iterator[None]:
        """Hold the simulators for one env step (or reset); raises once stopping."""
        with self._lock:
            self.raise_if_set(where)
            yield

    @contextmanager
    def request(self, timeout_s: float) -> Iterator[bool]:
        """Set the flag and hold the simulators (``False``: a step did not end in time)."""
        self._event.set()
        acquired = self._lock.acquire(timeout=timeout_s)
        try:
            yield acquired
        finally:
            if acquired:
                self._lock.release()


def raise_if_stopping(shared: dict[str, Any], where: str) -> None:
    """Raise :class:`RunStopped` if the worker owning ``shared`` was asked to stop."""
    flag = shared.get(STOP_REQUESTED)
    if flag is not None:
        flag.raise_if_set(where)


def simulating(shared: dict[str, Any], where: str) -> AbstractContextManager[None]:
    """The worker's :meth:`StopFlag.simulating` (a no-op outside a worker, e.g. in tests)."""
    flag = shared.get(STOP_REQUESTED)
    return nullcontext() if flag is None else flag.simulating(where)


class MetricSink:
    """Collects one worker's scalar metrics for the current step.

    Each metric is reduced across workers at the end of the step: ``mean`` is weighted by
    ``weight`` (e.g. the number of samples that produced it), ``sum`` adds, ``max``/``min``
    take the extreme.
    """

    def __init__(self) -> None:
        self.records: dict[str, tuple[float, float, str]] = {}

    def log(self, name: str, value: float, weight: float = 1.0, reduce: str = "mean") -> None:
        if reduce not in ("mean", "sum", "max", "min"):
            raise ValueError(f"reduce must be mean, sum, max or min, got {reduce!r}")
        value = float(value.item() if isinstance(value, torch.Tensor) else value)
        if name in self.records:
            old_value, old_weight, old_reduce = self.records[name]
            if old_reduce != reduce:
                raise ValueError(
                    f"metric {name!r} logged with reduce {old_reduce!r} and {reduce!r}"
                )
            value, weight = _combine(old_value, old_weight, value, weight, reduce)
        self.records[name] = (value, float(weight), reduce)

    def pop(self) -> dict[str, tuple[float, float, str]]:
        records, self.records = self.records, {}
        return records


class PrefixedMetrics:
    """The view of a worker's :class:`MetricSink` that a node of a DAG branch or of an agent
    logs through: every name gets the prefix (``llm/reward/mean``, ``tens/actor/pg_loss``),
    so two branches or agents that log the same metric names in one job keep them apart."""

    def __init__(self, sink: MetricSink, prefix: str) -> None:
        self.sink, self.prefix = sink, prefix

    def log(self, name: str, value: float, weight: float = 1.0, reduce: str = "mean") -> None:
        self.sink.log(self.prefix + name, value, weight, reduce)


class SideDagMetrics:
    """The view of a worker's sink for the nodes of a DAG other than the training one (the
    evaluation's), which logs into the same step's metrics.

    Under their plain names, an evaluation's metrics would merge into the training step's:
    its greedy episodes into ``rollout/success_rate`` (a weighted mean of both), its loader's
    epoch into ``data/epoch``, its simulation time into ``time/rollout/simulate``. So
    ``time/x`` becomes ``time/<dag>/x`` (beside the executor's ``time/<dag>/<node>``), a name
    under one of ``own`` (the report's ``eval/success_rate``) stays, and any other name gets
    ``<dag>/``: ``eval/rollout/success_rate``.
    """

    def __init__(self, sink: MetricSink | PrefixedMetrics, dag: str, own: tuple[str, ...]):
        self.sink, self.dag = sink, dag
        self.own = tuple(f"{prefix}/" for prefix in {dag, *own})

    def log(self, name: str, value: float, weight: float = 1.0, reduce: str = "mean") -> None:
        if name.startswith("time/"):
            name = f"time/{self.dag}/{name.removeprefix('time/')}"
        elif not name.startswith(self.own):
            name = f"{self.dag}/{name}"
        self.sink.log(name, value, weight, reduce)


def node_metrics(
    sink: MetricSink,
    branch: str | None,
    agent: str | None,
    dag: str = "train",
    own: tuple[str, ...] = (),
) -> MetricSink | PrefixedMetrics | SideDagMetrics:
    """Where a node logs: the worker's sink, under ``<branch>/`` and ``<agent>/`` when the
    node belongs to a branch or an agent (``llm/tens/actor/pg_loss``); a node of another DAG
    than ``train`` through :class:`SideDagMetrics` (``own``: the prefixes it keeps)."""
    prefix = "".join(f"{part}/" for part in (branch, agent) if part is not None)
    metrics = PrefixedMetrics(sink, prefix) if prefix else sink
    return metrics if dag == "train" else SideDagMetrics(metrics, dag, own)


def _combine(a: float, wa: float, b: float, wb: float, reduce: str) -> tuple[float, float]:
    """Merge two logged values of one metric on one worker."""
    if reduce == "mean":
        total = wa + wb
        return ((a * wa + b * wb) / total if total else b), total
    if reduce == "sum":
        return a + b, wa + wb
    return (max(a, b) if reduce == "max" else min(a, b)), wa + wb


@dataclass
class NodeContext:
    """Everything a node function may use besides its input batch.

    Attributes:
        cfg: the whole resolved run config (OmegaConf DictConfig).
        node_id: the DAG node's id.
        node_config: the node's config dataclass instance (``None`` if it takes none).
        rank / world_size: this worker's global rank and the number of workers.
        layout: the node's placement; ``dp_rank``/``dp_size`` follow from it.
        dp_group: process group over the ranks sharing this rank's tp position in the
            layout (gradient all-reduce, global counts); ``None`` when not distributed.
        models: lazily built models by name (``ctx.models["actor"]``).
        state: this node's persistent state on this worker (survives steps; entries with a
            ``state_dict`` method are checkpointed).
        shared: what the nodes of every DAG on this worker share (e.g. the vector env of a
            training and an evaluation rollout with the same simulator settings). An entry
            also held in a node's ``state`` is closed with it; ``close`` must be idempotent.
        step: the current training step (0-based).
        metrics: where the node logs scalars.
        device: the torch device of this worker.
        run_dir: the run directory (shared file system assumed only for rank 0 outputs).
        resample: for node types declared with ``resamples=True``: re-run the node's upstream
            nodes for this step and return a fresh input batch (a collective call: every
            worker of the node must call it the same number of times).
    """

    cfg: Any
    node_id: str
    node_config: Any
    rank: int
    world_size: int
    layout: Layout
    dp_group: dist.ProcessGroup | None
    models: Any
    state: dict[str, Any]
    step: int
    metrics: MetricSink | PrefixedMetrics | SideDagMetrics
    device: torch.device
    run_dir: Path
    shared: dict[str, Any] = field(default_factory=dict)
    seed_fn: Callable[[str], int] = field(default=lambda tag: 0)
    resample: Callable[[], Any] | None = None

    @classmethod
    def single_process(cls, node_id: str, node_config: Any, **fields: Any) -> NodeContext:
        """A context for running one node in this process, outside a DAG worker (tests,
        benchmarks, notebooks): rank 0 of 1, CPU, no process group, fresh state and metrics.
        ``fields`` override any attribute (e.g. ``models=``, ``cfg=``, ``seed_fn=``)."""
        defaults: dict[str, Any] = {
            "cfg": None,
            "rank": 0,
            "world_size": 1,
            "layout": Layout((0,)),
            "dp_group": None,
            "models": {},
            "state": {},
            "step": 0,
            "metrics": MetricSink(),
            "device": torch.device("cpu"),
            "run_dir": Path("."),
        }
        return cls(node_id=node_id, node_config=node_config, **{**defaults, **fields})

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)

    @property
    def dp_size(self) -> int:
        return self.layout.dp_size

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank(self.rank)

    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    def seed(self, tag: str) -> int:
        """A seed unique to (run seed, step, rank, node, tag): reproducible after resume."""
        return self.seed_fn(f"{self.node_id}/{tag}")

    def gather_over_dp(self, obj: Any) -> list[Any]:
        """Every dp rank's ``obj``, in dp-rank order: a collective over the node's data-parallel
        group (``[obj]`` when the node has no dp peers; every member must call it).

        For small picklable per-sample metadata (rewards and group ids, episode records,
        sample ids and token counts); batch payloads move through the databuffer instead.
        """
        if self.dp_group is None or self.dp_size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.dp_size
        dist.all_gather_object(gathered, obj, group=self.dp_group)
        # all_gather_object fills group-rank order (sorted global ranks); a layout's dp order
        # need not be sorted (branches, agents), and callers slice by dp rank.
        dp_ranks = self.layout.dp_group_ranks(self.rank)
        return [gathered[dist.get_group_rank(self.dp_group, r)] for r in dp_ranks]

    def gather_rows_over_dp(self, local: torch.Tensor) -> tuple[torch.Tensor, slice]:
        """Concatenate a small per-sample tensor ``(B, ...)`` over the dp group.

        Returns:
            ``(N, ...)`` the rows of every dp rank in dp-rank order, and the slice of them
            that holds this rank's ``B`` rows.
        """
        parts = self.gather_over_dp(local)
        start = sum(len(part) for part in parts[: self.dp_rank])
        return torch.cat(parts), slice(start, start + len(local))

    def log_share(self, name: str, share: float) -> None:
        """Log this rank's share of a global sum or mean; the shares are summed over the ranks.

        Members of one tp group hold the same rows, so only tp rank 0 logs: each row counts
        once whatever the tp size.
        """
        if self.tp_rank == 0:
            self.metrics.log(name, share, reduce="sum")

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum ``value`` over the node's data-parallel group (identity when alone)."""
        if self.dp_group is not None and self.dp_size > 1:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.dp_group)
        return value
