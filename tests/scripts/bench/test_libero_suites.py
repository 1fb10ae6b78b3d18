"""scripts/bench/libero_suites.py: which tasks get demos, the per-suite commands, the
per-task results and the table (no training runs)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.scripts.bench.test_world_model_latents import _import_bench

suites = _import_bench("libero_suites")


def _write(path: Path, rows: list[tuple[int, int, int, int]]) -> None:
    """``rows``: (step, task, successes, episodes) of an evaluation's results.jsonl."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"step": s, "task": t, "successes": k, "episodes": n}) for s, t, k, n in rows
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_the_planner_handles_every_task_of_the_four_suites_and_says_why_not_elsewhere():
    for suite in ("libero_object", "libero_spatial", "libero_goal", "libero_10"):
        assert suites.planner_tasks(suite) == (list(range(10)), {})
    handled, unsupported = suites.planner_tasks("libero_90")
    assert list(unsupported) == [35, 39] and "(open microwave_1)" in unsupported[35]
    assert len(handled) == 88


def test_srpo_runs_only_on_the_rl_suites_with_the_suites_episode_length(tmp_path: Path):
    args = suites.parse_args(["--rl-suites", "libero_goal", "--runs", str(tmp_path)])
    goal = suites.srpo_argv(args, "libero_goal", tmp_path / "sft")
    spatial = suites.srpo_argv(args, "libero_spatial", tmp_path / "sft")
    assert goal[goal.index("--methods") + 1] == suites.METHOD
    assert spatial[spatial.index("--methods") + 1] == "--seeds"  # no method: the start alone
    assert goal[goal.index("--max-steps") + 1] == "300"
    assert spatial[spatial.index("--tasks") + 1 : spatial.index("--methods")] == list("0123456789")
    parsed = suites.srpo_world_model.parse_args(spatial)
    assert parsed.methods == [] and parsed.tasks == list(range(10))
    # every suite's episodes fit within LIBERO's own limit for the suite
    assert all(steps <= {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
                         "libero_10": 520}[s] for s, steps in suites.MAX_STEPS.items())  # fmt: skip


def test_per_task_results_are_the_newest_evaluations_newest_step(tmp_path: Path):
    run_dir = tmp_path / "run"
    _write(run_dir / "eval_test_20261128-100000-000001" / "eval_test" / "results.jsonl",
           [(0, 0, 1, 5)])  # fmt: skip
    _write(run_dir / "eval_test_20261128-110000-000001" / "eval_test" / "results.jsonl",
           [(10, 0, 2, 5), (10, 1, 0, 5), (20, 0, 4, 5), (20, 1, 3, 5)])  # fmt: skip
    found = suites.per_task(suites.evaluation_file(run_dir, "eval_test"))
    assert found == {0: {"successes": 4, "episodes": 5}, 1: {"successes": 3, "episodes": 5}}
    assert suites.per_task(suites.evaluation_file(tmp_path / "none", "eval_test")) == {}


def test_the_table_says_which_cells_are_missing():
    rows = [
        {"suite": "libero_object", "sft_test": {"successes": 29, "episodes": 50},
         "srpo_test": {"successes": 45, "episodes": 50}, "rl_minutes": 120.5, "rl_episodes": 2880},
        {"suite": "libero_10", "sft_test": None, "srpo_test": None, "rl_minutes": None,
         "rl_episodes": None},
    ]  # fmt: skip
    table = suites.table(rows)
    assert table[0]["one-demo SFT"] == "58% (29/50)" and table[0]["SFT + SRPO"] == "90% (45/50)"
    assert table[1]["one-demo SFT"] == "-" and table[1]["SFT + SRPO"] == "not run"
    assert table[1]["RL wall min"] == "-"


def test_rows_of_suites_not_run_here_are_kept_from_an_earlier_json(tmp_path: Path):
    def row(suite: str, successes: int) -> dict:
        return {"suite": suite, "sft_test": {"successes": successes, "episodes": 50}}

    earlier = tmp_path / "libero_suites.json"
    machine, args = {"commit": "abc1234"}, {"suites": "all"}
    body = {"benchmark": "libero_suites", "machine": machine, "args": args,
            "suites": [row(s, 7) for s in suites.SUITES]}  # fmt: skip
    earlier.write_text(json.dumps(body))
    rows = suites.kept_rows([row("libero_goal", 6)], suites.read_earlier(earlier))
    assert [r["suite"] for r in rows] == list(suites.SUITES)
    goal = rows[suites.SUITES.index("libero_goal")]
    assert goal["sft_test"]["successes"] == 6 and "kept_from" not in goal  # run here
    spatial = rows[0]
    assert spatial["sft_test"]["successes"] == 7
    assert spatial["kept_from"] == {"json": str(earlier), "machine": machine, "args": args}
    # a row kept twice keeps its first source
    body["suites"][0]["kept_from"] = {"json": "older.json"}
    earlier.write_text(json.dumps(body))
    kept = suites.kept_rows([], suites.read_earlier(earlier))
    assert kept[0]["kept_from"] == {"json": "older.json"}
    assert suites.kept_rows([row("libero_10", 0)], None) == [row("libero_10", 0)]
    # a missing file or another benchmark's JSON: one error line naming the fix, no rows
    for bad in (tmp_path / "missing.json", tmp_path / "other.json"):
        if bad.name == "other.json":
            bad.write_text(json.dumps({"benchmark": "something_else"}))
        with pytest.raises(SystemExit, match=r"^error: --keep-from .* Fix: give the JSON"):
            suites.read_earlier(bad)
