"""Tests of atomic per-rank checkpoints: round trip, crashes, corruption, RNG, pruning."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied_rl.checkpoint import (
    finalize,
    latest_checkpoint,
    load_rank_shard,
    write_rank_shard,
)
from embodied_rl.rng_state import capture_rng_state, restore_rng_state


def _state(rank: int, step: int) -> dict:
    return {
        "model": {"w": torch.full((3, 2), float(rank + step)), "b": torch.arange(4) * rank},
        "optimizer": {"step": step, "lrs": [0.1, 0.01], "betas": (0.9, 0.999)},
        "loader": {"epoch": 1, "step_in_epoch": step, "file": {"name": "p.jsonl"}},
        "note": None,
    }


def _save(root: Path, step: int, world_size: int, **kw) -> Path:
    for rank in range(world_size):
        write_rank_shard(root, step, rank, _state(rank, step))
    return finalize(root, step, world_size, **kw)


def test_round_trip_with_manifest_checksums(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    final = _save(root, 10, world_size=2)
    assert final == root / "step_000010"
    assert sorted(p.name for p in final.iterdir()) == [
        "manifest.json",
        "rank_00000.pt",
        "rank_00001.pt",
    ]
    manifest = json.loads((final / "manifest.json").read_text())
    assert (manifest["step"], manifest["world_size"]) == (10, 2)
    shard = (final / "rank_00001.pt").read_bytes()
    assert manifest["files"]["rank_00001.pt"] == {
        "sha256": hashlib.sha256(shard).hexdigest(),
        "size": len(shard),
    }
    assert latest_checkpoint(root) == final
    loaded = load_rank_shard(final, 1, world_size=2)
    assert torch.equal(loaded["model"]["w"], torch.full((3, 2), 11.0))
    assert torch.equal(loaded["model"]["b"], torch.tensor([0, 1, 2, 3]))
    assert loaded["optimizer"] == {"step": 10, "lrs": [0.1, 0.01], "betas": (0.9, 0.999)}
    assert loaded["loader"]["file"]["name"] == "p.jsonl" and loaded["note"] is None


def test_crash_before_finalize_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    previous = _save(root, 5, world_size=2)
    write_rank_shard(root, 10, 0, _state(0, 10))
    write_rank_shard(root, 10, 1, _state(1, 10))  # ... and the job dies before finalize
    assert (root / "step_000010.tmp").is_dir()
    assert latest_checkpoint(root) == previous


def test_finalize_refuses_missing_shards_and_drops_stale_ones(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    write_rank_shard(root, 3, 0, _state(0, 3))
    with pytest.raises(FileNotFoundError, match=r"\['rank_00001.pt'\].*write_rank_shard"):
        finalize(root, 3, world_size=2)
    # An earlier attempt with 3 ranks left rank 2's shard behind; a 2-rank run replaces it.
    write_rank_shard(root, 3, 2, _state(2, 3))
    write_rank_shard(root, 3, 1, _state(1, 3))
    final = finalize(root, 3, world_size=2)
    assert sorted(p.name for p in final.glob("rank_*.pt")) == ["rank_00000.pt", "rank_00001.pt"]
    # Sealing the same step again (a run resumed from an earlier step) replaces it.
    again = _save(root, 3, world_size=1)
    assert json.loads((again / "manifest.json").read_text())["world_size"] == 1
    assert latest_checkpoint(root) == again


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "problem"), [(_truncate, "bytes, the manifest says"), (_flip_byte, "sha256")]
)
def test_corrupt_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage, problem: str
) -> None:
    root = tmp_path / "checkpoints"
    previous = _save(root, 5, world_size=2)
    newest = _save(root, 10, world_size=2)
    damage(newest / "rank_00001.pt")
    with caplog.at_level(logging.WARNING, logger="embodied_rl.checkpoint"):
        assert latest_checkpoint(root) == previous
    assert "step_000010" in caplog.text and problem in caplog.text
    with pytest.raises(ValueError, match="corrupt"):
        load_rank_shard(newest, 1, world_size=2)


def test_world_size_mismatch_is_refused_naming_both_sizes(tmp_path: Path) -> None:
    final = _save(tmp_path, 1, world_size=2)
    with pytest.raises(ValueError, match="world_size=2 ranks but this run has world_size=4"):
        load_rank_shard(final, 0, world_size=4)


def test_state_that_weights_only_cannot_load_is_refused_at_save(tmp_path: Path) -> None:
    bad = {"optimizer": {"moments": [torch.ones(1), np.ones(2)]}}
    with pytest.raises(TypeError, match=r"state\['optimizer'\]\['moments'\]\[1\].*from_numpy"):
        write_rank_shard(tmp_path, 1, 0, bad)
    assert not (tmp_path / "step_000001.tmp" / "rank_00000.pt").exists()


def _draws() -> list[float]:
    # randn/gauss exercise the cached-gaussian parts of the numpy and Python states.
    return [
        *torch.rand(3).tolist(),
        *np.random.rand(2).tolist(),
        float(np.random.randn()),
        random.random(),
        random.gauss(0.0, 1.0),
    ]


def test_rng_capture_and_restore_reproduce_the_same_numbers(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.randn()  # leaves a cached gaussian in the numpy state
    random.gauss(0.0, 1.0)  # and in the Python state
    write_rank_shard(tmp_path, 1, 0, {"rng": capture_rng_state()})
    expected = _draws()
    final = finalize(tmp_path, 1, world_size=1)
    _draws()  # move every generator on
    restore_rng_state(load_rank_shard(final, 0, world_size=1)["rng"])
    assert _draws() == expected


def test_keep_last_prunes_older_complete_checkpoints(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _save(tmp_path, step, world_size=1, keep_last=2)
    write_rank_shard(tmp_path, 4, 0, _state(0, 4))  # pending, must survive pruning
    _save(tmp_path, 5, world_size=1, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_000003",
        "step_000004.tmp",
        "step_000005",
    ]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000005"


_FULL_DISK = """
import resource, sys, torch
from embodied_rl import checkpoint
root = sys.argv[1]
checkpoint.write_rank_shard(root, 1, 0, {"w": torch.zeros(10)})
checkpoint.finalize(root, 1, 1)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))  # a full disk
try:
    checkpoint.write_rank_shard(root, 2, 0, {"w": torch.zeros(1_000_000)})
