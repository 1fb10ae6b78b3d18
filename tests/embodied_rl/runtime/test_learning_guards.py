"""Learning guards for the default tier: each algorithm's reward rises, and a broken update
does not pass the same bar.

The learning tests of the slow tier (``test_srpo_learning.py``, ``test_flow_vla_runs.py``,
``test_branches.py``, ...) are not run by CI. These are their cheap versions: one worker,
fewer and smaller steps, a higher learning rate where that was measured to help, no
evaluation, no checkpoints. Each test launches the run twice, side by side, with the same
seeds: once as configured, once with the learning rate at 1e-12 (the CONTROL: Adam then
moves every weight by about 1e-12 a step, so the policy stays the one it started as). Both
runs start from the same weights and draw the same data and the same step-0 samples, so
they differ in the updates only: a change that stops the updates from improving the policy
(a sign flip, a loss that does not reach the weights, advantages that are all zero, a
gradient that is dropped) leaves the learning run where the control is, below the bar.

The bars are measured, not guessed: each run's curve was measured for seeds 0, 1, 2 and 3
(``seed`` and the policy's init ``seed`` both set to the value; 2026-12-01, 1 CPU worker on a
2-core machine) and each bar sits between the worst learning run and the best control run.
The tests run seed 3; the settings were tuned on seed 0.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
from pathlib import Path

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose
from policies.flow_vla.configuration import FlowVLAConfig
from tests.embodied_rl.runtime.run_helpers import cli_train_command, read_metrics

pytestmark = pytest.mark.ray

SEED = 3  # the settings below were tuned on seed 0; seeds 1 and 2 were measured as well
FROZEN = "models.actor.optimizer.lr=1e-12"  # the control: the same run with no-op updates
QUIET = [
    "workers.num_workers=1", "trainer.checkpoint_every=0", "trainer.log_to_console=false",
    "trainer.loggers=[]", f"seed={SEED}", f"+models.actor.options.seed={SEED}",
]  # fmt: skip
NO_EVAL = ["eval.every=0", "eval.at_end=false"]


def _curve(run_dir: Path, key: str) -> list[float]:
    """``key`` at every step of the finished run in ``run_dir``."""
    return [row[key] for row in read_metrics(run_dir)]


def _learned_and_frozen(
    tmp_path: Path, config: str, overrides: list[str], key: str
) -> tuple[list[float], list[float]]:
    """The curves of ``key`` of the run and of its control (learning rate 1e-12).

    The control runs beside the learning run, through the CLI in a process of its own (its
    own embedded Ray cluster): each is one worker, mostly one core's work, so the pair takes
    about the time of one run on 2 cores."""
    learned_dir, frozen_dir = tmp_path / "learned", tmp_path / "frozen"
    command = cli_train_command(config, *QUIET, *overrides, FROZEN, f"run_dir={frozen_dir}")
    control = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        cfg = compose(config, [*QUIET, *overrides, f"run_dir={learned_dir}"])
        launch(cfg, show_progress=False)
        output, _ = control.communicate(timeout=600)
    finally:
        if control.poll() is None:
            control.kill()
    assert control.returncode == 0, output
    learned, frozen = _curve(learned_dir, key), _curve(frozen_dir, key)
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
    # control 0.043 (seed 0), 0.006 (seed 1), 0.020 (seed 2), 0.027 (seed 3), no step of
    # any control above 0.08. Learning and control about 55 s and 33 s (niced, busy machine).
    assert late_learned > SRPO_BAR, learned
    assert late_frozen < SRPO_BAR, frozen


FLOW_STEPS = 24
FLOW_SMALL = {
    "image_size": 0, "chunk": 1, "prefix_hidden": "[64]", "expert_width": 32,
    "expert_layers": 1, "expert_heads": 2, "denoise_steps": 2, "instruction_buckets": 0,
    "gripper_convention": "none", "logprob_method": "sde", "noise_level": 1.0,
}  # fmt: skip
FLOW_BAR = 0.24  # rollout success, mean of the last 4 steps


def _flow_actor() -> list[str]:
    """Overrides that turn srpo_reach's actor (an mlp) into a small state-only flow_vla: its
    mlp-only options removed, the flow ones added (the init seed comes with ``QUIET``)."""
    mlp = compose("srpo_reach").models.actor.options
    flow = {field.name for field in dataclasses.fields(FlowVLAConfig)}
    out = ["models.actor.policy=flow_vla"]
    out += [f"~models.actor.options.{name}" for name in mlp if name not in flow]
    return out + [
        f"{'' if name in mlp else '+'}models.actor.options.{name}={value}"
        for name, value in FLOW_SMALL.items()
    ]


def test_srpo_lifts_the_flow_policys_reach_success_and_frozen_updates_do_not(tmp_path):
    """SRPO with the flow-matching VLA (Flow-SDE log-probs of its 2-step denoising chain)
    on reach, at the preset's learning rate: rollout success stays near its start for
    about 15 steps, then rises, above 0.3 over steps 20-23 for every seed measured; its
    control, the flow policy left at its random init, stays where it started (0.0-0.3 a
    step, the init states of a step differ). This is the check that the chain's log-probs
    give the update a direction that improves the actions, which the flow run tests of the
    default tier (two steps, finite numbers) cannot see. The MLP test's 1e-2 was no faster
    (seed 0: 0.14 over steps 16-19, as at 3e-3) and with lower noise levels drove the
    policy to saturated, deterministic actions; 5e-3 failed seed 2 (0.11 over steps 20-23)."""
    overrides = [
        *_flow_actor(),
        *NO_EVAL,
        f"trainer.total_steps={FLOW_STEPS}",
        "rollout.num_envs=64",
    ]
    learned, frozen = _learned_and_frozen(tmp_path, "srpo_reach", overrides, "rollout/success_rate")
    assert len(learned) == len(frozen) == FLOW_STEPS
    late_learned, late_frozen = statistics.mean(learned[-4:]), statistics.mean(frozen[-4:])
    # Measured (2026-12-01, mean of steps 20-23; first 3 steps 0.05-0.22): learning 0.49
    # (seed 0), 0.71 (seed 1), 0.37 (seed 2), 0.35 (seed 3); control 0.133 (seed 0), 0.063
    # (seed 1), 0.102 (seed 2), 0.072 (seed 3). About 70 s a run (niced, busy machine).
    assert late_learned > FLOW_BAR, learned
    assert late_frozen < FLOW_BAR, frozen


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
    # control 0.056 (seed 0), 0.040 (seed 1), 0.044 (seed 2), 0.045 (seed 3), no step of
    # any control above 0.08. About 30 s each on 1 worker (niced, busy machine).
    assert late_learned > GRPO_BAR, learned
    assert late_frozen < GRPO_BAR, frozen
