"""``scripts/bench/srpo_world_model.py``: how it picks the RL tasks, the commands of each method
(the world model only where it belongs, every split's episode count) and the table's numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.scripts.bench.test_world_model_latents import _import_bench

swm = _import_bench("srpo_world_model")


def _args(tmp_path: Path, *extra: str):
    return swm.parse_args(
        ["--sft", str(tmp_path / "sft"), "--world-model", str(tmp_path / "wm"), *extra]
    )


def _write_eval(run_dir: Path, folder: str, rows: list[tuple[int, int, int, int]]) -> None:
    """``rows``: (step, task, successes, episodes) of an evaluation's results.jsonl."""
    path = run_dir / folder / "results.jsonl"
    path.parent.mkdir(parents=True)
    lines = [
        json.dumps({"step": s, "task": t, "successes": k, "episodes": n}) for s, t, k, n in rows
    ]
    path.write_text("\n".join(lines) + "\n")


def test_weakest_tasks_from_the_newest_validation_eval(tmp_path: Path):
    sft = tmp_path / "sft"
    # an older standalone evaluation that must be ignored
    _write_eval(sft, "eval_validation_20261127-080000-000001/eval_validation", [(0, 0, 0, 5)])
    newest = [(0, 0, 4, 5), (0, 1, 1, 5), (0, 2, 1, 5), (0, 3, 0, 5), (0, 4, 5, 5), (0, 5, 2, 5)]
    _write_eval(sft, "eval_validation_20261127-090000-000001/eval_validation", newest)
    tasks, rates = swm.weakest_tasks(sft, 2)
    assert tasks == [1, 2]  # the two 1/5 tasks; task 3 (0/5) gives RL no signal
    assert rates == {0: 0.8, 1: 0.2, 2: 0.2, 3: 0.0, 4: 1.0, 5: 0.4}
    assert swm.weakest_tasks(sft, 3)[0] == [1, 2, 5]


def test_methods_commands(tmp_path: Path):
    args = _args(tmp_path, "--rl-minutes", "12", "--world-model-pooling", "end")
    run_dir = tmp_path / "runs" / "x"
    commands = {m: swm.rl_command(args, m, 1, [3, 7], run_dir) for m in swm.METHODS}
    encoder_entry = "models.video_encoder.policy=video_encoder.vjepa2"
    assert encoder_entry in commands["srpo_world_model"]
    world_model = f"+models.video_encoder.options.path={(tmp_path / 'wm').resolve()}"
    assert world_model in commands["srpo_world_model"]
    assert "+models.video_encoder.options.pooling=end" in commands["srpo_world_model"]
    for method in ("srpo_pooled_pixels", "grpo"):
        assert not any("video_encoder" in part for part in commands[method])
        assert swm.encoder_overrides(args, method) == []
    # the run's evaluation carries the same encoder (an evaluation refuses other models)
    overrides = swm.encoder_overrides(args, "srpo_world_model")
    assert set(overrides) <= set(commands["srpo_world_model"]) and len(overrides) == 6
    test_wm = swm.eval_command(args, "srpo_libero", run_dir, [3, 7], "test", overrides)
    assert set(overrides) <= set(test_wm)
    assert commands["grpo"][commands["grpo"].index("--config-name") + 1] == "grpo_libero"
    for command in commands.values():
        # the same start, tasks, seed, budget and validation split for every method
        assert f"models.actor.init_from={(tmp_path / 'sft').resolve()}" in command
        assert "data.tasks=[3,7]" in command and "seed=1" in command
        assert "trainer.time_limit_min=12.0" in command
        # held out every 5th state: validation 4, 14, ..., 44 -> 5 per task, 2 tasks
        assert "eval.split=validation" in command and "eval.batch_size=10" in command
    test = swm.eval_command(args, "srpo_libero", run_dir, [3, 7], "test")
    assert "eval.split=test" in test and "eval.batch_size=10" in test
    assert "eval.name=eval_test" in test and "data.tasks=[3,7]" in test
    every_task = swm.eval_command(args, "sft_libero", run_dir, None, "validation")
    assert "eval.batch_size=50" in every_task
    assert not any(part.startswith("data.tasks") for part in every_task)


def test_summary_mean_and_sample_spread():
    def row(method: str, seed: int, successes: int) -> dict:
        return {
            "method": method,
            "seed": seed,
            "test": {"rate": successes / 10},
            "rl_steps": 10 + seed,
        }

    rows = [row("grpo", s, k) for s, k in enumerate((2, 4, 9))]
    rows += [row("srpo_world_model", 0, 5), {"method": "srpo_pooled_pixels", "test": None}]
    table = {r["method"]: r for r in swm.summarise(rows)}
    assert set(table) == {"grpo", "srpo_world_model"}  # a run without a test is not counted
    grpo = table["grpo"]
    assert grpo["seeds"] == 3 and math.isclose(grpo["test_mean"], 0.5)
    # sample std of (0.2, 0.4, 0.9): sqrt(((-.3)^2 + (-.1)^2 + .4^2) / 2) = sqrt(0.13)
    assert math.isclose(grpo["test_std"], math.sqrt(0.13))
    assert grpo["per_seed"] == "20 40 90" and grpo["rl_steps"] == 11
    assert table["srpo_world_model"]["seeds"] == 1
    assert math.isnan(table["srpo_world_model"]["test_std"])


def test_report_runs_nothing_and_skips_unfinished_runs(tmp_path: Path):
    args = _args(tmp_path, "--report", "--runs", str(tmp_path / "runs"))
    unfinished = swm.rl_phase(args, "grpo", 2, [3, 7])  # no test evaluation: not run
    assert unfinished is None and not (tmp_path / "runs" / "tasks_3_7" / "logs").exists()
    run_dir = tmp_path / "runs" / "tasks_3_7" / "grpo_seed0"
    _write_eval(run_dir, "eval", [(5, 3, 3, 5), (5, 7, 2, 5)])
    _write_eval(
        run_dir, "eval_test_20261127-100000-000001/eval_test", [(10, 3, 4, 5), (10, 7, 3, 5)]
    )
    metrics = [{"step": 0, "time/elapsed_s": 60.0}, {"step": 1, "time/elapsed_s": 120.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    row = swm.rl_phase(args, "grpo", 0, [3, 7])  # no bench_trained.json: still not rerun
    assert row["test"]["rate"] == 0.7 and row["curve"] == [{"step": 5, "rate": 0.5}]
    assert row["rl_steps"] == 2 and row["rl_minutes"] == 2.0
    assert not (run_dir.parent / "logs").exists()
