"""One job, two branches (configs/grpo_llm_srpo_reach.yaml): GRPO on the tiny LLM on workers
0-1 beside SRPO on the reach task's MLP policy on workers 2-3, each with its own data, model,
optimiser and metrics."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = pytest.mark.ray

COMPARED = ("reward/mean", "loss/policy", "actor/grad_norm", "actor/entropy")


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_llm_branch_trains_exactly_as_grpo_llm_alone(tmp_path):
    """The branch's ranks, seeds, data shards and model are grpo_llm's on 2 workers, so its
    numbers must be identical: nothing of the reach branch leaks into it, and its metrics
    are kept apart under llm/."""
    steps = ["trainer.total_steps=2", "trainer.checkpoint_every=2"]
    # Small batches (the branch's 4 prompts x 4 samples are grpo_llm's with the same overrides);
    # the reach branch's 2 pairs x 4 rollouts are its 8 episodes of a step.
    llm_sizes = ["data.llm.batch_size=4", "rollout.llm.n=4"]
    reach_sizes = ["data.reach.batch_size=2", "rollout.reach.group_size=4"]
    reach_sizes += ["rollout.reach.num_envs=4"]
    episodes = 2 * 4
    both = launch(
        compose(
            "grpo_llm_srpo_reach",
            [*steps, *llm_sizes, *reach_sizes, f"run_dir={tmp_path / 'both'}"],
        ),
        show_progress=False,
    )
    alone_sizes = ["data.batch_size=4", "rollout.n=4"]
    alone = launch(
        compose("grpo_llm", [*steps, *alone_sizes, f"run_dir={tmp_path / 'alone'}"]),
        show_progress=False,
    )
    for joint, single in zip(_metrics(both.run_dir), _metrics(alone.run_dir), strict=True):
        for key in COMPARED:
            assert joint[f"llm/{key}"] == pytest.approx(single[key], rel=1e-6), key
        # The reach branch's success rate is a count of its episodes' successes over their
        # number, and the nodes that read the episodes after the rollout see the same ones:
        # the binary reward's mean, and SRPO's rate (the filter keeps every group here).
        rate = joint["reach/rollout/success_rate"]
        successes = round(rate * episodes)
        assert 0 <= successes <= episodes and rate == pytest.approx(successes / episodes), rate
        assert joint["reach/reward/mean"] == pytest.approx(rate, abs=1e-9)
        assert joint["reach/srpo/success_rate"] == pytest.approx(rate, abs=1e-9)
        assert not any(key.startswith(("reward/", "actor/", "loss/")) for key in joint)


STEPS = 30


@pytest.mark.slow
def test_both_branches_learn_in_one_job(tmp_path):
    """Also ``grpo_llm``'s learning test: the llm branch is ``grpo_llm`` on 2 workers number for
    number (the test above), so its reward rising here is ``grpo_llm``'s."""
    result = launch(
        compose("grpo_llm_srpo_reach", [f"trainer.total_steps={STEPS}", f"run_dir={tmp_path}"]),
        show_progress=False,
    )
    rows = _metrics(result.run_dir)
    assert len(rows) == STEPS
    llm = [r["llm/reward/mean"] for r in rows]
    reach = [r["reach/rollout/success_rate"] for r in rows]
    # Measured (seed 0, 2026-11-28): llm reward 0.066 over steps 1-3 -> 0.196 over steps
    # 21-30 (0.274 over 31-40; step 1 0.041); reach success 0.023 -> 0.98 over steps 26-30
    # (alone: grpo_llm ~0.065 -> 0.21 over steps 31-40, srpo_reach ~0.01 -> near 1.0).
    assert statistics.mean(llm[-10:]) > statistics.mean(llm[:3]) + 0.06, llm
    assert statistics.mean(llm[-10:]) > 2 * llm[0], llm
    assert statistics.mean(reach[-5:]) > statistics.mean(reach[:3]) + 0.5, reach
