"""SRPO end to end on the fast MuJoCo task: 2 workers, the MLP policy, evaluation videos."""

from __future__ import annotations

import json
import math

import pytest

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = pytest.mark.ray


def test_srpo_trains_checkpoints_and_evaluates_with_videos(tmp_path):
    overrides = [
        "trainer.total_steps=2",
        "trainer.checkpoint_every=2",
        "data.batch_size=4",
        "rollout.group_size=4",
        "rollout.num_envs=8",
        "eval.every=0",
        "eval.at_end=true",
        "eval.at_start=true",
        "eval.batch_size=4",
        "eval.max_videos=2",
        "eval.video_size=64",  # the videos are checked to exist and to be non-empty only
        "+simulator.options.max_steps=25",  # half an episode: no assertion needs a long one
        f"run_dir={tmp_path}",
    ]
    result = launch(compose("srpo_reach", overrides), show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["dapo/kept_samples"] == 16  # 4 (task, init state) pairs x 4 rollouts
        assert 0.0 <= m["rollout/success_rate"] <= 1.0
        assert m["srpo/success_rate"] == pytest.approx(m["rollout/success_rate"])
        # Privileged progress: 1 for each success, in [0, 1) for the other episodes.
        assert m["rollout/success_rate"] <= m["rollout/privileged_progress"] <= 1.0
    assert "eval/success_rate" in lines[-1]  # evaluated after the last step
    # ... and before the first (eval.at_start): the starting policy, in step 0's row.
    assert "eval/success_rate" in lines[0]
    for m in (lines[0], lines[-1]):  # the evaluations' episodes are logged apart
        assert m["eval/rollout/success_rate"] == pytest.approx(m["eval/success_rate"])
        assert "time/eval/rollout/simulate" in m and "eval/data/epoch" in m
    results = (result.run_dir / "eval" / "results.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in results] == [0, 2]
    for row in map(json.loads, results):  # each task's mean privileged progress
        assert row["success_rate"] <= row["privileged_progress"] <= 1.0
    assert (result.run_dir / "eval" / "step_000000" / "report.html").exists()
    assert (result.run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    videos = sorted((result.run_dir / "eval" / "step_000002").glob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos)
    html = (result.run_dir / "eval" / "step_000002" / "report.html").read_text()
    assert all(v.name in html for v in videos)
    # The eval command evaluates the newest checkpoint of the run again, each held-out pair
    # of task 0 once, into a folder of its own.
    args = ["eval", "--config-name", "srpo_reach", "--no-progress", *overrides, "data.tasks=[0]"]
    assert main([*args, "eval.batch_size=10"]) == 0
    (own,) = result.run_dir.glob("eval_2*")
    assert (own / "metrics.jsonl").exists() and (own / "eval" / "results.jsonl").exists()
    # ... and on another split than the run's (its loader position is not carried over).
    assert main([*args, "eval.batch_size=50", "eval.split=all", "eval.name=eval_all"]) == 0
    (own,) = result.run_dir.glob("eval_all_2*")
    assert (own / "eval_all" / "step_000002" / "report.html").exists()
    # 5 validation pairs over the 2 workers: padded to 6, and the repeat is not an episode.
    name = "eval_validation"
    assert main([*args, "eval.batch_size=5", "eval.split=validation", f"eval.name={name}"]) == 0
    (own,) = result.run_dir.glob(f"{name}_2*")
    rows = [json.loads(x) for x in (own / name / "results.jsonl").read_text().splitlines()]
    assert [(r["task"], r["episodes"]) for r in rows] == [(0, 5)]
    metrics = json.loads((own / "metrics.jsonl").read_text().splitlines()[-1])
    assert metrics[f"{name}/success_rate"] == pytest.approx(rows[0]["successes"] / 5)


def test_the_oracle_dag_shapes_failures_by_privileged_progress(tmp_path):
    """``dag=srpo_oracle`` end to end: the rollout's privileged progress reaches the oracle
    reward node, no video encoder runs, and the rewards lie in SRPO's range (the shaping
    itself is checked by hand in tests/embodied_rl/algorithms/test_srpo.py)."""
    overrides = [
        "dag=srpo_oracle",
        "trainer.total_steps=2",
        "trainer.checkpoint_every=0",
        "data.batch_size=4",
        "rollout.group_size=4",
        "rollout.num_envs=8",
        "rollout.keep_frames=false",  # the oracle needs no frames
        "eval.every=0",
        "eval.at_end=false",
        "+simulator.options.max_steps=25",
        f"run_dir={tmp_path}",
    ]
    result = launch(compose("srpo_reach", overrides), show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["srpo/success_rate"] == pytest.approx(m["rollout/success_rate"])
        assert m["rollout/success_rate"] <= m["rollout/privileged_progress"] <= 1.0
        # Shaped failures lie in SRPO's reference range; those of a task without a success
        # (no reference) get 0.
        low = 0.6 / (1 + math.exp(5)) if m["srpo/tasks_without_reference"] == 0 else 0.0
        assert low <= m["srpo/failure_reward_mean"] <= 0.6 / (1 + math.exp(-5))
        assert "time/encode" not in m  # no encoder ran
