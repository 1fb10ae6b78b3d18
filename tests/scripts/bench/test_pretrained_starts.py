"""scripts/bench/pretrained_starts.py: the two starts' commands differ only where they should,
each phase's episode count, and the table (no training runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts.bench.test_world_model_latents import _import_bench

starts = _import_bench("pretrained_starts")


def _value(command: list[str], key: str) -> str:
    (found,) = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{key}=")]
    return found


def test_the_starts_share_one_sft_command_but_the_pretrained_checkpoint(tmp_path: Path):
    args = starts.parse_args(["--pretrained", str(tmp_path / "pre"), "--runs", str(tmp_path)])
    demos = [tmp_path / "demos"]
    scratch = starts.sft_command(args, "libero_goal", "scratch", demos, tmp_path / "a")
    pretrained = starts.sft_command(args, "libero_goal", "pretrained", demos, tmp_path / "a")
    added = [arg for arg in pretrained if arg not in scratch]
    assert added == [f"models.actor.init_from={tmp_path / 'pre'}", "data.statistics=checkpoint"]
    assert [arg for arg in scratch if arg not in pretrained] == []
    assert _value(scratch, "simulator.options.max_steps") == "300"  # libero_goal's episodes
    assert _value(scratch, "data.max_demos_per_task") == "1"
    assert _value(scratch, "policy") == "openvla_oft_libero"


def test_the_test_split_is_every_task_times_its_five_test_states_once(tmp_path: Path):
    args = starts.parse_args(["--pretrained", str(tmp_path / "pre"), "--temperature", "0.1"])
    test = starts.test_command(args, "libero_10", "pretrained", tmp_path / "sft")
    assert _value(test, "eval.split") == "test" and _value(test, "eval.batch_size") == "50"
    # an evaluation refuses a run whose models differ from its config: the start's overrides
    assert f"models.actor.init_from={tmp_path / 'pre'}" in test
    sampled = starts.sampled_command(args, "libero_10", tmp_path / "sft", tmp_path / "rec")
    assert _value(sampled, "data.split") == "train"  # RL's states, never the held-out ones
    assert (
        int(_value(sampled, "data.batch_size")) * int(_value(sampled, "rollout.group_size")) == 40
    )
    assert _value(sampled, "rollout.temperature") == "0.1"
    assert _value(sampled, "models.actor.init_from") == str(tmp_path / "sft")


def test_the_table_marks_cells_not_run():
    rows = [
        {
            "suite": "libero_object",
            "scratch": {"test": {"successes": 7, "episodes": 50}, "sampled_train": None},
            "pretrained": {
                "test": {"successes": 21, "episodes": 50},
                "sampled_train": {"successes": 10, "episodes": 40},
            },
        },
        {"suite": "libero_10", "scratch": {"test": None, "sampled_train": None}},
    ]
    table = starts.table(rows)
    assert table[0]["SFT scratch (test)"] == "14% (7/50)"
    assert table[0]["SFT pretrained (test)"] == "42% (21/50)"
    assert table[0]["sampled train, pretrained"] == "25% (10/40)"
    assert table[0]["sampled train, scratch"] == "-"
    assert table[1]["SFT pretrained (test)"] == "not run"


def test_an_earlier_json_of_another_policy_is_refused(tmp_path: Path):
    earlier = tmp_path / "earlier.json"
    body = {"benchmark": "pretrained_starts_openvla_libero", "machine": {}, "args": {}}
    earlier.write_text(json.dumps({**body, "suites": []}))
    with pytest.raises(SystemExit, match="not a pretrained_starts_openvla_oft_libero.json"):
        starts.read_earlier(earlier, starts.result_name("openvla_oft_libero"))
    kept = starts.read_earlier(earlier, starts.result_name("openvla_libero"))
    assert kept["suites"] == [] and kept["source"]["json"] == str(earlier)


def test_each_policy_runs_in_its_own_folder(tmp_path: Path):
    """A finished SFT of one policy is never taken for another's (the phases resume from
    what the folder holds)."""
    oft = starts.parse_args(["--pretrained", str(tmp_path)])
    tokens = starts.parse_args(["--pretrained", str(tmp_path), "--policy", "openvla_libero"])
    assert oft.runs == Path("outputs") / "pretrained_starts_openvla_oft_libero"
    assert tokens.runs == Path("outputs") / "pretrained_starts_openvla_libero"
    chosen = starts.parse_args(["--pretrained", str(tmp_path), "--runs", str(tmp_path / "r")])
    assert chosen.runs == tmp_path / "r"
