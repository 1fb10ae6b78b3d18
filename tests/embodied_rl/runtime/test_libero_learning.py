"""LIBERO end to end on the real pipeline: scripted demo -> one-demo SFT -> RL that gains.

The reduced version of ``scripts/bench/libero_learning.py`` on one libero_object task: the
planner writes one demonstration (init state 0), behaviour cloning trains the fast CPU policy
on it on 2 Ray workers and evaluates it greedily on the 8 training init states, then SRPO from
that checkpoint raises the success of its own rollouts on those init states.

A broken demo writer or reader, action normalisation, gripper convention, loss or checkpoint
hand-over leaves the arm short of the basket (the random-init policy never gets there); a
broken reward, advantage or policy loss leaves the RL success where the SFT policy put it or
lowers it (see the RL test's docstring for the margin).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from embodied_rl.cli import main as cli_main
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.launcher import launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.libero,
    pytest.mark.skipif(
        importlib.util.find_spec("libero") is None, reason="LIBERO is not installed"
    ),
]

TASK = 0  # libero_object: pick up the alphabet soup and place it in the basket
TRAIN_INITS = 8  # init states 0..7 train (9 states, every 9th held out)
COMMON = [
    "policy=mlp_image",
    "simulator.options.suite=libero_object",
    "simulator.options.max_steps=160",
    "simulator.num_init_states=9",
    "data.heldout_every=9",
    f"data.tasks=[{TASK}]",
    "eval.split=train",  # greedy, one episode per training init state (0..7)
    f"eval.batch_size={TRAIN_INITS}",
    "trainer.log_to_console=false",
]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """One scripted demo -> 600 SFT steps on 2 workers -> greedy eval on the 8 train states."""
    root = tmp_path_factory.mktemp("libero_learning")
    demos = root / "demos"
    argv = ["demos", "--suite", "libero_object", "--tasks", str(TASK), "--init-states", "0"]
    assert cli_main([*argv, "--image-size", "64", "--out", str(demos), "--no-progress"]) == 0
    overrides = [
        *COMMON,
        f"data.paths=[{demos}]",
        "data.max_demos_per_task=1",
        "data.batch_size=64",
        "models.actor.optimizer.lr=1e-3",
        "trainer.total_steps=600",
        "trainer.checkpoint_every=600",
        "eval.max_videos=8",
        f"run_dir={root / 'sft'}",
    ]
    return launch(compose("sft_libero", overrides), show_progress=False).run_dir


@pytest.mark.timeout(1200)  # the SFT fixture; timings: BENCHMARKS.md, "The reduced version CI runs"
def test_one_demo_sft_replays_its_task_to_success(sft_run):
    lines = _metrics(sft_run)
    assert lines[-1]["sft/loss"] < 0.25 * lines[0]["sft/loss"], (lines[0], lines[-1])
    videos = sorted(p.name for p in (sft_run / "eval" / "step_000600").glob("*.mp4"))
    assert any(name.startswith("task0_init0_success") for name in videos), videos
    # The demo's own init state and at least one it never saw (measured: 3 of 8).
    assert lines[-1]["eval/success_rate"] >= 2 / TRAIN_INITS, lines[-1]


@pytest.mark.timeout(1500)  # timings: BENCHMARKS.md, "The reduced version CI runs"
def test_srpo_from_the_sft_policy_raises_its_success(sft_run, tmp_path):
    """8 SRPO steps of 4 groups x 8 episodes on the 8 training init states.

    Measured on 2 cores (BENCHMARKS.md, "The reduced version CI runs"): rollout success
    (temperature 0.3, 32 episodes a step) 0.30 over the first three steps, 0.56 over the last
    three; greedy success on the 8 states 3/8 after SFT, 4/8 after SRPO (7/8 with the
    per-rank mini-batch cut used before global mini-batches: greedy on 8 states moves in
    steps of 1/8 and flips with small changes, so it is asserted with one state of margin and
    the rollout rate carries the test). The same run without learning (lr 1e-9): 0.29 -> 0.25,
    greedy 3/8; with the advantages negated: 0.27 -> 0.09, greedy 0/8. A 3-step mean of 96
    episodes has a standard error of about 0.05, so the asserted +0.15 is over 2 standard
    errors of a difference; a reward that does not favour success, advantages that do not
    rank the group, or a loss that does not raise the likelihood of advantaged actions leave
    both where SFT put them or lower.
    """
    overrides = [
        *COMMON,
        f"models.actor.init_from={sft_run}",
        "data.batch_size=4",  # (task, init state) groups per step
        "rollout.group_size=8",
        "rollout.num_envs=4",
        "rollout.temperature=0.3",
        "models.actor.optimizer.lr=3e-4",
        "algorithm.actor.ppo_epochs=2",
        "algorithm.actor.num_mini_batches=2",
        "algorithm.actor.micro_batch_size=64",
        "trainer.total_steps=8",
        "trainer.checkpoint_every=8",
        "eval.max_videos=0",
        f"run_dir={tmp_path / 'srpo'}",
    ]
    lines = _metrics(launch(compose("srpo_libero", overrides), show_progress=False).run_dir)
    success = [line["rollout/success_rate"] for line in lines]
    assert len(success) == 8, success
    first, last = sum(success[:3]) / 3, sum(success[-3:]) / 3
    assert last >= first + 0.15, success
    sft_greedy = _metrics(sft_run)[-1]["eval/success_rate"]
    assert lines[-1]["eval/success_rate"] >= sft_greedy + 1 / TRAIN_INITS, (sft_greedy, lines[-1])
