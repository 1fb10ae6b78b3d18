"""``scripts/bench/srpo_world_model.py``: how it picks the RL tasks, the commands of each method
(the world model only where it belongs, every split's episode count) and the table's numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

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
    args = _args(tmp_path, "--rl-minutes", "12", "--rl-steps", "9", "--world-model-pooling", "end")
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
        assert "trainer.time_limit_min=12.0" in command and "trainer.total_steps=9" in command
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


def test_recorded_runs_stand_in_for_missing_folders_only_from_the_same_start(tmp_path: Path):
    start = {"validation_by_task": {3: 0.2, 7: 0.4}, "test": {"successes": 3, "episodes": 10}}
    runs = [
        {"method": "grpo", "seed": 0, "test": {"rate": 0.8}, "rl_steps": 16},
        {"method": "grpo", "seed": 1, "test": None},  # never evaluated: not reused
    ]
    body = {
        "benchmark": "srpo_world_model",
        "machine": {"commit": "abc1234", "date": "2026-11-26"},
        "tasks": [3, 7],
        "start": {**start, "validation_by_task": {"3": 0.2, "7": 0.4}},  # as JSON keeps it
        "runs": runs,
    }
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(body))
    recorded = swm.recorded_runs(path, [3, 7], start)
    assert set(recorded) == {("grpo", 0)}
    assert recorded[("grpo", 0)]["ran"] == {"commit": "abc1234", "date": "2026-11-26"}
    assert recorded[("grpo", 0)]["reused_from"] == str(path)

    args = _args(tmp_path, "--report", "--runs", str(tmp_path / "runs"))
    assert swm.rl_phase(args, "grpo", 0, [3, 7], recorded)["rl_steps"] == 16
    assert swm.rl_phase(args, "grpo", 1, [3, 7], recorded) is None  # not recorded, not run
    # a folder here wins over the recorded row: it is this machine's run of that seed
    run_dir = tmp_path / "runs" / "tasks_3_7" / "grpo_seed0"
    _write_eval(run_dir, "eval_test_20261127-100000-000001/eval_test", [(9, 3, 2, 5)])
    assert swm.rl_phase(args, "grpo", 0, [3, 7], recorded)["test"]["rate"] == 0.4

    # the start evaluated on the RL tasks only (--tasks) is compared on those tasks
    body["start"]["validation_by_task"] = {"1": 0.0, "3": 0.2, "7": 0.4}
    path.write_text(json.dumps(body))
    assert set(swm.recorded_runs(path, [3, 7], start)) == {("grpo", 0)}
    for differs in ({3: 0.2, 7: 0.6}, {3: 0.2}):  # another rate; an RL task not evaluated
        with pytest.raises(ValueError, match=r"start validation .* vs"):
            swm.recorded_runs(path, [3, 7], {**start, "validation_by_task": differs})

    other_weights = {**start, "weights_sha256": "f" * 64}
    assert swm.recorded_runs(path, [3, 7], other_weights)  # the recorded file has no digest
    body["start"]["weights_sha256"] = "e" * 64
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=r"start weights sha256 eeeeeeeeeeee vs ffffffffffff"):
        swm.recorded_runs(path, [3, 7], other_weights)
    other_start = {**start, "test": {"successes": 4, "episodes": 10}}
    with pytest.raises(ValueError, match=r"start test successes 3 vs 4.*rebuild the SFT start"):
        swm.recorded_runs(path, [3, 7], other_start)
    with pytest.raises(ValueError, match=r"RL tasks \[3, 7\] vs \[2, 7\]"):
        swm.recorded_runs(path, [2, 7], start)
    (tmp_path / "other.json").write_text(json.dumps({**body, "benchmark": "libero_learning"}))
    with pytest.raises(ValueError, match="not a srpo_world_model result"):
        swm.recorded_runs(tmp_path / "other.json", [3, 7], start)
    assert swm.recorded_runs(None, [3, 7], start) == {}


def test_another_policy_runs_apart_under_its_own_name(tmp_path: Path):
    runs = tmp_path / "runs"
    default = _args(tmp_path, "--runs", str(runs))
    flow = _args(tmp_path, "--runs", str(runs), "--policy", "flow_vla_tiny")
    assert "policy=mlp_image" in swm.rl_command(default, "grpo", 0, [5, 9], runs)
    command = swm.rl_command(flow, "grpo", 0, [5, 9], runs)
    assert "policy=flow_vla_tiny" in command and "policy=mlp_image" not in command
    assert "policy=flow_vla_tiny" in swm.eval_command(flow, "sft_libero", runs, None, "validation")
    # the reported mlp_image runs keep their folders; another policy's never mix with them
    assert swm.tasks_folder(default, [5, 9]) == runs / "tasks_5_9"
    assert swm.tasks_folder(flow, [5, 9]) == runs / "flow_vla_tiny" / "tasks_5_9"
    assert swm.result_name("mlp_image") == "srpo_world_model"
    assert swm.result_name("flow_vla_tiny") == "srpo_world_model_flow_vla_tiny"


def test_the_table_of_no_finished_runs_is_its_header(capsys):
    # --report before any run finishes (it failed here with a TypeError once)
    text = swm.common.print_table([], ["method", "seeds"])
    assert text == "| method | seeds |\n|--------|-------|"
    assert swm.common.print_table([{"method": "grpo", "seeds": 3}], ["method", "seeds"]) == (
        "| method | seeds |\n|--------|-------|\n| grpo   | 3     |"
    )


def _checkpoint(run_dir: Path, step: int, weights: dict, optimiser_step: int) -> None:
    from embodied_rl.checkpoint import finalize, write_rank_shard

    state = {"models": {"model/actor": weights, "optim/actor": {"step": optimiser_step}}}
    write_rank_shard(run_dir / "checkpoints", step, 0, state)
    finalize(run_dir / "checkpoints", step, 1)


def test_the_start_digest_is_of_the_weights_alone(tmp_path: Path):
    import torch

    weights = {"w": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.zeros(3)}
    assert swm.weights_sha256(tmp_path / "none") is None
    _checkpoint(tmp_path / "a", 10, weights, optimiser_step=10)
    _checkpoint(tmp_path / "b", 99, dict(weights), optimiser_step=3)  # other step, optimiser
    assert swm.weights_sha256(tmp_path / "a") == swm.weights_sha256(tmp_path / "b")
    changed = {**weights, "b": torch.tensor([0.0, 0.0, 1e-7])}
    _checkpoint(tmp_path / "c", 10, changed, optimiser_step=10)
    assert swm.weights_sha256(tmp_path / "c") != swm.weights_sha256(tmp_path / "a")
    # the newest checkpoint is the start: a later one with other weights changes the digest
    _checkpoint(tmp_path / "a", 20, changed, optimiser_step=20)
    assert swm.weights_sha256(tmp_path / "a") == swm.weights_sha256(tmp_path / "c")


def test_a_missing_recorded_file_is_refused_before_anything_runs(tmp_path: Path):
    runs = tmp_path / "runs"
    argv = ["--sft", str(tmp_path / "sft"), "--world-model", str(tmp_path / "wm")]
    argv += ["--runs", str(runs), "--recorded", str(tmp_path / "nope.json")]
    with pytest.raises(SystemExit, match=r"error: --recorded .*nope.json: no such file. Fix:"):
        swm.main(argv)
    assert not runs.exists()


def test_the_world_model_is_needed_only_by_its_method(tmp_path: Path):
    runs = tmp_path / "runs"
    argv = ["--sft", str(tmp_path / "sft"), "--runs", str(runs)]
    with pytest.raises(SystemExit, match=r"srpo_world_model method needs --world-model.*Fix:"):
        swm.main(argv)  # all three methods by default
    assert not runs.exists()
    args = swm.parse_args([*argv, "--methods", "grpo", "srpo_pooled_pixels"])
    assert args.world_model is None
    assert not any("video_encoder" in p for p in swm.rl_command(args, "grpo", 0, [0], runs))


def test_step_costs_by_hand():
    metrics = [
        {"time/step": 60.0, "memory/worker_rss_mb": 900.0, "rollout/success_rate": 0.25},
        {"time/step": 70.0, "memory/worker_rss_mb": 1500.0, "rollout/success_rate": 0.5},
        {"time/step": 200.0, "memory/worker_rss_mb": 1200.0, "rollout/success_rate": 0.5},
        {"time/step": 65.0, "memory/worker_rss_mb": 1000.0, "rollout/success_rate": 0.75},
    ]
    assert swm.step_costs(metrics) == {
        "seconds_per_step": 67.5,  # the median: a step with an evaluation in it does not count
        "peak_worker_rss_mb": 1500.0,
        "train_rollout_success_first": 0.25,
        "train_rollout_success_last3": pytest.approx((0.5 + 0.5 + 0.75) / 3),
    }
    assert swm.step_costs([]) == {}


def test_a_run_cut_short_resumes_and_a_fresh_or_empty_one_starts_over(tmp_path: Path):
    import torch

    command = ["-m", "embodied_rl.cli", "train", "run_dir=x"]
    empty = tmp_path / "empty"
    (empty / "eval").mkdir(parents=True)  # an attempt that died before its first checkpoint
    assert swm.training_attempt(command, empty, fresh=False) == command
    assert not empty.exists()
    cut = tmp_path / "cut"
    _checkpoint(cut, 5, {"w": torch.zeros(2)}, optimiser_step=5)
    assert swm.training_attempt(command, cut, fresh=False) == [*command, "resume=true"]
    assert (cut / "checkpoints").is_dir()  # kept: the resumed run continues from it
    assert swm.training_attempt(command, cut, fresh=True) == command
    assert not cut.exists()


def test_no_methods_is_the_start_alone(tmp_path: Path):
    args = _args(tmp_path, "--methods", "--seeds", "0")
    assert args.methods == [] and args.seeds == [0]


def _recording(run_dir: Path, start: Path, episodes: list[tuple[int, int, bool]]) -> Path:
    """A record_libero run folder of ``(task, init state, success)`` episodes from ``start``."""
    import numpy as np

    from embodied_rl.data.episode_videos import EpisodeVideo, write_episode_videos

    (run_dir / "episodes" / "step_000000").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"models:\n  actor:\n    init_from: {start}\n")
    frames = np.zeros((2, 8, 8, 3), np.uint8)
    videos = [EpisodeVideo(frames, f"task {t}", ok, t, i) for t, i, ok in episodes]
    write_episode_videos(run_dir / "episodes" / "step_000000" / "rank_0.hdf5", videos)
    return run_dir


def test_sampled_validation_success_chooses_the_tasks(tmp_path: Path):
    sft = tmp_path / "sft"
    # task 0: 3/4, task 1: 1/4, task 2: 0/4, task 3: 2/4 (validation init states 4, 14, ...)
    outcomes = {0: [1, 1, 1, 0], 1: [0, 1, 0, 0], 2: [0, 0, 0, 0], 3: [1, 0, 1, 0]}
    episodes = [
        (task, [4, 14, 24, 34][k], bool(ok))
        for task, oks in outcomes.items()
        for k, ok in enumerate(oks)
    ]
    recording = _recording(tmp_path / "record", sft, episodes)
    rates = swm.sampled_validation(recording, sft)
    assert rates == {0: 0.75, 1: 0.25, 2: 0.0, 3: 0.5}
    assert swm.lowest_solved(rates, 2) == [1, 3]  # task 2 never succeeds: no signal
    # task 1 solved greedily on every validation state: the greedy test could not show a gain
    greedy = {0: 0.4, 1: 1.0, 2: 0.0, 3: 0.8}
    assert swm.lowest_solved(swm.with_headroom(rates, greedy), 2) == [3, 0]


def test_sampled_validation_of_another_split_or_start_is_refused(tmp_path: Path):
    sft = tmp_path / "sft"
    test_state = _recording(tmp_path / "a", sft, [(0, 4, True), (0, 9, False)])
    with pytest.raises(ValueError, match="init state 9, in the test split"):
        swm.sampled_validation(test_state, sft)
    other = _recording(tmp_path / "b", tmp_path / "other_sft", [(0, 4, True)])
    with pytest.raises(ValueError, match="started from .*other_sft, not --sft"):
        swm.sampled_validation(other, sft)
    with pytest.raises(SystemExit, match="error: .*test split"):
        swm.main(["--sft", str(sft), "--methods", "--sampled-validation", str(test_state)])


def test_a_phase_cut_short_is_not_trained_and_resumes_without_its_stale_evaluations(
    tmp_path: Path,
):
    """The bug this guards: a benchmark that took any checkpoint for a finished SFT went on
    to evaluate the weights of step 204 of 2000 after a SIGTERM."""
    import sys

    import torch

    run_dir, argv_file = tmp_path / "sft", tmp_path / "argv.json"
    (run_dir / "eval_test_20261203-195346-494650").mkdir(parents=True)  # of the cut-short run
    (run_dir / "config.yaml").write_text("trainer:\n  total_steps: 9\n")
    _checkpoint(run_dir, 5, {"w": torch.zeros(2)}, optimiser_step=5)
    assert swm.has_checkpoint(run_dir) and not swm.trained(run_dir)
    write_argv = f"import json, sys; json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))"
    command = [sys.executable, "-c", write_argv, "run_dir=x"]
    swm.train_to_the_end(command, run_dir, tmp_path / "sft.log", fresh=False)
    assert json.loads(argv_file.read_text()) == ["run_dir=x", "resume=true"]
    assert not list(run_dir.glob("eval_test_*")) and (run_dir / "checkpoints").is_dir()

    argv_file.unlink()
    _checkpoint(run_dir, 9, {"w": torch.zeros(2)}, optimiser_step=9)
    assert swm.trained(run_dir)
    swm.train_to_the_end(command, run_dir, tmp_path / "sft.log", fresh=False)
    assert not argv_file.exists()  # trained: not run again
    swm.train_to_the_end(command, run_dir, tmp_path / "sft.log", fresh=True)
    assert json.loads(argv_file.read_text()) == ["run_dir=x"] and not run_dir.exists()
