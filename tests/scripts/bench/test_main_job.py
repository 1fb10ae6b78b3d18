"""scripts/bench/main_job.py: what it reads from a finished run folder, and its resume rule.

The run itself (``embodied-rl train --config-name srpo_oft_libero``, 7-10 minutes) is the
benchmark; here the folder is written by hand in the layout the run writes
(``metrics.jsonl``, ``eval/results.jsonl`` with a line per step and task), so every number
the script reports is checked against a hand count.
"""

from __future__ import annotations

import json
import sys

from tests.scripts.bench.test_world_model_latents import _import_bench

main_job = _import_bench("main_job")


def _write_run(run_dir) -> None:
    rows = [
        {"step": 0, "rollout/success_rate": 0.25, "time/step": 61.0},
        {"step": 0, "eval/success_rate": 0.2},  # the evaluation's own row has no rollouts
        {"step": 1, "rollout/success_rate": 0.5, "time/step": 55.5},
    ]
    (run_dir / "eval").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = [  # two tasks at step 0 (before RL), one at step 2 (after)
        {"step": 0, "task": 0, "episodes": 6, "successes": 1},
        {"step": 0, "task": 1, "episodes": 4, "successes": 1},
        {"step": 2, "task": 0, "episodes": 10, "successes": 5},
    ]
    (run_dir / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))


def test_a_runs_numbers_are_read_from_its_folder(tmp_path):
    _write_run(tmp_path)
    result = main_job.run_result(tmp_path, ["cmd"], 3, 450.0)
    assert result["rollout_success"] == [0.25, 0.5]
    assert result["step_s"] == [61.0, 55.5]
    assert result["held_out_before"] == {"successes": 2, "episodes": 10}  # summed over tasks
    assert result["held_out_after"] == {"successes": 5, "episodes": 10}
    assert result["held_out_steps"] == [0, 2] and result["wall_min"] == 7.5
    row = main_job.table_row(result)
    assert row["seed"] == 3 and row["s/step"] == "56-61"
    assert row["rollouts first -> last"] == "0.25 -> 0.50"
    assert row["held-out before -> after"] == "2/10 -> 5/10"
    # two steps only: both are the first and the last three; held-out 0.2 -> 0.5
    verdict = main_job.learning(result)
    assert verdict["rise"] == 0.0 and abs(verdict["held_out_gain"] - 0.3) < 1e-12
    assert not verdict["learns"]


def test_a_run_learns_when_its_last_three_steps_rise_and_held_out_success_gains():
    def run(rollouts, before, after):
        return {"rollout_success": rollouts, "held_out_before": {"successes": before, "episodes": 10},
                "held_out_after": {"successes": after, "episodes": 10}}  # fmt: skip

    rising = run([0.25, 0.25, 0.375, 0.5, 0.5, 0.5625], 2, 4)
    verdict = main_job.learning(rising)  # (0.5 + 0.5 + 0.5625 - 0.875) / 3 = 0.2292
    assert abs(verdict["rise"] - 0.6875 / 3) < 1e-12 and verdict["learns"]
    assert abs(verdict["held_out_gain"] - 0.2) < 1e-12
    assert not main_job.learning(run([0.25, 0.25, 0.375, 0.5, 0.5, 0.5625], 4, 4))["learns"]
    # a rise of 0.125 < 0.15 with a held-out gain does not count
    assert not main_job.learning(run([0.25, 0.25, 0.25, 0.375, 0.375, 0.375], 2, 5))["learns"]
    row = {**rising, "seed": 1, "wall_min": 9.0, "step_s": [60.0], "learning": verdict}
    assert main_job.table_row(row)["rise (last 3 - first 3)"] == "+0.23"


def test_a_finished_run_is_reused_only_for_the_same_command(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = [sys.executable, "-c", "pass"]
    (run_dir / main_job.WALL_FILE).write_text(json.dumps({"command": command, "wall_s": 123.0}))
    assert main_job.timed_run(run_dir, command, fresh=False) == 123.0  # not rerun
    other = [sys.executable, "-c", "import sys"]
    wall_s = main_job.timed_run(run_dir, other, fresh=False)  # another command: rerun
    assert (
        wall_s < 60 and json.loads((run_dir / main_job.WALL_FILE).read_text())["command"] == other
    )
    assert main_job.train_command(run_dir, None)[-1] == f"run_dir={run_dir}"
    # Each --name has run folders of its own unless --runs says otherwise.
    assert main_job.parse_args(["--name", "half"]).runs == main_job.Path("outputs/bench_half")
    assert main_job.parse_args(["--runs", str(run_dir)]).runs == run_dir
    variant = main_job.train_command(run_dir, 2, ["data.batch_size=4"])
    assert variant[-3:] == [f"run_dir={run_dir}", "data.batch_size=4", "seed=2"]
    assert main_job.train_command(run_dir, 2)[-2:] == [f"run_dir={run_dir}", "seed=2"]
