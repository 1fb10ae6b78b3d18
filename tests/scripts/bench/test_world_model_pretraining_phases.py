"""``scripts/bench/world_model_pretraining.py``: a phase cut short goes on where it stopped (a
training run from its newest checkpoint, anything else from scratch), a finished one is reused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
