"""The DAG worker: one per device, each its own controller.

It builds its models once, then every step walks its own plan: run the nodes placed on it,
take part in transfers where the data-parallel layout changes. Only small status and metric
records ever leave a worker; batches stay on the workers.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tensordict import TensorDict

from embodied_rl import checkpoint
from embodied_rl.dag.planner import RunNode, Transfer, plan_dag, process_groups
from embodied_rl.data.batch import merge
from embodied_rl.data.databuffer import redistribute
from embodied_rl.devices import device_spec
from embodied_rl.metrics import RunLogger, reduce_records
from embodied_rl.runtime.config import dag_from_config, load_all_plugins, section
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.runtime.models import ModelStore


class NodeFailure(RuntimeError):
    """A node raised: carries the rank, node and step for the driver's message."""


class DAGWorker:
    """One rank of the run. Methods are called by the launcher through Ray."""

    def __init__(self, cfg: dict[str, Any], rank: int, world_size: int, run_dir: str) -> None:
        self.cfg = OmegaConf.create(cfg)
        self.rank, self.world_size = rank, world_size
        self.run_dir = Path(run_dir)
        self.trainer = section(self.cfg, "trainer")
        torch.set_num_threads(section(self.cfg, "workers").torch_threads)
        load_all_plugins(self.cfg)
        self.dag = dag_from_config(self.cfg, world_size)
        plans = plan_dag(self.dag)
        self.plan = plans[rank]
        self.group_rank_sets = process_groups(plans)
        self.device_spec = device_spec(str(self.cfg.device))
        self.device = self.device_spec.torch_device(0)
        self.models = ModelStore(OmegaConf.to_container(self.cfg.models, resolve=True), self.device)
        self.sink = MetricSink()
        self.start_step = 0
        self._round = 0  # dynamic-sampling refill round within the current step
        self._status: dict[str, Any] = {"rank": rank, "step": -1, "node": None, "phase": "created"}
        self._metrics: dict[str, float] = {}

    # ----------------------------------------------------------------------- set-up
    def rendezvous_address(self) -> dict[str, Any]:
        """Address and free port for torch.distributed's TCP store (asked of rank 0)."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return {"address": ray.util.get_node_ip_address(), "port": port}

    def setup(self, address: str, port: int) -> dict[str, Any]:
        """Join the process group, create every sub-group, build nodes, restore a checkpoint."""
        self._status["phase"] = "setup"
        timeout = timedelta(seconds=self.trainer.collective_timeout_s)
        dist.init_process_group(
            self.device_spec.backend,
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        # new_group must be called by every rank for every group, in the same order.
        self.groups = {ranks: dist.new_group(list(ranks)) for ranks in self.group_rank_sets}
        self.node_state: dict[str, dict[str, Any]] = {n.id: {} for n in self.dag.nodes}
        self.contexts = {
            s.node_id: self._context(s) for s in self.plan.steps if isinstance(s, RunNode)
        }
        for node_id, ctx in self.contexts.items():
            setup = self.dag.by_id[node_id].type.setup
            if setup is not None:
                setup(ctx)
        if self.cfg.resume:
            self._restore()
        self.logger = self._make_logger() if self.rank == 0 else None
        self._status["phase"] = "ready"
        return {"rank": self.rank, "start_step": self.start_step}

    def _context(self, step: RunNode) -> NodeContext:
        node = self.dag.by_id[step.node_id]
        return NodeContext(
            cfg=self.cfg,
            node_id=node.id,
            node_config=node.config,
            rank=self.rank,
            world_size=self.world_size,
            layout=node.layout,
            dp_group=self.groups[step.dp_group],
            models=self.models,
            state=self.node_state[node.id],
            step=0,
            metrics=self.sink,
            device=self.device,
            run_dir=self.run_dir,
            seed_fn=self._seed_for,
        )

    def _seed_for(self, tag: str) -> int:
        """Seed of (run seed, step, refill round, rank, tag): reproducible after resume."""
        round_part = f"r{self._round}/" if self._round else ""
        key = f"{self.cfg.seed}/{self._status['step']}/{round_part}{self.rank}/{tag}"
        return zlib.crc32(key.encode())

    def _make_logger(self) -> RunLogger:
        return RunLogger(
            self.run_dir,
            self.trainer.total_steps,
            start_step=self.start_step,
            plot_keys=tuple(self.trainer.plot_keys),
            console=self.trainer.log_to_console,
        )

    # ----------------------------------------------------------------------- the loop
    def run(self) -> dict[str, Any]:
        """Run steps ``start_step .. total_steps-1``; returns a small summary record."""
        total, every = self.trainer.total_steps, self.trainer.checkpoint_every
        for step in range(self.start_step, total):
            started = time.perf_counter()
            self._run_step(step)
            self.sink.log("time/step", time.perf_counter() - started, reduce="max")
            self._publish_metrics(step)
            if every > 0 and ((step + 1) % every == 0 or step + 1 == total):
                self._save(step + 1)
        self._status.update(phase="done", node=None)
        if self.logger is not None:
            self.logger.plot()
            self.logger.close()
        return {"rank": self.rank, "steps_done": total, "final_metrics": dict(self._metrics)}

    def _run_step(self, step: int) -> None:
        """Walk this rank's plan once: node outputs and received transfers stay local."""
        self._round = 0
        self._status["step"] = step
        self._walk(self.plan.steps, step, {}, {})

    def _walk(
        self,
        steps: list[RunNode | Transfer],
        step: int,
        outputs: dict[str, TensorDict],
        received: dict[tuple[str, str], TensorDict],
    ) -> None:
        for item in steps:
            if isinstance(item, Transfer):
                self._set_status(step, "transfer", f"{item.src_node}->{item.dst_node}")
                out = redistribute(
                    outputs.get(item.src_node),
                    item.src,
                    item.dst,
                    self.rank,
                    self.groups[item.ranks],
                    keep_groups=True,
                )
                if out is not None:
                    received[(item.dst_node, item.src_node)] = out
            else:
                batch = self._node_input(item.node_id, outputs, received)
                outputs[item.node_id] = self._run_node(item.node_id, step, batch)

    def _node_input(
        self,
        node_id: str,
        outputs: dict[str, TensorDict],
        received: dict[tuple[str, str], TensorDict],
    ) -> TensorDict | None:
        """The merged outputs of a node's deps, as laid out for this node."""
        deps = [
            received.pop((node_id, d)) if (node_id, d) in received else outputs[d]
            for d in self.dag.by_id[node_id].deps
        ]
        # A shallow copy: the node may add fields without touching its deps' outputs.
        return merge(deps).clone(recurse=False) if deps else None

    def _resample(self, node_id: str, step: int) -> TensorDict | None:
        """Re-run ``node_id``'s upstream part of the plan (a new round of this step)."""
        self._round += 1
        region = self.dag.ancestors(node_id)
        targets = region | {node_id}
        steps = [
            s
            for s in self.plan.steps
            if (isinstance(s, RunNode) and s.node_id in region)
            or (isinstance(s, Transfer) and s.src_node in region and s.dst_node in targets)
        ]
        outputs: dict[str, TensorDict] = {}
        received: dict[tuple[str, str], TensorDict] = {}
        self._walk(steps, step, outputs, received)
        self._set_status(step, "node", node_id)
        return self._node_input(node_id, outputs, received)

    def _run_node(self, node_id: str, step: int, batch: TensorDict | None) -> TensorDict:
        node = self.dag.by_id[node_id]
        self._set_status(step, "node", node_id)
        ctx = self.contexts[node_id]
        ctx.step = step
        if node.type.resamples:
            ctx.resample = lambda: self._resample(node_id, step)
        started = time.perf_counter()
        try:
            out = node.type.fn(ctx, batch)
        except Exception as err:
            raise NodeFailure(
                f"rank {self.rank} failed in node {node_id!r} ({node.type.name}) at step {step}: "
                f"{type(err).__name__}: {err}\n{traceback.format_exc()}"
            ) from err
        self.sink.log(f"time/{node_id}", time.perf_counter() - started, reduce="max")
        return out

    def _publish_metrics(self, step: int) -> None:
        """Gather every rank's metric records on rank 0, which logs the reduced values."""
        records = self.sink.pop()
        gathered: list[Any] = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(records, gathered, dst=0)
        if self.rank == 0:
            self._metrics = reduce_records(gathered)
            self.logger.log(step, self._metrics)
        self._status["completed"] = step + 1

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def _save(self, completed_steps: int) -> None:
        self._status.update(phase="checkpoint", node=None)
        state = {
            "step": completed_steps,
            "models": self.models.state_dict(),
            "nodes": {
                node_id: {k: v.state_dict() for k, v in st.items() if hasattr(v, "state_dict")}
                for node_id, st in self.node_state.items()
            },
            "rng": checkpoint.capture_rng_state(),
        }
        checkpoint.write_rank_shard(self._checkpoint_root(), completed_steps, self.rank, state)
        dist.barrier()
        if self.rank == 0:
            keep = self.trainer.keep_checkpoints
            checkpoint.finalize(
                self._checkpoint_root(), completed_steps, self.world_size, keep_last=keep
            )
        dist.barrier()

    def _restore(self) -> None:
        latest = checkpoint.latest_checkpoint(self._checkpoint_root())
        if latest is None:
            raise FileNotFoundError(
                f"resume=true but {self._checkpoint_root()} holds no complete checkpoint; "
                "run without resume=true to start fresh, or point run_dir at an earlier run"
            )
        state = checkpoint.load_rank_shard(latest, self.rank, world_size=self.world_size)
        # Build every model this rank uses before loading, so frozen copies start from the
        # initial weights rather than from trained ones.
        for name in self.models.specs:
            if any(getattr(self.dag.by_id[n].config, "model", None) == name for n in self.contexts):
                self.models[name]
        self.models.load_state_dict(state["models"])
        for node_id, entries in state["nodes"].items():
            for key, value in entries.items():
                self.node_state[node_id][key].load_state_dict(value)
        checkpoint.restore_rng_state(state["rng"])
        self.start_step = int(state["step"])

    # ---------------------------------------------------------------------- status
    def _set_status(self, step: int, phase: str, node: str | None) -> None:
        """Record where this worker is, in memory and in a small file.

        The file outlives the process, so the driver can name the node a worker died in even
        when the death happened between two status polls.
        """
        self._status.update(step=step, phase=phase, node=node)
        path = self.run_dir / ".status" / f"rank_{self.rank:05d}.json"
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._status))
        os.replace(tmp, path)

    def status(self) -> dict[str, Any]:
        """Small record polled by the driver (progress, and where a dead worker was)."""
        record = dict(self._status)
        if self.rank == 0:
            record["metrics"] = dict(self._metrics)
        return record

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
