"""The driver's watch over the workers: wait on one call per rank, poll their status, and
explain a failure by the worker that caused it (rank, node, step, pid and host, a lost node)."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embodied_rl.checkpoint import CheckpointWriteError
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.runtime import cluster

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours a task error's header, even in a log file


def cause_text(err: Exception) -> str:
    """What to show of a worker's error: a :class:`CheckpointWriteError`'s message alone (it
    says all the user needs), anything else as Ray reports it (with the worker's traceback)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, CheckpointWriteError):
        return str(cause)
    return str(err)


class _WorkerError(Exception):
    """Internal: worker ``rank`` raised or died with ``error`` (the monitor turns it into a
    :class:`RunFailed` that names the worker which caused the stop)."""

    def __init__(self, rank: int, error: Exception) -> None:
        super().__init__(rank, error)
        self.rank, self.error = rank, error


class Monitor:
    """Tracks each worker's last reported (step, node) to explain failures."""

    grace_s = 5.0
    node_death_wait_s = 45.0  # Ray's default health checks mark a dead node within ~30 s

    def __init__(
        self, actors: list[Any], records: deque[Any], run_dir: Path, rank_nodes: list[str]
    ) -> None:
        self.run_dir = run_dir
        self.rank_nodes = rank_nodes  # the Ray node id of each rank
        self.actors = actors
        self.records = records
        self.last: dict[int, dict[str, Any]] = {}
        self.rank0_status: dict[str, Any] = {}

    def wait_all(
        self,
        refs: list[Any],
        poll_s: float | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """The results of one call per rank (``refs[rank]``), in rank order.

        Returns as soon as every call is done, and raises :class:`RunFailed` as soon as one
        fails: the peers of a dead worker may wait in a collective until its timeout
        (minutes), so they are not waited for. ``on_tick`` runs every ``poll_s`` seconds.
        """
        import ray

        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        while pending:
            done, _ = ray.wait(list(pending), timeout=poll_s)
            for ref in done:
                rank = pending.pop(ref)
                try:
                    results[rank] = self.result(rank, ref)
                except _WorkerError as failure:
                    raise self.root_cause(failure.rank, failure.error, pending) from None
            if on_tick is not None:
                on_tick()
        return [results[rank] for rank in range(len(refs))]

    def _explain(self, rank: int, err: Exception) -> RunFailed:
        """The error that stops the run: what rank ``rank`` did last, and ``err``."""
        import ray

        where = self._last_known(rank)
        died = isinstance(err, ray.exceptions.RayActorError)
        what = "died (its process exited or was killed)" if died else "failed"
        if where.get("node") is not None:
            place = f"node {where['node']!r} at step {where.get('step')}"
        elif int(where.get("step", -1)) >= 0:
            place = f"{where.get('phase')} at step {where.get('step')}"
        else:
            place = f"{where.get('phase') or 'setup'} (before any node ran)"
        if where.get("pid") is not None:
            place += f" (pid {where['pid']} on host {where.get('host')})"
        note = self._lost_node_note(rank) if died else ""
        return RunFailed(
            f"worker rank {rank} {what} during {place}; the run was stopped.{note} Cause: "
            + _COLOUR.sub("", cause_text(err))
        )

    def _lost_node_note(self, rank: int) -> str:
        """When the rank's Ray node is gone: which node, which ranks died with it, the fix.

        In a run over several nodes the cluster needs a few seconds (its health checks) to mark
        a crashed node dead, so the driver waits for that before it explains the failure.
        """
        node_id = self.rank_nodes[rank] if rank < len(self.rank_nodes) else None
        if node_id is None or len(set(self.rank_nodes)) < 2:
            return ""  # on one node, the driver's own node: nothing to tell apart
        lost = cluster.wait_for_lost(node_id, self.node_death_wait_s)
        if lost is None:
            return ""
        ranks = [r for r, n in enumerate(self.rank_nodes) if n == node_id]
        return (
            f" Ray node {lost.name} was lost with ranks "
            f"{', '.join(map(str, ranks))}. Fix: restart the node (or give the job a cluster "
            "that holds it) and run again with resume=true to continue from the last checkpoint."
        )

    def _last_known(self, rank: int) -> dict[str, Any]:
        """The newest of the polled status and the status file the worker left behind."""
        from embodied_rl.runtime.worker import status_path

        path = status_path(self.run_dir, rank)
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return self.last.get(rank, {})

    def root_cause(self, rank: int, err: Exception, pending: dict[Any, int]) -> RunFailed:
        """When one worker fails, its peers soon fail too (their collectives lose a member).

        Wait briefly for the others and blame a worker that died before one that merely
        raised, so the message names the worker that caused the stop.
        """
        import ray

        failures = {rank: err}
        done = []
        if pending:
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=self.grace_s)
        for ref in done:
            try:
                ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as other:
                failures[pending[ref]] = other
        died = [r for r, e in failures.items() if isinstance(e, ray.exceptions.RayActorError)]
        chosen = (died or [rank])[0]
        return self._explain(chosen, failures[chosen])

    def result(self, rank: int, ref: Any) -> Any:
        """The value of rank ``rank``'s finished call ``ref``, kept in ``records``."""
        import ray

        try:
            value = ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
            raise _WorkerError(rank, err) from None
        self.records.append(value)
        return value

    def poll_status(self) -> None:
        """Ask every worker for its status; the newest of each explains a later failure."""
        import ray

        for rank, actor in enumerate(self.actors):
            try:
                status = ray.get(actor.status.remote(), timeout=10)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                continue  # a dead worker keeps its last known status
            self.records.append(status)
            self.last[rank] = status
            if rank == 0:
                self.rank0_status = status
