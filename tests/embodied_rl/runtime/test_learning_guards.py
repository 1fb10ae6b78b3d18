"""Learning guards for the default tier: each algorithm's reward rises, and a broken update
does not pass the same bar.

The learning tests of the slow tier (``test_srpo_learning.py``, ``test_flow_vla_runs.py``,
``test_branches.py``, ...) are not run by CI. These are their cheap versions: one worker,
fewer and smaller steps, a higher learning rate, no evaluation, no checkpoints. Each test
launches the run twice, with the same seeds: once as configured, once with the learning rate
at 1e-12 (the CONTROL: Adam then moves every weight by about 1e-12 a step, so the policy
stays the one it started as). Both runs start from the same weights and draw the same data
and the same step-0 samples, so they differ in the updates only: a change that stops the
updates from improving the policy (a sign flip, a loss that does not reach the weights,
advantages that are all zero, a gradient that is dropped) leaves the learning run where the
control is, below the bar.

The bars are measured, not guessed: each run's curve was measured for seeds 0, 1, 2 and 3
(``seed`` and the policy's init ``seed`` both set to the value; 2026-12-01, 1 CPU worker on a
2-core machine) and each bar sits between the worst learning run and the best control run.
The tests run seed 3; the settings were tuned on seed 0.
"""

from __future__ import annotations

import statistics

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose
from tests.embodied_rl.runtime.run_helpers import read_metrics

pytestmark = pytest.mark.ray

SEED = 3  # the settings below were tuned on seed 0; seeds 1 and 2 were measured as well
FROZEN = "models.actor.optimizer.lr=1e-12"  # the control: the same run with no-op updates
QUIET = [
    "workers.num_workers=1", "trainer.checkpoint_every=0", "trainer.log_to_console=false",
    "trainer.loggers=[]", f"seed={SEED}", f"+models.actor.options.seed={SEED}",
]  # fmt: skip
NO_EVAL = ["eval.every=0", "eval.at_end=false"]


def _curve(run_dir, config: str, overrides: list[str], key: str) -> list[float]:
    """``key`` at every step of a fresh ``config`` run in ``run_dir``."""
    cfg = compose(config, [*QUIET, *overrides, f"run_dir={run_dir}"])
    return [row[key] for row in read_metrics(launch(cfg, show_progress=False).run_dir)]


def _learned_and_frozen(tmp_path, config: str, overrides: list[str], key: str):
    """The curves of ``key`` of the run and of its control (learning rate 1e-12)."""
    learned = _curve(tmp_path / "learned", config, overrides, key)
    frozen = _curve(tmp_path / "frozen", config, [*overrides, FROZEN], key)
    # Step 0 samples before any update: the two runs are the same run until then.
    assert learned[0] == pytest.approx(frozen[0]), (learned[0], frozen[0])
    return learned, frozen


SRPO_STEPS = 16
SRPO_MLP = [
    *NO_EVAL, f"trainer.total_steps={SRPO_STEPS}", "rollout.num_envs=64",
    "models.actor.optimizer.lr=1e-2",
]  # fmt: skip
SRPO_BAR = 0.35  # rollout success, mean of the last 4 steps


def test_srpo_lifts_reach_success_and_frozen_updates_do_not(tmp_path):
    """SRPO (srpo_reach: the MLP policy, 8 (task, init state) pairs x 16 rollouts a step)
    takes rollout success from about 0.02 to above 0.5 in 16 steps; its control stays at
    the random policy's few percent. The success rate of the rollouts is measured on the
    policy as it is at each step, so it rises only through the updates."""
    learned, frozen = _learned_and_frozen(tmp_path, "srpo_reach", SRPO_MLP, "rollout/success_rate")
    assert len(learned) == len(frozen) == SRPO_STEPS
    late_learned, late_frozen = statistics.mean(learned[-4:]), statistics.mean(frozen[-4:])
    # Measured (2026-12-01, mean of steps 12-15; first 3 steps 0.01-0.07 in every run):
    # learning 0.77 (seed 0), 0.69 (seed 1), 0.55 (seed 2), 0.90 (seed 3);
    # control 0.006 (seed 1) ...
    assert late_learned > SRPO_BAR, learned
    assert late_frozen < SRPO_BAR, frozen


LLM_STEPS = 12
GRPO_ARITHMETIC = [
    f"trainer.total_steps={LLM_STEPS}", "data.batch_size=8", "models.actor.optimizer.lr=1e-2",
]  # fmt: skip
GRPO_BAR = 0.10  # reward, mean of the last 6 steps


def test_grpo_raises_the_tiny_llms_arithmetic_reward_and_frozen_updates_do_not(tmp_path):
    """GRPO (grpo_llm: the random-init tiny Qwen2 on the arithmetic prompts, 8 prompts x 8
    answers a step, digits only) lifts the mean reward (exact answers 1, near ones partial
    credit) from about 0.06 to above 0.13 in 12 steps: the model learns which numbers the
    answers are near. Its control samples from the random init throughout, about 0.05.
    Batches differ in difficulty, which is why the bar is on a mean of 6 steps; the control
    draws the same batches."""
    learned, frozen = _learned_and_frozen(tmp_path, "grpo_llm", GRPO_ARITHMETIC, "reward/mean")
    assert len(learned) == len(frozen) == LLM_STEPS
    late_learned, late_frozen = statistics.mean(learned[-6:]), statistics.mean(frozen[-6:])
    # Measured (2026-12-01, mean of steps 6-11; first 3 steps 0.05-0.07 in every run):
    # learning 0.168 (seed 0), 0.193 (seed 1), 0.139 (seed 2), 0.176 (seed 3);
    # control 0.056 (seed 0), 0.040 (seed 1), 0.044 (seed 2) ...
    assert late_learned > GRPO_BAR, learned
    assert late_frozen < GRPO_BAR, frozen
