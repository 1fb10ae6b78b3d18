"""A Ray cluster of several nodes on this machine: ``ray start --head`` plus worker nodes.

Each node is a real Ray node (its own raylet, object store and node id), started with the
same ``ray start`` commands a user runs on a real cluster, so a run with
``ray.address=<cluster.address>`` crosses nodes exactly as it would between machines: the
databuffer's transport between nodes (:func:`embodied_rl.data.transport.node_identity`),
placement over nodes, and what happens when a node is lost (:meth:`LocalRayCluster.kill_node`).
The multi-node tests and ``scripts/bench`` use it.

Everything lives under its own temp dir: the cluster's address file never lands in
``/tmp/ray``, where a plain ``ray.init()`` elsewhere on the machine would find and join it.
:meth:`LocalRayCluster.stop` kills every process of the cluster (also after a failure) and
removes the temp dir.

Example::

    with LocalRayCluster(head_cpus=2, worker_cpus=[1, 1]) as cluster:
        launch(compose("grpo_llm", [f"ray.address={cluster.address}"]))
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# Fast failure detection: the GCS marks a node whose raylet stopped answering dead after
# period x threshold (Ray's defaults take about 30 s).
_FAST_HEALTH_CHECK = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRayCluster:
    """Head node plus worker nodes on 127.0.0.1, each with its own logical CPUs.

    Args:
        head_cpus: Logical CPUs of the head node (0: it runs no workers).
        worker_cpus: Logical CPUs of each worker node, one entry per node.
        start_timeout_s: Limit for each ``ray start``.

    Attributes:
        address: ``127.0.0.1:<port>``, the value for ``ray.address``.
        node_ids: Ray node id of each node, head first.
    """

    def __init__(
        self, head_cpus: float = 1, worker_cpus: list[float] | None = None, start_timeout_s=90.0
    ) -> None:
        self.head_cpus = head_cpus
        self.worker_cpus = list(worker_cpus if worker_cpus is not None else [1, 1])
        self.start_timeout_s = start_timeout_s
        # Short: Ray's socket paths under it must stay below the 107-byte limit of AF_UNIX.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="erlrc", dir="/tmp"))
        self.address = ""
        self.node_ids: list[str] = []
        self._raylets: dict[str, int] = {}  # node id -> raylet pid

    # ---------------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalRayCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        """Start the head, then each worker node; returns the address."""
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        self._ray_start(
            "--head",
            f"--port={port}",
            f"--num-cpus={self.head_cpus}",
            f"--temp-dir={self.temp_dir}",
            f"--ray-client-server-port={_free_port()}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--system-config={json.dumps(_FAST_HEALTH_CHECK)}",
        )
        for cpus in self.worker_cpus:
            self._ray_start(f"--address={self.address}", f"--num-cpus={cpus}")
        return self.address

    def _ray_start(self, *args: str) -> None:
        """One ``ray start``; records the node id and raylet pid of the node it added."""
        before = set(self._raylets)
        command = [_ray_cli(), "start", "--node-ip-address=127.0.0.1", *args]
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=self.start_timeout_s, env=env
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self._raylets = self._find_raylets()
            added = [node for node in self._raylets if node not in before]
            if added:
                self.node_ids.append(added[0])
                return
            time.sleep(0.1)
        raise RuntimeError(f"`ray start {' '.join(args)}` started no raylet under {self.temp_dir}")

    def _find_raylets(self) -> dict[str, int]:
        """Node id -> pid of every live raylet of this cluster (from their command lines)."""
        found = {}
        for proc in self._processes():
            args = proc.info["cmdline"] or []
            if proc.info["name"] == "raylet":
                for arg in args:
                    if arg.startswith("--node_id="):
                        found[arg.split("=", 1)[1]] = proc.pid
        return found

    def _processes(self) -> list[psutil.Process]:
        """Processes whose command line names this cluster's temp dir (not its workers)."""
        marker = str(self.temp_dir)
        out = []
        for proc in psutil.process_iter(["cmdline", "name"]):
            try:
                if any(marker in arg for arg in proc.info["cmdline"] or []):
                    out.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out

    # ---------------------------------------------------------------------- failures
    def kill_node(self, node_id: str) -> list[int]:
        """SIGKILL one node's raylet and the worker processes it started; returns the pids.

        What a machine crash looks like to the rest of the cluster: the GCS marks the node
        dead within a few seconds and every actor on it dies.
        """
        if node_id == self.node_ids[0]:
            raise ValueError("kill a worker node, not the head: the head holds the GCS")
        raylet = psutil.Process(self._raylets[node_id])
        victims = [raylet, *raylet.children(recursive=True)]
        for proc in victims:
            _kill(proc)
        return [proc.pid for proc in victims]

    def stop(self) -> None:
        """Disconnect this process from the cluster, kill every process of the cluster
        (workers included) and remove its temp dir."""
        self._disconnect()
        procs = self._processes()
        victims = {p.pid: p for p in procs}
        for proc in procs:
            try:
                victims.update({c.pid: c for c in proc.children(recursive=True)})
            except psutil.NoSuchProcess:
                continue
        for proc in victims.values():
            _kill(proc, signal.SIGTERM)
        _, alive = psutil.wait_procs(list(victims.values()), timeout=5)
        for proc in alive:
            _kill(proc)
        psutil.wait_procs(alive, timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _disconnect(self) -> None:
        """``ray.shutdown()`` if this process is connected to this cluster: a later
        ``ray.init`` in the process must not find a connection to a cluster that is gone."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized() or not self.address:
            return
        if ray.get_runtime_context().gcs_address.endswith(":" + self.address.split(":")[1]):
            ray.shutdown()


def _kill(proc: psutil.Process, sig: int = signal.SIGKILL) -> None:
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


def _ray_cli() -> str:
    """The ``ray`` command of this interpreter's environment."""
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else "ray"
