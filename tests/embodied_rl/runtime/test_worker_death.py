"""A DAG worker process killed from outside in the middle of a step (a real SIGKILL).

The run must stop within a bounded time with a message naming the dead rank, its node and
its process, and ``resume=true`` must continue from the last complete checkpoint to the
same metrics as an uninterrupted run. A ``fault.inject`` node in ``hang`` mode holds the
victim inside a node, so the kill lands mid-step at a known place; the test finds the
process through the worker's status file, as an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from embodied_rl.checkpoint import latest_checkpoint
from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.memory import memory_mb, worker_process_env
from embodied_rl.runtime.worker import status_path
from tests.embodied_rl.runtime.run_helpers import read_metrics, with_hang_before_train

pytestmark = pytest.mark.ray

TOTAL_STEPS = 4
KILL_STEP = 3  # checkpoints after steps 2 and 4: the kill loses the finished step 2
KILL_RANK = 0  # rank 0 also hosts the rendezvous store and writes the logs
STOP_BOUND_S = 60.0
COMPARED = ("reward/mean", "loss/policy", "actor/grad_norm", "actor/entropy")


def _config(run_dir: Path, *overrides: str, hang_at: int = -1) -> Any:
    """Tiny 2-worker GRPO with a ``fault.inject`` node (hang) between advantage and train."""
    cfg = compose(
        "grpo_llm",
        [
            "data.batch_size=4",
            "rollout.n=4",
            f"trainer.total_steps={TOTAL_STEPS}",
            "trainer.checkpoint_every=2",
            "trainer.keep_checkpoints=4",
            "ray.poll_interval_s=0.2",
            f"run_dir={run_dir}",
            *overrides,
        ],
    )
    return with_hang_before_train(cfg, KILL_RANK, hang_at, 120.0)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, float]]:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    launch(_config(run_dir), show_progress=False)
    return read_metrics(run_dir)


class _Killer(threading.Thread):
    """Waits until worker ``rank`` reports being inside ``node`` at ``step``, then SIGKILLs it."""

    def __init__(self, run_dir: Path, rank: int, node: str, step: int) -> None:
        super().__init__(daemon=True)
        self.path = status_path(run_dir, rank)
        self.node, self.step = node, step
        self.status: dict[str, Any] = {}
        self.process_title = ""
        self.environment: dict[str, str] = {}
        self.killed_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                status = json.loads(self.path.read_text())
            except (OSError, ValueError):  # not written yet
                status = {}
            if (status.get("phase"), status.get("node"), status.get("step")) == (
                "node",
                self.node,
                self.step,
            ):
                process = psutil.Process(status["pid"])
                self.process_title = " ".join(process.cmdline())
                self.environment = process.environ()
                os.kill(status["pid"], signal.SIGKILL)
                self.killed_at = time.monotonic()
                self.status = status
                return
            time.sleep(0.05)


def test_killed_worker_stops_the_run_and_resume_matches_the_uninterrupted_run(
    tmp_path: Path, uninterrupted: list[dict[str, float]]
) -> None:
    run_dir = tmp_path / "run"
    killer = _Killer(run_dir, KILL_RANK, "chaos", KILL_STEP)
    killer.start()
    with pytest.raises(RunFailed) as info:
        launch(_config(run_dir, hang_at=KILL_STEP), show_progress=False)
    stopped_at = time.monotonic()
    killer.join(timeout=5)
    assert killer.killed_at is not None, "the worker never reached the fault node"
    assert "DAGWorker" in killer.process_title  # the pid in the status file is the actor's
    # The worker process started with the allocator settings that keep its memory flat.
    for name, value in worker_process_env().items():
        assert killer.environment.get(name) == value, name
    stop_s = stopped_at - killer.killed_at
    print(f"run stopped {stop_s:.1f} s after the kill")
    assert stop_s < STOP_BOUND_S
    message = str(info.value)
    assert f"worker rank {KILL_RANK} died" in message
    assert f"during node 'chaos' at step {KILL_STEP}" in message
    assert f"pid {killer.status['pid']} on host {killer.status['host']}" in message
    assert not psutil.pid_exists(killer.status["pid"]) or (
        psutil.Process(killer.status["pid"]).status() == psutil.STATUS_ZOMBIE
    )

    # Step 2 finished and was logged, but the last complete checkpoint is after step 1.
    assert [m["step"] for m in read_metrics(run_dir)] == [0, 1, 2]
    assert latest_checkpoint(run_dir / "checkpoints").name == "step_000002"

    launch(_config(run_dir, "resume=true"), show_progress=False)
    resumed = read_metrics(run_dir)
    assert [m["step"] for m in resumed] == list(range(TOTAL_STEPS))  # each step once
    for step in range(TOTAL_STEPS):
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(
                uninterrupted[step][key], rel=1e-5, abs=1e-6
            ), (step, key)
    assert latest_checkpoint(run_dir / "checkpoints").name == f"step_{TOTAL_STEPS:06d}"


def test_every_step_logs_worker_and_simulator_memory(
    uninterrupted: list[dict[str, float]],
) -> None:
    for line in uninterrupted:
        # A worker holds torch, transformers and a tiny Qwen2: well over 100 MiB resident.
        assert 100.0 < line["memory/worker_rss_mb"] < 16384.0, line
        # The LLM DAG starts no simulator processes.
        assert 0.0 <= line["memory/simulator_rss_mb"] < line["memory/worker_rss_mb"], line


def test_memory_mb_counts_child_processes() -> None:
    """A child holding 200 MiB shows up in the descendants' total, not in our own RSS."""
    # Non-zero bytes: every page is written, so all of it is resident.
    hold = "import time; b = b'x' * (200 * 2**20); print(1, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"1"  # the buffer is allocated and touched
        own, with_child = memory_mb()
        assert with_child > 200.0
        assert own == pytest.approx(psutil.Process().memory_info().rss / 2**20, rel=0.1)
    finally:
        child.kill()
        child.wait()
    assert memory_mb()[1] < with_child - 190.0
