"""SRPO on LIBERO in CI: 2 workers, tiny OpenVLA-OFT, short episodes, 2 steps, videos."""

from __future__ import annotations

import importlib.util
import json

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = [
    pytest.mark.ray,
    pytest.mark.libero,
    pytest.mark.skipif(
        importlib.util.find_spec("libero") is None,
        reason="LIBERO is not installed: run EMBODIED_RL_EXTRAS=dev,libero bash scripts/install.sh",
    ),
]


def test_srpo_libero_two_steps_write_metrics_checkpoint_and_video(tmp_path):
    cfg = compose("srpo_libero", ["trainer.total_steps=2", f"run_dir={tmp_path}"])
    result = launch(cfg, show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["dapo/kept_samples"] == 4  # 2 (task, init state) pairs x 2 rollouts
        assert m["rollout/episode_steps"] > 0
        # A count of the 4 episodes' successes over 4, seen alike by the nodes after the
        # rollout: the binary reward's mean, and SRPO's rate (the filter kept all 4).
        rate = m["rollout/success_rate"]
        assert round(rate * 4) in range(5) and rate == pytest.approx(round(rate * 4) / 4), rate
        assert m["reward/mean"] == pytest.approx(rate, abs=1e-9)
        assert m["srpo/success_rate"] == pytest.approx(rate, abs=1e-9)
    # The evaluation's rate is that of the episodes in its results table (a line per task).
    table = [
        json.loads(x) for x in (result.run_dir / "eval" / "results.jsonl").read_text().splitlines()
    ]
    final = [row for row in table if row["step"] == 2]
    assert sum(row["episodes"] for row in final) == 2  # eval.batch_size: one greedy episode each
    successes = sum(row["successes"] for row in final)
    assert lines[-1]["eval/success_rate"] == pytest.approx(successes / 2, abs=1e-9)
    assert (result.run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    videos = list((result.run_dir / "eval" / "step_000002").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 1000 for v in videos)
    assert (result.run_dir / "eval" / "step_000002" / "report.html").exists()
