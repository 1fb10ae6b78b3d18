"""Ctrl-C (SIGINT to the driver) in the middle of an evaluation rollout.

The driver stops the workers while their ``run`` is walking the evaluation DAG. Closing the
simulators under running episodes used to let the evaluation carry on against closed
environments and publish its results (a LIBERO benchmark logged 10/50 where every other
evaluation gave 28-31/50). Now the walk stops at its next env step, the cut-short step
writes no report, metrics or checkpoint, and the driver says what was kept and how to
continue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunInterrupted
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.context import RunStopped
from embodied_rl.runtime.worker import DAGWorker, status_path

pytestmark = pytest.mark.ray

# The reach episodes of the evaluation run this many policy steps (a greedy random-init
# policy fails), about a minute per wave: the stop must land inside them, so an evaluation
# that ends by itself before the driver's close() arrives cannot pass for a stopped one.
EVAL_MAX_STEPS = 20_000
TRAIN_MAX_STEPS = 50  # the task's own episode length, for the training rollouts


def _config(run_dir: Path, *overrides: str) -> Any:
    cfg = compose(
        "srpo_reach",
        [
            *overrides,
            "trainer.total_steps=2",
            "trainer.checkpoint_every=1",
            "eval.every=1",
            "data.batch_size=2",
            "rollout.group_size=4",
            "rollout.num_envs=4",
            "ray.poll_interval_s=0.2",
            f"run_dir={run_dir}",
        ],
    )
    with open_dict(cfg):
        cfg.simulator.options.max_steps = EVAL_MAX_STEPS  # the env never ends an episode first
        cfg.rollout.max_steps = TRAIN_MAX_STEPS
        rollout = next(node for node in cfg.eval_dag.nodes if node.id == "rollout")
        rollout.config.max_steps = EVAL_MAX_STEPS
    return cfg


class _Interrupter(threading.Thread):
    """Sends SIGINT to this process once rank 0 is inside the evaluation rollout."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.sent_at, self.status = run_dir, None, None

    def run(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                status = json.loads(status_path(self.run_dir, 0).read_text())
            except (OSError, ValueError):  # not written yet, or mid-replace
                status = {}
            if status.get("dag") == "eval" and status.get("node") == "rollout":
                time.sleep(1.0)  # well inside the episodes
                self.status, self.sent_at = status, time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test: a job started in the
    background of a script (``.ci/run &``) inherits SIGINT *ignored*, and the signal the
    test sends would then never reach the launcher."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_an_evaluation_stops_it_and_writes_nothing_from_it(tmp_path, ctrl_c_raises):
    run_dir = tmp_path / "run"
    interrupter = _Interrupter(run_dir)
    interrupter.start()

    with pytest.raises(RunInterrupted) as info:
        launch(_config(run_dir), show_progress=False)
    stopped_after_s = time.monotonic() - interrupter.sent_at

    assert interrupter.status["step"] == 1  # the evaluation after training step 0
    message = str(info.value)
    assert "interrupted" in message and "no checkpoint was saved yet" in message
    assert f"resume=true run_dir={run_dir}" in message
    # The walk stopped at its next env step: no wait for the close timeout (20 s), nor for
    # the rest of the episodes.
    assert stopped_after_s < 15.0, stopped_after_s
    assert not (run_dir / "eval" / "step_000001").exists()  # no report from the cut eval
    metrics = run_dir / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text().strip() == ""  # step 0 discarded
    assert not list((run_dir / "checkpoints").glob("step_*"))
    status = json.loads(status_path(run_dir, 0).read_text())  # no node left "running"
    assert (status["phase"], status["node"]) == ("stopped", None), status


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_close_during_an_evaluation_rollout_stops_the_walk_between_env_steps(tmp_path):
    """The worker itself, in this process: ``close()`` from another thread (as the driver's
    call arrives) while ``run()`` is inside the evaluation rollout. The walk must end with
    ``RunStopped`` at its next env step, not fail on (or finish against) closed simulators,
    and close() must not wait for the episodes to end."""
    run_dir = tmp_path / "run"
    cfg = OmegaConf.to_container(_config(run_dir, "workers.num_workers=1"), resolve=True)
    worker = DAGWorker(cfg, 0, 1, str(run_dir))
    worker.setup("127.0.0.1", _free_port())
    outcome: dict[str, Any] = {}

    def walk() -> None:
        try:
            outcome["result"] = worker.run()
        except Exception as err:  # noqa: BLE001 - the test inspects what run() raised
            outcome["error"] = err

    walker = threading.Thread(target=walk, daemon=True)
    try:
        walker.start()
        deadline = time.monotonic() + 300
        while not (worker.status().get("dag") == "eval" and worker.status()["node"] == "rollout"):
            assert time.monotonic() < deadline and walker.is_alive(), outcome
            time.sleep(0.05)
        time.sleep(0.5)
        started = time.monotonic()
        worker.close()
        close_s = time.monotonic() - started
        walker.join(timeout=60)
    finally:
        worker.shutdown()

    assert not walker.is_alive()
    assert isinstance(outcome.get("error"), RunStopped), outcome  # not a NodeFailure
    assert "during a rollout" in str(outcome["error"])
    assert close_s < 5.0, close_s  # one env step, not the rest of the episodes
    assert not (run_dir / "eval" / "step_000001").exists()