except OSError as err:
    print(checkpoint.write_failure(checkpoint.Path(root), 2, err))
"""


def test_a_write_that_fails_says_which_step_what_survived_and_how_to_resume(tmp_path):
    """A full disk while saving gave a traceback naming the wrong step and no resume hint.
    Here the OS refuses the write for real (a file-size limit: EFBIG, as ENOSPC would)."""
    import subprocess
    import sys

    root = tmp_path / "checkpoints"
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(root)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    message = done.stdout.strip()
    assert message.startswith(f"writing the checkpoint of step 2 into {root} failed: "), done
    assert "step_000001, is intact and resume=true continues from it" in message
    assert "Fix: free space on that disk" in message
    assert not list(root.glob("*.tmp/.*.partial"))  # the failed write's bytes given back
    assert latest_checkpoint(root).name == "step_000001"


def test_the_driver_shows_a_write_failure_without_the_workers_traceback():
    import ray

    from embodied_rl.checkpoint import CheckpointWriteError
    from embodied_rl.launch.monitor import cause_text

    cause = CheckpointWriteError("writing the checkpoint of step 2 into /x failed: No space left")
    err = ray.exceptions.RayTaskError(
        "DAGWorker.run", "Traceback (most recent call last): ...", cause
    )
    assert cause_text(err) == str(cause)
    other = ray.exceptions.RayTaskError("DAGWorker.run", "Traceback: ...", ValueError("bad"))
    assert "Traceback" in cause_text(other)
