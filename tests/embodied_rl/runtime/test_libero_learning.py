"""Learning test on LIBERO: scripted demo -> one-demo SFT -> SRPO raises success (CPU, 2 workers).

A reduced ``scripts/bench/libero_learning.py``: one libero_object task, one scripted demo
(init state 0), a short behaviour-cloning run of the fast CPU policy, then SRPO from its
checkpoint on the training init states. Each RL step rolls out every training init state
(``data.batch_size`` = their number), so the per-step success rates are comparable across
steps. A reward, advantage or loss that is broken (sign, scale, zero, detached) leaves
success flat or drives it down; the assertion asks for a rise well outside the noise of the
first steps.
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
    pytest.mark.timeout(1800),  # about 12 minutes on 2 idle cores
    pytest.mark.skipif(
        importlib.util.find_spec("libero") is None, reason="LIBERO is not installed"
    ),
]

TASK = 0  # libero_object: pick up the alphabet soup and place it in the basket
NUM_INIT_STATES = 3  # with heldout_every=3: train on init states 0 and 1, 2 held out
SHARED = [
    "policy=mlp_image",
    "simulator.options.suite=libero_object",
    "simulator.options.max_steps=128",
    f"simulator.num_init_states={NUM_INIT_STATES}",
    f"data.heldout_every={NUM_INIT_STATES}",
    f"data.tasks=[{TASK}]",
    "eval.at_end=false",
    "trainer.log_to_console=false",
]
RL_STEPS = 8


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_srpo_raises_success_from_a_one_demo_sft_start(tmp_path):
    demos = tmp_path / "demos"
    argv = ["demos", "--suite", "libero_object", "--tasks", str(TASK), "--init-states", "0"]
    assert cli_main([*argv, "--image-size", "64", "--out", str(demos), "--no-progress"]) == 0

    sft = [*SHARED, f"data.paths=[{demos}]", "data.max_demos_per_task=1", "data.batch_size=64"]
    sft += ["models.actor.optimizer.lr=1e-3", "trainer.total_steps=600"]
    sft += ["trainer.checkpoint_every=600", f"run_dir={tmp_path / 'sft'}"]
    sft_run = launch(compose("sft_libero", sft), show_progress=False)

    srpo = [*SHARED, f"models.actor.init_from={sft_run.run_dir}", "data.batch_size=2"]
    srpo += ["rollout.group_size=8", "rollout.num_envs=8", "rollout.temperature=0.3"]
    srpo += ["models.actor.optimizer.lr=3e-4", "algorithm.actor.ppo_epochs=2"]
    srpo += ["algorithm.actor.num_mini_batches=2", "algorithm.actor.micro_batch_size=64"]
    srpo += [f"trainer.total_steps={RL_STEPS}", f"trainer.checkpoint_every={RL_STEPS}"]
    lines = _metrics(
        launch(compose("srpo_libero", [*srpo, f"run_dir={tmp_path / 'srpo'}"]), False).run_dir
    )

    success = [m["rollout/success_rate"] for m in lines]
    print("rollout success per step:", success)
    # 48 episodes on each side: with no learning, a rise of 0.2 is about two standard
    # deviations of the difference (success near 0.35); a wrong sign drives it down.
    first, last = sum(success[:3]) / 3, sum(success[-3:]) / 3
    assert last >= first + 0.2, success
