"""SIGTERM to the driver in the middle of a training step: a Slurm or Kubernetes preemption.

Issue 28, item 10: SIGTERM used to kill the driver at once, with no message, no checkpoint of
the steps since the last one, and status files saying a node was running. Now the workers
finish the step in progress (its evaluation included) and checkpoint it within
``trainer.preempt_grace_s``, the driver names that checkpoint and the resume command and the
CLI exits 143, and ``resume=true`` continues to exactly the numbers of an uninterrupted run.
With a grace period of 0 the workers are stopped at once, like Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunPreempted
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.worker import status_path
from tests.embodied_rl.runtime.run_helpers import (
    SMALL_REACH_RUN,
    cli_train_command,
    comparable_numbers,
    read_metrics,
    with_hang_before_train,
)

pytestmark = pytest.mark.ray

TOTAL_STEPS = 6
STOP_STEP = 2  # SIGTERM comes while this step holds in a fault.inject hang: it stops after it
HANG_S = 4.0
SMALL = [
    "workers.num_workers=1",
    f"trainer.total_steps={TOTAL_STEPS}",
    "trainer.checkpoint_every=100",  # no regular checkpoint before the end: only the stop's
    "eval.every=3",  # the stopped step (completed 3) evaluates, and so does the resumed part
    *SMALL_REACH_RUN,
]


def _config(run_dir: Path, *overrides: str, hang_at: int = -1) -> Any:
    """Tiny 1-worker SRPO on the reach task, a ``fault.inject`` hang before the train node.

    Every run has the same DAG (a disabled fault node passes its batch through), so the
    uninterrupted and the preempted run differ only in the signal.
    """
    cfg = compose("srpo_reach", [*SMALL, f"run_dir={run_dir}", *overrides])
    return with_hang_before_train(cfg, 0, hang_at, HANG_S)


def _status(run_dir: Path, rank: int = 0) -> dict[str, Any]:
    try:
        return json.loads(status_path(run_dir, rank).read_text())
    except (OSError, ValueError):  # not written yet, or mid-replace
        return {}


class _Terminator(threading.Thread):
    """Sends SIGTERM to process ``pid`` once rank 0 reports being inside ``node`` at ``step``
    (``node=None``: inside any node at ``step`` or later)."""

    def __init__(self, run_dir: Path, pid: int, step: int, node: str | None) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.pid, self.step, self.node = run_dir, pid, step, node
        self.sent_at: float | None = None

    def _due(self, status: dict[str, Any]) -> bool:
        if status.get("phase") != "node" or status.get("dag") != "train":
            return False
        if self.node is None:
            return int(status.get("step", -1)) >= self.step
        return (status.get("node"), status.get("step")) == (self.node, self.step)

    def run(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self._due(_status(self.run_dir)):
                self.sent_at = time.monotonic()
                os.kill(self.pid, signal.SIGTERM)
                return
            time.sleep(0.05)


def test_sigterm_mid_step_checkpoints_that_step_and_resume_matches_an_uninterrupted_run(
    tmp_path,
):
    full = read_metrics(launch(_config(tmp_path / "full"), show_progress=False).run_dir)
    run_dir = tmp_path / "preempted"
    terminator = _Terminator(run_dir, os.getpid(), STOP_STEP, "chaos")
    terminator.start()

    with pytest.raises(RunPreempted) as info:
        launch(_config(run_dir, hang_at=STOP_STEP), show_progress=False)
    stopped_after_s = time.monotonic() - terminator.sent_at

    assert info.value.exit_code == 143
    message = str(info.value)
    stopped = STOP_STEP + 1  # steps done: the one in progress was finished, not lost
    newest = run_dir / "checkpoints" / f"step_{stopped:06d}"
    assert message.startswith("preempted (SIGTERM)"), message
    assert f"the newest checkpoint is {newest}" in message
    assert f"resume=true run_dir={run_dir}" in message
    assert stopped_after_s < 60.0, stopped_after_s  # the hang's rest, one step, a checkpoint
    # Only the stop's checkpoint exists (no regular one before the end): it was written for
    # the step in progress, whose evaluation ran and whose metrics row was logged.
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [newest.name]
    cut = read_metrics(run_dir)
    assert [row["step"] for row in cut] == list(range(stopped))
    assert "eval/success_rate" in cut[-1]
    status = _status(run_dir)
    assert (status["phase"], status["node"], status["step"]) == ("preempted", None, stopped)

    resumed = read_metrics(launch(_config(run_dir, "resume=true"), show_progress=False).run_dir)

    assert [row["step"] for row in resumed] == list(range(TOTAL_STEPS))
    assert "eval/success_rate" in resumed[-1]  # an evaluation after the resume too
    assert any(row["loss/policy"] != 0.0 for row in full[stopped:])  # the policy learns there
    assert comparable_numbers(resumed) == comparable_numbers(
        full
    )  # exactly, every step after the resume too
    assert _status(run_dir)["phase"] == "done"


def test_sigterm_with_no_grace_period_stops_at_once_through_the_cli(tmp_path):
    """``trainer.preempt_grace_s=0``: the CLI (a real process, as Slurm signals it) stops the
    workers in the step, keeps no part of it, says so in one line and exits 143."""
    run_dir = tmp_path / "run"
    overrides = [*SMALL, "trainer.total_steps=50", "trainer.preempt_grace_s=0", "eval.every=0"]
    command = cli_train_command("srpo_reach", *overrides, f"run_dir={run_dir}")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    terminator = _Terminator(run_dir, process.pid, 1, None)
    terminator.start()
    try:
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    stopped_after_s = time.monotonic() - terminator.sent_at

    assert process.returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert errors[0].startswith("error: preempted (SIGTERM): trainer.preempt_grace_s is 0")
    assert "no checkpoint was saved yet" in errors[0]
    assert f"resume=true run_dir={run_dir}" in errors[0]
    assert stopped_after_s < 30.0, stopped_after_s
    assert not list((run_dir / "checkpoints").glob("step_*"))
    status = _status(run_dir)
    assert status["phase"] == "stopped" and status["node"] is None, status


def test_a_negative_grace_period_is_refused_before_any_work(capsys):
    assert main(["validate", "--config-name", "srpo_reach", "trainer.preempt_grace_s=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "preempt_grace_s must be >= 0, got -1" in err
    assert "Fix:" in err
