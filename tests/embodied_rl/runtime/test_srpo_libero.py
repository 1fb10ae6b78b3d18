"""SRPO on LIBERO in CI: 2 workers, tiny OpenVLA-OFT, short episodes, 2 steps, videos.

The policy reads two images per step, agentview and wrist (``num_images_in_input: 2``, the OFT
LIBERO fine-tunes' layout): the wrist images go from the rollouts through the databuffer to the
updates and the evaluation (the one-camera default shares every step of the path but that one).

The run is ``embodied-rl train`` in a process of its own, so it also checks a LIBERO run's
console: its step lines and results only, none of robosuite's, LIBERO's or transformers'
notices (tests/embodied_rl/runtime/test_console.py checks the console of the reach task).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.embodied_rl.runtime.run_helpers import assert_only_run_lines, run_cli_train

pytestmark = [
    pytest.mark.ray,
    pytest.mark.libero,
    pytest.mark.skipif(
        importlib.util.find_spec("libero") is None,
        reason="LIBERO is not installed: run EMBODIED_RL_EXTRAS=dev,libero bash scripts/install.sh",
    ),
]


def test_srpo_libero_two_steps_write_metrics_checkpoint_and_video(tmp_path):
    run_dir = tmp_path / "run"
    two_cameras = [
        "++models.actor.options.num_images_in_input=2",
        "simulator.options.cameras=[agentview,wrist]",
    ]
    code, out, err = run_cli_train(
        "srpo_libero", "trainer.total_steps=2", *two_cameras, f"run_dir={run_dir}"
    )
    assert code == 0, err
    assert_only_run_lines(out, err, steps=2)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert m["dapo/kept_samples"] == 4  # 2 (task, init state) pairs x 2 rollouts
        assert m["rollout/episode_steps"] > 0
        assert m["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # act and update agree
        # A count of the 4 episodes' successes over 4, seen alike by the nodes after the
        # rollout: the binary reward's mean, and SRPO's rate (the filter kept all 4).
        rate = m["rollout/success_rate"]
        assert round(rate * 4) in range(5) and rate == pytest.approx(round(rate * 4) / 4), rate
        assert m["reward/mean"] == pytest.approx(rate, abs=1e-9)
        assert m["srpo/success_rate"] == pytest.approx(rate, abs=1e-9)
        # The BDDL goal's privileged progress: 1 for each success, below it for the others.
        assert rate <= m["rollout/privileged_progress"] <= 1.0
    # The evaluation's rate is that of the episodes in its results table (a line per task).
    table = [json.loads(x) for x in (run_dir / "eval" / "results.jsonl").read_text().splitlines()]
    final = [row for row in table if row["step"] == 2]
    assert sum(row["episodes"] for row in final) == 2  # eval.batch_size: one greedy episode each
    successes = sum(row["successes"] for row in final)
    assert lines[-1]["eval/success_rate"] == pytest.approx(successes / 2, abs=1e-9)
    assert (run_dir / "checkpoints" / "step_000002" / "manifest.json").exists()
    videos = list((run_dir / "eval" / "step_000002").glob("*.mp4"))
    assert videos and all(v.stat().st_size > 1000 for v in videos)
    assert (run_dir / "eval" / "step_000002" / "report.html").exists()
