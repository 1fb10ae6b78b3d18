"""Walks one DAG's plan on one rank: the training DAG, and optionally an evaluation DAG.

Node outputs and received transfers stay on the worker for the duration of one walk; a node's
input is the merge of its dependencies' outputs as laid out for it.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from tensordict import TensorDict

from embodied_rl.dag.planner import RunNode, Transfer, WorkerPlan
from embodied_rl.dag.spec import DagSpec
from embodied_rl.data.batch import agent_view, from_agent_view, merge
from embodied_rl.data.databuffer import redistribute
from embodied_rl.data.transport import TransferStats
from embodied_rl.runtime.context import MetricSink, NodeContext, RunStopped, raise_if_stopping

Outputs = dict[str, TensorDict]
Received = dict[tuple[str, str], TensorDict]


class NodeFailure(RuntimeError):
    """A node raised: carries the rank, node and step for the driver's message."""


class PlanExecutor:
    """One DAG on one rank: its contexts, its node state, and the walk over its plan.

    Attributes:
        name: ``train`` or ``eval``; also used in seeds and status records.
        round: dynamic-sampling refill round within the current walk (0 = first pass).
    """

    def __init__(
        self,
        name: str,
        dag: DagSpec,
        plan: WorkerPlan,
        make_context: Callable[[str, DagSpec, RunNode, dict[str, Any]], NodeContext],
        groups: dict[tuple[int, ...], Any],
        rank: int,
        set_status: Callable[[int, str, str | None], None],
        sink: MetricSink,
    ) -> None:
        self.name, self.dag, self.plan, self.rank = name, dag, plan, rank
        self.groups, self.set_status, self.sink = groups, set_status, sink
        self.round = 0
        self.node_state: dict[str, dict[str, Any]] = {n.id: {} for n in dag.nodes}
        self.contexts = {
            s.node_id: make_context(name, dag, s, self.node_state[s.node_id])
            for s in plan.steps
            if isinstance(s, RunNode)
        }

    def setup_nodes(self) -> None:
        """Run each node type's one-time setup (build loaders, simulators, ...)."""
        for node_id, ctx in self.contexts.items():
            setup = self.dag.by_id[node_id].type.setup
            if setup is not None:
                setup(ctx)

    def run(self, step: int) -> None:
        """One walk over the whole plan."""
        self.round = 0
        self.walk(self.plan.steps, step, {}, {})

    def walk(
        self, steps: list[RunNode | Transfer], step: int, outputs: Outputs, received: Received
    ) -> None:
        for item in steps:
            if isinstance(item, Transfer):
                self.set_status(step, "transfer", f"{item.src_node}->{item.dst_node}")
                stats = TransferStats()
                out = redistribute(
                    outputs.get(item.src_node),
                    item.src,
                    item.dst,
                    self.rank,
                    self.groups[item.ranks],
                    keep_groups=True,
                    stats=stats,
                )
                self.log_transfer(item, stats)
                if out is not None:
                    received[(item.dst_node, item.src_node)] = out
            else:
                batch = self.node_input(item.node_id, outputs, received)
                outputs[item.node_id] = self.run_node(item.node_id, step, batch)

    def log_transfer(self, transfer: Transfer, stats: TransferStats) -> None:
        """Bytes moved by the databuffer, by path, summed over ranks; the slowest rank's time.

        ``databuffer/bytes_shm`` went through shared memory (ranks on one node),
        ``databuffer/bytes_network`` through the collective (between nodes), and
        ``databuffer/bytes_local`` stayed on the rank that produced it.
        """
        prefix = "databuffer/" if self.name == "train" else f"databuffer/{self.name}/"
        self.sink.log(f"{prefix}bytes_shm", stats.bytes_shm, reduce="sum")
        self.sink.log(f"{prefix}bytes_network", stats.bytes_network, reduce="sum")
        self.sink.log(f"{prefix}bytes_local", stats.bytes_local, reduce="sum")
        seconds = stats.metadata_seconds + stats.payload_seconds
        time_prefix = "time/" if self.name == "train" else f"time/{self.name}/"
        name = f"{time_prefix}transfer/{transfer.src_node}->{transfer.dst_node}"
        self.sink.log(name, seconds, reduce="max")

    def node_input(self, node_id: str, outputs: Outputs, received: Received) -> TensorDict | None:
        """The merged outputs of a node's deps, as laid out for this node."""
        deps = [
            received.pop((node_id, d)) if (node_id, d) in received else outputs[d]
            for d in self.dag.by_id[node_id].deps
        ]
        # A shallow copy: the node may add fields without touching its deps' outputs.
        return merge(deps).clone(recurse=False) if deps else None

    def resample(self, node_id: str, step: int) -> TensorDict | None:
        """Re-run ``node_id``'s upstream part of the plan (a new round of this step)."""
        self.round += 1
        region = self.dag.ancestors(node_id)
        targets = region | {node_id}
        steps = [
            s
            for s in self.plan.steps
            if (isinstance(s, RunNode) and s.node_id in region)
            or (isinstance(s, Transfer) and s.src_node in region and s.dst_node in targets)
        ]
        outputs: Outputs = {}
        received: Received = {}
        self.walk(steps, step, outputs, received)
        self.set_status(step, "node", node_id)
        return self.node_input(node_id, outputs, received)

    def run_node(self, node_id: str, step: int, batch: TensorDict | None) -> TensorDict:
        node = self.dag.by_id[node_id]
        self.set_status(step, "node", node_id)
        ctx = self.contexts[node_id]
        ctx.step = step
        if node.type.resamples:
            ctx.resample = lambda: self.resample(node_id, step)
        raise_if_stopping(ctx.shared, f"step {step} before node {node_id!r}")
        started = time.perf_counter()
        try:
            if node.agent is None:
                out = node.type.fn(ctx, batch)
            else:  # the node works on plain keys; the batch holds the agent's under its name
                out = from_agent_view(node.type.fn(ctx, agent_view(batch, node.agent)), node.agent)
        except RunStopped:
            raise  # not a failure of the node: the driver is stopping the run
        except Exception as err:
            raise NodeFailure(
                f"rank {self.rank} failed in node {node_id!r} ({node.type.name}) at step {step}: "
                f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            ) from err
        prefix = "time/" if self.name == "train" else f"time/{self.name}/"
        self.sink.log(f"{prefix}{node_id}", time.perf_counter() - started, reduce="max")
        return out

    def state_dict(self) -> dict[str, dict[str, Any]]:
        """Checkpointable node state (entries with a ``state_dict`` method)."""
        return {
            node_id: {k: v.state_dict() for k, v in st.items() if hasattr(v, "state_dict")}
            for node_id, st in self.node_state.items()
        }

    def load_state_dict(self, state: dict[str, dict[str, Any]]) -> None:
        for node_id, entries in state.items():
            for key, value in entries.items():
                self.node_state[node_id][key].load_state_dict(value)

    def blocks_checkpoint(self) -> bool:
        """Whether a node's state asks to hold checkpoints back (a ``blocks_checkpoint()``
        method returning True, e.g. the train nodes during a streak of skipped updates)."""
        return any(
            entry.blocks_checkpoint()
            for st in self.node_state.values()
            for entry in st.values()
            if hasattr(entry, "blocks_checkpoint")
        )

    def close(self) -> None:
        """Close node state that holds outside resources (entries with a ``close`` method)."""
        for st in self.node_state.values():
            for entry in st.values():
                if hasattr(entry, "close"):
                    entry.close()

    def model_names(self) -> set[str]:
        """Models this rank's nodes name in their configs (``model: ...``)."""
        return {getattr(self.dag.by_id[n].config, "model", None) for n in self.contexts} - {None}
