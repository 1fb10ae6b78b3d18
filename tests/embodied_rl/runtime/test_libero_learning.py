"""LIBERO end to end on the real pipeline: scripted demo -> one-demo SFT -> greedy success.

The reduced first half of ``scripts/bench/libero_learning.py``: the planner writes one
demonstration of a libero_object task (init state 0), behaviour cloning trains the fast CPU
policy on it on 2 Ray workers, and the run's own closing evaluation replays that init state
greedily in the simulator. A broken demo writer or reader, action normalisation, gripper
convention, loss or checkpoint hand-over leaves the arm short of the basket; the random-init
policy never gets there.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from embodied_rl.cli import main as cli_main
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.launcher import launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.libero,
    pytest.mark.timeout(1200),  # about 4 minutes on 2 idle cores
    pytest.mark.skipif(
        importlib.util.find_spec("libero") is None, reason="LIBERO is not installed"
    ),
]

TASK = 0  # libero_object: pick up the alphabet soup and place it in the basket


def test_one_demo_sft_replays_its_task_to_success(tmp_path):
    demos = tmp_path / "demos"
    argv = ["demos", "--suite", "libero_object", "--tasks", str(TASK), "--init-states", "0"]
    assert cli_main([*argv, "--image-size", "64", "--out", str(demos), "--no-progress"]) == 0

    overrides = [
        "policy=mlp_image",
        "simulator.options.suite=libero_object",
        "simulator.options.max_steps=160",
        "simulator.num_init_states=3",  # with heldout_every=3: init states 0, 1 train; 2 held out
        "data.heldout_every=3",
        f"data.tasks=[{TASK}]",
        f"data.paths=[{demos}]",
        "data.max_demos_per_task=1",
        "data.batch_size=64",
        "models.actor.optimizer.lr=1e-3",
        "trainer.total_steps=600",
        "trainer.checkpoint_every=600",
        "eval.split=train",  # the demo's init state (0) and another training one (1)
        "eval.batch_size=2",
        "eval.max_videos=2",
        "trainer.log_to_console=false",
        f"run_dir={tmp_path / 'sft'}",
    ]
    run = launch(compose("sft_libero", overrides), show_progress=False)
    lines = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["sft/loss"] < 0.25 * lines[0]["sft/loss"], (lines[0], lines[-1])
    assert lines[-1]["eval/success_rate"] >= 0.5, lines[-1]
    videos = sorted(p.name for p in (run.run_dir / "eval" / "step_000600").glob("*.mp4"))
    assert any(name.startswith("task0_init0_success") for name in videos), videos
