"""``scripts/bench/world_model_pretraining.py``: a phase cut short goes on where it stopped (a
training run from its newest checkpoint, anything else from scratch), a finished one is reused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.scripts.bench.test_world_model_latents import _import_bench

wmp = _import_bench("world_model_pretraining")


def _phases(tmp_path: Path, monkeypatch) -> tuple[object, list[list[str]]]:
    ran: list[list[str]] = []

    def run(command: list[str], log: Path) -> float:
        ran.append(command)
        return 12.5

    monkeypatch.setattr(wmp, "run", run)
    return wmp.Phases(wmp.parse_args(["--runs", str(tmp_path)])), ran


def test_a_training_run_cut_short_resumes_from_its_checkpoint(tmp_path: Path, monkeypatch):
    phases, ran = _phases(tmp_path, monkeypatch)
    pretrain = tmp_path / "pretrain"
    (pretrain / "checkpoints" / "step_000250").mkdir(parents=True)
    command = wmp.pretrain_command(phases.args, [tmp_path / "demos"], pretrain)
    phases.run("pretrain", command, pretrain)
    assert ran == [[*command, "resume=true"]]
    assert (pretrain / "checkpoints" / "step_000250").is_dir()  # kept, not wiped
    recorded = json.loads((tmp_path / "phases.json").read_text())["pretrain"]
    assert recorded["resumed"] is True and recorded["seconds"] == 12.5
    phases.run("pretrain", command, pretrain)  # finished: reused, not run again
    assert len(ran) == 1


def test_a_phase_without_a_checkpoint_starts_over(tmp_path: Path, monkeypatch):
    phases, ran = _phases(tmp_path, monkeypatch)
    record = tmp_path / "record_sft"
    (record / "episodes").mkdir(parents=True)  # a recording cut short before its checkpoint
    command = wmp.record_command(phases.args, record, "train", None, 1.0)
    phases.run("record_sft", command, record)
    assert ran == [command] and not record.exists()  # wiped; the stand-in run wrote nothing
    export = [sys.executable, "-m", "embodied_rl.cli", "export", "x", "--out", str(record)]
    (record / "checkpoints" / "step_000001").mkdir(parents=True)
    assert not wmp.resumable(export, record)  # only `train` resumes


def test_phases_left_out_are_skipped_and_a_missing_input_is_refused_before_any_run(
    tmp_path: Path, monkeypatch
):
    ran: list[list[str]] = []
    monkeypatch.setattr(wmp, "run", lambda command, log: ran.append(command) or 1.0)
    argv = ["--runs", str(tmp_path), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"pretrain needs record_random .*record_sft needs sft"):
        wmp.main([*argv, "--phases", "pretrain", "record_sft"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"benchmark": "srpo_world_model"}))
    with pytest.raises(SystemExit, match=r"not a world_model_pretraining result.*Fix"):
        wmp.main([*argv, "--recorded", str(other)])
    assert ran == []
    # what the SRPO comparison reads: the validation recording and the latents are left out
    args = wmp.parse_args([*argv, "--phases", "demos", "sft", "record_random"])
    phases = wmp.Phases(args)
    outputs = wmp.phase_outputs(args, tmp_path / "out")
    assert wmp.missing_inputs(args, phases, outputs) == []
    phases.run("record_sft_validation", ["train"], outputs["record_sft_validation"])
    assert ran == [] and "record_sft_validation" not in phases.records
    phases.run("sft", ["train"], outputs["sft"])
    assert ran == [["train"]]
    # a phase left out but finished here counts as an input, and is reused
    outputs["sft"].mkdir()
    later = wmp.parse_args([*argv, "--phases", "record_sft"])
    assert wmp.missing_inputs(later, wmp.Phases(later), outputs) == []


def test_a_rebuilt_curve_is_compared_update_by_update():
    recorded = [
        {"step": 0, "world_model/loss": 0.8231219053268433, "world_model/target_std": 0.91},
        {"step": 1, "world_model/loss": 0.8119878172874451, "world_model/target_std": 0.90},
    ]
    assert wmp.first_difference([dict(p) for p in recorded], recorded) is None
    drifted = [recorded[0], {**recorded[1], "world_model/loss": 0.8119878172874452}]
    assert wmp.first_difference(drifted, recorded) == (
        "update 1: world_model/loss 0.8119878172874452 vs 0.8119878172874451 recorded"
    )
    assert wmp.first_difference(recorded[:1], recorded) == "1 updates vs 2 recorded"
    with pytest.raises(SystemExit, match=r"rebuilt world model differs .*update 1"):
        wmp.refuse_difference("world model", wmp.first_difference(drifted, recorded))
    wmp.refuse_difference("world model", None)  # equal: goes on
