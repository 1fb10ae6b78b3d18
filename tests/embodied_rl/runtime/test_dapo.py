"""DAPO end to end (configs/dapo_llm.yaml): dynamic sampling refills the batch by re-running
rollouts on 2 workers, and the run checkpoints (tests/test_configs.py leaves it to this test)."""

from __future__ import annotations

import json

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = pytest.mark.ray


def test_dynamic_sampling_refills_to_the_configured_size(tmp_path):
    # 2 prompts per round but 4 groups wanted: at least 2 rounds of prompts -> rollout -> reward.
    cfg = compose(
        "dapo_llm",
        [
            "data.batch_size=2",
            "rollout.n=4",
            "algorithm.dynamic_sampling.target_groups=4",
            "algorithm.dynamic_sampling.max_rounds=6",
            "trainer.total_steps=2",
            "trainer.checkpoint_every=2",
            f"run_dir={tmp_path}",
        ],
    )
    result = launch(cfg, show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert m["dapo/rounds"] >= 2
        assert m["dapo/kept_groups"] == 4
        assert m["dapo/kept_samples"] == 16  # 4 groups x 4 samples reach the trainer
        assert m["advantage/groups_with_signal"] == 1.0  # no uniform-reward group is trained
        assert 0.0 <= m["reward/mean"] <= 1.0 and abs(m["loss/policy"]) < 1e3
    assert (result.run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
