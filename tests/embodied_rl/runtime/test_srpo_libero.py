"""SRPO on LIBERO in CI: 2 workers, tiny OpenVLA-OFT, short episodes, 2 steps, videos."""

from __future__ import annotations

import importlib.util
import json

import pytest

from embodied_rl.runtime.config import compose
from embodied_rl.runtime.launcher import launch

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
        assert 0.0 <= m["rollout/success_rate"] <= 1.0
    assert "eval/success_rate" in lines[-1]
    assert (result.run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    videos = list((result.run_dir / "eval" / "step_000002").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 1000 for v in videos)
    assert (result.run_dir / "eval" / "step_000002" / "report.html").exists()
