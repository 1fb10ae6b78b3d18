"""Learning test: SRPO with the MLP policy lifts reach success to >= 0.8 (2 workers, CPU)."""

from __future__ import annotations

import json

import pytest

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_srpo_reach_success_reaches_point_eight(tmp_path):
    cfg = compose("srpo_reach", [f"run_dir={tmp_path}", "eval.every=0", "eval.at_end=true"])
    result = launch(cfg, show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    initial = sum(m["rollout/success_rate"] for m in lines[:3]) / 3
    # Greedy evaluation on all 40 held-out (task, init state) pairs after training.
    final = lines[-1]["eval/success_rate"]
    # Measured (seed 0): 0.024 over the first 3 steps; 1.0 on all 40 held-out pairs.
    assert initial < 0.2, initial
    assert final >= 0.8, (initial, final)
