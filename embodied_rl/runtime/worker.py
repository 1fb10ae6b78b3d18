"""The DAG worker: one per device, each its own controller.

It builds its models once, then every step walks its own plan of the training DAG (and every
``eval.every`` steps the plan of the evaluation DAG): run the nodes placed on it, take part
in transfers where the data-parallel layout changes. Only small status and metric records
ever leave a worker; batches stay on the workers.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.dag.planner import RunNode, plan_dag, process_groups
from embodied_rl.dag.spec import DagSpec
from embodied_rl.devices import device_spec
from embodied_rl.metrics import RunLogger, reduce_records
from embodied_rl.rng_state import capture_rng_state, restore_rng_state
from embodied_rl.runtime.config import dag_from_config, load_all_plugins, section
from embodied_rl.runtime.context import (
    STOP_REQUESTED,
    MetricSink,
    NodeContext,
    StopFlag,
    node_metrics,
)
from embodied_rl.runtime.executor import NodeFailure, PlanExecutor
from embodied_rl.runtime.memory import memory_mb
from embodied_rl.runtime.models import ModelStore, model_uses

logger = logging.getLogger(__name__)

__all__ = ["DAGWorker", "NodeFailure", "status_path"]


def status_path(run_dir: str | Path, rank: int) -> Path:
    """The small JSON file in which worker ``rank`` records where it is (see ``status``)."""
    return Path(run_dir) / ".status" / f"rank_{rank:05d}.json"


class DAGWorker:
    """One rank of the run. Methods are called by the launcher through Ray.

    ``mode`` is ``train`` (steps of the training DAG, periodic evaluation) or ``eval`` (one
    walk of the evaluation DAG on the newest checkpoint, for ``embodied-rl eval``).
    """

    def __init__(
        self,
        cfg: dict[str, Any],
        rank: int,
        world_size: int,
        run_dir: str,
        mode: str = "train",
        checkpoints: str | None = None,
    ) -> None:
        self.cfg = OmegaConf.create(cfg)
        self.rank, self.world_size, self.mode = rank, world_size, mode
        self.run_dir = Path(run_dir)  # where this worker writes (an eval: its own folder)
        # where checkpoints are read and written (an eval reads the trained run's)
        self.checkpoints = Path(checkpoints) if checkpoints else self.run_dir / "checkpoints"
        self.trainer = section(self.cfg, "trainer")
        self.eval_cfg = section(self.cfg, "eval")
        torch.set_num_threads(section(self.cfg, "workers").torch_threads)
        load_all_plugins(self.cfg)
        self.dags = {"train": dag_from_config(self.cfg, world_size)}
        if "eval_dag" in self.cfg and self.cfg.eval_dag:
            self.dags["eval"] = dag_from_config(self.cfg, world_size, key="eval_dag")
        self.plans = {name: plan_dag(dag) for name, dag in self.dags.items()}
        self.group_rank_sets = sorted(
            {g for plans in self.plans.values() for g in process_groups(plans)},
            key=lambda ranks: (len(ranks), ranks),
        )
        self.device_spec = device_spec(str(self.cfg.device))
        self.device = self.device_spec.torch_device(0)
        self.models = ModelStore(OmegaConf.to_container(self.cfg.models, resolve=True), self.device)
        # What nodes of different DAGs share on this worker (a simulator both the training and
        # the evaluation rollout use), closed with the executors.
        self.shared: dict[str, Any] = {}
        self._stop = StopFlag()  # close() (driver thread) stops a running walk with it
        self._preempt = threading.Event()  # preempt() (driver thread): stop after this step
        self.shared[STOP_REQUESTED] = self._stop
        self.sink = MetricSink()
        self.start_step = 0
        self._elapsed_before = 0.0  # training wall seconds of earlier attempts (resume)
        self._run_started = time.perf_counter()
        self._active: PlanExecutor | None = None
        self._status: dict[str, Any] = {
            "rank": rank,
            "pid": os.getpid(),  # lets an operator (or a test) find and kill this process
            "host": socket.gethostname(),
            "step": -1,
            "node": None,
            "phase": "created",
        }
        self._metrics: dict[str, float] = {}
        self._set_status(-1, "created", None)  # replaces the file of an earlier attempt

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
        self._set_status(-1, "setup", None)
        dist.init_process_group(
            self.device_spec.backend,
            init_method=f"tcp://{address}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=self.trainer.collective_timeout_s),
        )
        # new_group must be called by every rank for every group, in the same order.
        self.groups = {ranks: dist.new_group(list(ranks)) for ranks in self.group_rank_sets}
        # FSDP models are sharded over the dp group of the nodes that use them.
        self.models.set_uses(model_uses(list(self.dags.values())), self.groups)
        self.executors = {
            name: PlanExecutor(
                name, dag, self.plans[name][self.rank], self._context, self.groups,
                self.rank, self._set_status, self.sink,
            )
            for name, dag in self.dags.items()
        }  # fmt: skip
        needed = {"train"} if self.mode == "train" else {"eval"}
        if self.mode == "train" and (
            self.eval_cfg.every > 0 or self.eval_cfg.at_end or self.eval_cfg.at_start
        ):
            needed.add("eval")
        for name in needed & set(self.executors):
            self.executors[name].setup_nodes()
        if self.cfg.resume or self.mode == "eval":
            self._restore()
        self.logger = self._make_logger() if self.rank == 0 else None
        self._set_status(-1, "ready", None)
        return {"rank": self.rank, "start_step": self.start_step}

    def _context(
        self, name: str, dag: DagSpec, step: RunNode, state: dict[str, Any]
    ) -> NodeContext:
        node = dag.by_id[step.node_id]
        return NodeContext(
            cfg=self.cfg,
            node_id=node.id,
            node_config=node.config,
            rank=self.rank,
            world_size=self.world_size,
            layout=node.layout,
            dp_group=self.groups[step.dp_group],
            models=self.models,
            state=state,
            shared=self.shared,
            step=0,
            metrics=node_metrics(self.sink, node.branch, node.agent, name, (self.eval_cfg.name,)),
            device=self.device,
            run_dir=self.run_dir,
            seed_fn=self._seed_for,
        )

    def _seed_for(self, tag: str) -> int:
        """Seed of (run seed, DAG, step, refill round, rank, tag): reproducible after resume."""
        active = self._active
        dag_part = "" if active is None or active.name == "train" else f"{active.name}/"
        round_part = f"r{active.round}/" if active is not None and active.round else ""
        key = f"{self.cfg.seed}/{dag_part}{self._status['step']}/{round_part}{self.rank}/{tag}"
        return zlib.crc32(key.encode())

    def _make_logger(self) -> RunLogger:
        total = self.trainer.total_steps if self.mode == "train" else self.start_step + 1
        return RunLogger(
            self.run_dir,  # an eval's run_dir is its own folder (launch/launcher.py)
            total,
            start_step=self.start_step,
            tensorboard="tensorboard" in self.trainer.loggers,
            plot_keys=tuple(self.trainer.plot_keys),
            console=self.trainer.log_to_console,
        )

    # ----------------------------------------------------------------------- the loop
    def run(self) -> dict[str, Any]:
        """Train ``start_step .. total_steps-1`` (or evaluate once); returns a small record.

        With ``trainer.time_limit_min`` the run ends early after the step during which the
        limit passed (the same step on every rank), with its final evaluation and checkpoint.
        After :meth:`preempt` (SIGTERM to the driver) it ends after the step in progress, all
        of it, evaluation included, with a checkpoint of that step: the point where a resumed
        run continues exactly as an uninterrupted one (``runtime/preemption.py`` says why).
        """
        if self.mode == "eval":
            self._walk("eval", self.start_step)
            self._publish_metrics(self.start_step)
            return self._finish(self.start_step)
        total, every = self.trainer.total_steps, self.trainer.checkpoint_every
        self._run_started = time.perf_counter()
        completed, preempted = self.start_step, False
        if self.eval_cfg.at_start and self.start_step == 0 and "eval" in self.executors:
            self._walk("eval", 0)  # logged with step 0's metrics (eval.every != 1)
        for step in range(self.start_step, total):
            started = time.perf_counter()
            self._walk("train", step)
            completed = step + 1
            last = completed == total or self._time_is_up()
            if self._eval_due(completed, last):
                self._walk("eval", completed)
            self.sink.log("time/step", time.perf_counter() - started, reduce="max")
            self.sink.log("time/elapsed_s", self._elapsed_s(), reduce="max")
            self._log_memory()
            self._publish_metrics(step)
            preempted = not last and self._preempt_agreed()
            if every > 0 and (completed % every == 0 or last or preempted):
                self._save_unless_unhealthy(completed)
            if last or preempted:
                break
        return self._finish(completed, preempted)

    def preempt(self) -> None:
        """Asked by the driver after SIGTERM (another thread than ``run``): end the run after
        the step in progress, with a checkpoint of it."""
        self._preempt.set()

    def _preempt_agreed(self) -> bool:
        """Whether any rank was asked to :meth:`preempt` (all ranks stop after one step)."""
        return self._any_rank(self._preempt.is_set())

    def _any_rank(self, condition: bool) -> bool:
        """Whether ``condition`` holds on any rank: every rank gets the same answer.

        The flag lives on the worker's device: NCCL (cuda) and HCCL (npu) process groups
        have no CPU backend, so a CPU tensor would fail there ("No backend type associated
        with device type cpu"), as it did on the first H200 run.
        """
        flag = torch.tensor([float(condition)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def _elapsed_s(self) -> float:
        """Wall seconds of training so far, earlier attempts of a resumed run included."""
        return self._elapsed_before + time.perf_counter() - self._run_started

    def _time_is_up(self) -> bool:
        """Whether ``trainer.time_limit_min`` has passed on any rank (all ranks agree)."""
        limit = self.trainer.time_limit_min
        if limit is None:
            return False
        return self._any_rank(self._elapsed_s() >= 60.0 * limit)

    def _save_unless_unhealthy(self, completed_steps: int) -> None:
        """Checkpoint, except while a node is in a streak of skipped (non-finite) updates.

        Such a checkpoint would push the last good one out of ``keep_checkpoints``. Every rank
        must take the same decision (saving has barriers), so the flags are all-reduced.
        """
        if self._any_rank(any(ex.blocks_checkpoint() for ex in self.executors.values())):
            if self.rank == 0:
                logger.warning(
                    "step %d: no checkpoint while updates are being skipped (non-finite loss "
                    "or gradients); the last good checkpoint is kept",
                    completed_steps,
                )
            return
        self._save(completed_steps)

    def _eval_due(self, completed: int, last: bool) -> bool:
        if "eval" not in self.executors:
            return False
        periodic = self.eval_cfg.every > 0 and completed % self.eval_cfg.every == 0
        return periodic or (self.eval_cfg.at_end and last)

    def _walk(self, name: str, step: int) -> None:
        if name not in self.executors:
            raise ValueError(f"no {name} DAG configured; add '{name}_dag' to the config")
        self._active = self.executors[name]
        self._status["step"] = step
        try:
            self._active.run(step)
        finally:
            self._active = None

    def _log_memory(self) -> None:
        """RSS of this worker and of its simulator processes (the largest over workers)."""
        worker_mb, children_mb = memory_mb()
        self.sink.log("memory/worker_rss_mb", worker_mb, reduce="max")
        self.sink.log("memory/simulator_rss_mb", children_mb, reduce="max")

    def _finish(self, steps_done: int, preempted: bool = False) -> dict[str, Any]:
        # In the file too: the status file must not say a node runs once the run ended.
        self._set_status(steps_done, "preempted" if preempted else "done", None)
        if self.logger is not None:
            self.logger.plot()
            self.logger.close()
        return {
            "rank": self.rank,
            "steps_done": steps_done,
            "preempted": preempted,
            "final_metrics": dict(self._metrics),
        }

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
        return self.checkpoints

    def _save(self, completed_steps: int) -> None:
        self._set_status(completed_steps, "checkpoint", None)
        state = {
            "step": completed_steps,
            "elapsed_s": self._elapsed_s(),
            "models": self.models.state_dict(),
            "nodes": {name: ex.state_dict() for name, ex in self.executors.items()},
            "rng": capture_rng_state(),
        }
        root = self._checkpoint_root()
        try:
            checkpoint.write_rank_shard(root, completed_steps, self.rank, state)
        except OSError as err:  # a full disk: one message, not the writer's traceback
            raise checkpoint.write_failure(root, completed_steps, err) from None
        dist.barrier()
        if self.rank == 0:
            keep = self.trainer.keep_checkpoints
            try:
                checkpoint.finalize(root, completed_steps, self.world_size, keep_last=keep)
            except OSError as err:
                raise checkpoint.write_failure(root, completed_steps, err) from None
        dist.barrier()

    def _restore(self) -> None:
        latest = checkpoint.latest_checkpoint(self._checkpoint_root())
        if latest is None:  # the driver checked; here every checkpoint failed its checksums
            raise FileNotFoundError(
                f"{self._checkpoint_root()} holds no complete checkpoint to resume or evaluate; "
                "point run_dir at a run with an intact checkpoint"
            )
        state = checkpoint.load_rank_shard(latest, self.rank, world_size=self.world_size)
        # Build every model this rank uses before loading, so frozen copies start from the
        # initial weights rather than from trained ones.
        for name in set().union(*(ex.model_names() for ex in self.executors.values())):
            if name in self.models.specs:
                self.models[name]
        self.models.load_state_dict(state["models"])
        # Node state (loader positions) continues a training run; `embodied-rl eval` starts its
        # split from the beginning, so it gives the same episodes whatever the run evaluated
        # before, and may evaluate another split or init-state count than the run did.
        if self.mode == "train":
            for name, nodes in state["nodes"].items():
                if name in self.executors:
                    self.executors[name].load_state_dict(nodes)
        restore_rng_state(state["rng"])
        self.start_step = int(state["step"])
        self._elapsed_before = float(state.get("elapsed_s", 0.0))

    # ---------------------------------------------------------------------- status
    def _set_status(self, step: int, phase: str, node: str | None) -> None:
        """Record where this worker is, in memory and in a small file.

        The file outlives the process, so the driver can name the node a worker died in even
        when the death happened between two status polls.
        """
        dag = None if self._active is None else self._active.name  # train or eval
        self._status.update(step=step, phase=phase, node=node, dag=dag)
        path = status_path(self.run_dir, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._status))
        os.replace(tmp, path)

    def status(self) -> dict[str, Any]:
        """Small record polled by the driver (progress, and where a dead worker was)."""
        record = dict(self._status)
        if self.rank == 0:
            record["metrics"] = dict(self._metrics)
        return record

    def close(self, step_timeout_s: float = 20.0) -> None:
        """Release what nodes hold outside this process (simulator processes, shared memory).

        Called by the driver while ``run`` may still be walking (the actor runs two calls at
        once). The stop flag ends the walk at its next node or env step (``RunStopped``: the
        cut-short step logs, reports and saves nothing), and the simulators are closed
        between two env steps, never under one (a step that has not ended after
        ``step_timeout_s`` is closed under anyway; the worker is killed next).
        """
        with self._stop.request(step_timeout_s) as between_steps:
            if not between_steps:
                logger.warning(
                    "rank %d: an env step did not end within %.0f s; closing anyway",
                    self.rank,
                    step_timeout_s,
                )
            for executor in self.executors.values():
                executor.close()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
