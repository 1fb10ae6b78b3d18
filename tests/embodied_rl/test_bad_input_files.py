"""Bad input files and settings are refused before any work starts (issue 28, items 5-9).

Each test is the reproduction from the issue: through the CLI (``embodied_rl.cli.main``) it
asserts exit code 2, one ``error: ... Fix: ...`` line, no traceback and no run folder; the
data files are real (synthetic LIBERO demo files from the real writer, Parquet from pyarrow,
checkpoints from ``embodied_rl.checkpoint``). Nothing here starts Ray or builds a simulator.
"""

from __future__ import annotations

import importlib.util
import json
import os

import h5py
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embodied_rl import checkpoint
from embodied_rl.cli import main
from embodied_rl.data.dataloader import ShardedPromptLoader
from embodied_rl.data.demo_writer import write_demo_file
from embodied_rl.data.demos import scan_demo_file
from embodied_rl.runtime.config import compose, validate_config
from tests.embodied_rl.synthetic_demos import synthetic_episode, write_synthetic_demos


def refused(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI; assert it refused with one ``error: ... Fix:`` line naming ``words``."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    # robosuite prints its own warnings when LIBERO is first imported (the demos command)
    lines = [line for line in err.splitlines() if not line.startswith("[robosuite WARNING]")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def train(config: str, tmp_path, *overrides: str) -> list[str]:
    """``train`` argv whose run folder is ``tmp_path / 'run'`` (which must never appear)."""
    return ["train", "--config-name", config, f"run_dir={tmp_path / 'run'}", *overrides]


# --------------------------------------------------------------------- item 5: demo suite
def test_demos_of_another_suite_are_refused_naming_file_and_both_suites(tmp_path, capsys):
    demos = write_synthetic_demos(tmp_path / "demos", suite="libero_object")
    argv = train("sft_libero", tmp_path, f"data.paths=['{demos}']")
    line = refused(capsys, argv, "task_0_demo.hdf5", "'libero_object'", "'libero_spatial'")
    assert "simulator.options.suite" in line
    assert not (tmp_path / "run").exists()


def test_demo_files_without_a_suite_attribute_still_validate(tmp_path, capsys):
    """Files written before demo files recorded their suite (and LIBERO's own) keep loading."""
    demos = write_synthetic_demos(tmp_path / "demos", suite="libero_object")
    for path in demos.glob("*.hdf5"):
        with h5py.File(path, "a") as f:
            del f["data"].attrs["embodied_rl_suite"]
    assert {info.suite for path in demos.glob("*.hdf5") for info in scan_demo_file(path)} == {None}
    argv = ["validate", "--config-name", "sft_libero", f"data.paths=['{demos}']"]
    assert main(argv) == 0, capsys.readouterr().err


def test_demo_frames_of_two_sizes_with_image_size_null_are_refused(tmp_path):
    demos = write_synthetic_demos(tmp_path / "demos", tasks=1, size=16)
    write_demo_file(
        demos / "other_demo.hdf5",
        [synthetic_episode(1, 0, 12, 32)],
        problem_info={"language_instruction": "open the top drawer"},
        bddl_file_name="other.bddl",
        bddl_file_content="",
        env_name="synthetic",
        env_args={},
        attrs={"embodied_rl_suite": "libero_spatial", "embodied_rl_task_id": 1},
    )
    cfg = compose("sft_libero", [f"data.paths=['{demos}']", "data.image_size=null"])
    with pytest.raises(
        ValueError, match=r"frames of (16x16|32x32) .* of (16x16|32x32)\. Fix: set data.image_size"
    ):
        validate_config(cfg)


def test_a_corpus_of_another_frame_size_is_refused_by_pretraining(tmp_path, capsys):
    """pretrain_libero90 trains on the frames the rollouts render (data.resize_frames false)."""
    demos = write_synthetic_demos(tmp_path / "demos", size=16, suite="libero_90")
    argv = train("pretrain_libero90", tmp_path, f"data.paths=['{demos}']")
    line = refused(capsys, argv, "task_0_demo.hdf5", "16x16", "64x64", "--image-size 64")
    assert "data.resize_frames=true" in line and not (tmp_path / "run").exists()
    assert main(["validate", "--config-name", "sft_libero", f"data.paths=['{demos}']",
                 "simulator.options.suite=libero_90", "simulator.num_tasks=90"]) == 0  # fmt: skip


@pytest.mark.parametrize(
    "convert, words",
    [
        (lambda a: a[:, 6:7].__setitem__(slice(None), (a[:, 6:7] + 1) / 2), ["[0.0, 1.0]", "-1 (open)"]),
        (lambda a: a[:, :3].__imul__(5), ["reach 1.5", "[-1, 1]"]),
    ],
)  # fmt: skip
def test_demos_of_another_action_convention_are_refused(tmp_path, capsys, convert, words):
    demos = write_synthetic_demos(tmp_path / "demos", tasks=1)
    with h5py.File(demos / "task_0_demo.hdf5", "a") as f:
        actions = f["data/demo_1/actions"][()]
        convert(actions)
        f["data/demo_1/actions"][...] = actions
    argv = train("sft_libero", tmp_path, f"data.paths=['{demos}']")
    refused(capsys, argv, "task_0_demo.hdf5:demo_1", *words)


def test_statistics_from_the_checkpoint_need_a_checkpoint(tmp_path, capsys):
    demos = write_synthetic_demos(tmp_path / "demos")
    argv = train("sft_libero", tmp_path, f"data.paths=['{demos}']", "data.statistics=checkpoint")
    refused(
        capsys, argv, "statistics=checkpoint", "models.actor.init_from", "data.statistics=demos"
    )


def test_a_run_folder_inside_or_holding_an_input_is_refused(tmp_path, capsys):
    """One path guard for every writer: a run_dir inside the demos it reads, or holding
    them (overwrite=true would delete them), is refused before anything is written."""
    demos = write_synthetic_demos(tmp_path / "demos")
    files = sorted(p.name for p in demos.iterdir())
    inside = ["train", "--config-name", "sft_libero", f"data.paths=['{demos}']"]
    refused(capsys, [*inside, f"run_dir={demos / 'run'}"], "lies inside data.paths", str(demos))
    holding = [*inside, f"run_dir={tmp_path}", "overwrite=true"]
    refused(capsys, holding, f"run_dir {tmp_path} contains data.paths {demos}")
    assert sorted(p.name for p in demos.iterdir()) == files and not (demos / "run").exists()


# ------------------------------------------------------------- item 6: init-state limits
@pytest.mark.parametrize("config", ["srpo_libero", "srpo_reach"])
def test_more_init_states_than_the_simulator_has_are_refused_at_validate(config, tmp_path, capsys):
    argv = train(config, tmp_path, "simulator.num_init_states=100")
    line = refused(capsys, argv, "num_init_states=100", "50 init states per task")
    assert "suite libero_spatial" in line or config == "srpo_reach"
    assert not (tmp_path / "run").exists()


def test_task_ids_beyond_the_suite_are_refused(tmp_path, capsys):
    argv = train("srpo_libero", tmp_path, "simulator.num_tasks=12")
    refused(capsys, argv, "task_id up to 11 (num_tasks=12)", "has 10 tasks")


def test_a_reach_config_with_that_many_init_states_validates(capsys):
    argv = ["validate", "--config-name", "srpo_reach", "simulator.num_init_states=100"]
    assert main([*argv, "+simulator.options.num_init_states=100"]) == 0, capsys.readouterr().err


# ------------------------------------------------------------------ item 7: bad files
def test_corrupt_parquet_file_is_refused_at_validate(tmp_path, capsys):
    data = tmp_path / "train.parquet"
    data.write_bytes(os.urandom(4096))
    argv = train("grpo_llm", tmp_path, f"data.train_path={data}")
    refused(capsys, argv, str(data), "cannot be read as Parquet")
    assert not (tmp_path / "run").exists()


def test_corrupt_hdf5_demo_file_is_refused_at_validate(tmp_path, capsys):
    demos = write_synthetic_demos(tmp_path / "demos", tasks=1)
    bad = demos / "broken_demo.hdf5"
    bad.write_bytes(b"\x89HDF\r\n" + os.urandom(2048))
    argv = train("sft_libero", tmp_path, f"data.paths=['{demos}']")
    refused(capsys, argv, str(bad), "cannot be read as HDF5")
    assert not (tmp_path / "run").exists()


def test_empty_demo_folder_is_refused_at_validate(tmp_path, capsys):
    empty = tmp_path / "demos"
    empty.mkdir()
    refused(capsys, train("sft_libero", tmp_path, f"data.paths=['{empty}']"), "no *.hdf5")
    assert not (tmp_path / "run").exists()


def _parquet(path, answers, prompts=None) -> None:
    prompts = prompts or [f"{i}+{i}=" for i in range(len(answers))]
    pq.write_table(pa.table({"prompt": prompts, "answer": answers}), path)


def test_integer_answers_stored_as_float_read_as_integers(tmp_path, capsys):
    """A float column of integral answers (pandas' int column with a null) reads as digits:
    ``19.0`` -> ``"19"``, which the integer reward scores; other floats keep their digits."""
    data = tmp_path / "train.parquet"
    _parquet(data, [19.0, 4.0, 2.5, 0.0])
    argv = ["validate", "--config-name", "grpo_llm", f"data.train_path={data}"]
    assert main([*argv, "data.batch_size=4"]) == 0, capsys.readouterr().err
    loader = ShardedPromptLoader(
        data, global_batch_size=4, dp_rank=0, dp_size=1, seed=0, shuffle=False,
        required_fields=("prompt", "answer"),
    )  # fmt: skip
    assert loader.next_batch()["answer_text"] == ["19", "4", "2.5", "0"]


@pytest.mark.parametrize(
    "prompts, words",
    [
        (["", "  ", "\t"], "has 0 usable prompt(s) of 3 row(s)"),
        (["1+1="], "has 1 usable prompt(s)"),
    ],
)
def test_a_file_that_cannot_fill_one_batch_is_refused_at_validate(tmp_path, capsys, prompts, words):
    """validate said OK, then train failed in a worker traceback after Ray started."""
    data = tmp_path / "train.parquet"
    _parquet(data, [2.0] * len(prompts), prompts)
    argv = train("grpo_llm", tmp_path, f"data.train_path={data}", "data.batch_size=2")
    line = refused(capsys, argv, words, "fewer than one batch of 2", "lower data.batch_size")
    assert str(data) in line and not (tmp_path / "run").exists()


def test_a_nan_answer_is_refused_at_validate_naming_the_row(tmp_path, capsys):
    data = tmp_path / "train.parquet"
    _parquet(data, [19.0, float("nan"), 4.0])
    argv = train("grpo_llm", tmp_path, f"data.train_path={data}")
    refused(capsys, argv, "row 1 (0-based)", "'answer'")
    assert not (tmp_path / "run").exists()


def _checkpoint(root, step: int):
    checkpoint.write_rank_shard(root, step, 0, {"w": torch.ones(2) * step})
    return checkpoint.finalize(root, step, 1)


@pytest.mark.parametrize(
    "manifest",
    [[], {"step": 2, "world_size": 1, "files": ["rank_00000.pt"]},
     {"step": 2, "world_size": 1, "files": {"rank_00000.pt": "abc"}},
     {"step": 2, "world_size": 1, "files": {"rank_00000.pt": {"size": 3}}},
     {"step": "2", "world_size": True, "files": {}}],
)  # fmt: skip
def test_a_malformed_manifest_is_skipped_like_a_checksum_failure(tmp_path, manifest):
    root = tmp_path / "checkpoints"
    older, newest = _checkpoint(root, 1), _checkpoint(root, 2)
    (newest / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    assert "manifest is malformed" in checkpoint.verify_checkpoint(newest)
    assert checkpoint.latest_checkpoint(root) == older


def test_init_from_a_checkpoint_with_a_malformed_manifest_is_refused(tmp_path, capsys):
    step = _checkpoint(tmp_path / "sft" / "checkpoints", 1)
    (step / checkpoint.MANIFEST).write_text(json.dumps({"files": "x"}))
    argv = train("srpo_reach", tmp_path, f"+models.actor.init_from={step}")
    refused(capsys, argv, "models.actor.init_from", "manifest is malformed")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------- item 8: demo files never clobbered
def _write(path, demos: int, overwrite: bool = False):
    return write_demo_file(
        path,
        [synthetic_episode(0, d, 8, 8) for d in range(demos)],
        problem_info={"language_instruction": "put the bowl on the plate"},
        bddl_file_name="t.bddl",
        bddl_file_content="",
        env_name="synthetic",
        env_args={},
        overwrite=overwrite,
    )


def test_an_existing_demo_file_is_replaced_only_with_overwrite(tmp_path):
    path = _write(tmp_path / "task_demo.hdf5", demos=3)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    with pytest.raises(FileExistsError, match="overwrite"):
        _write(path, demos=1)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime
    assert len(scan_demo_file(path)) == 3
    _write(path, demos=1, overwrite=True)
    assert len(scan_demo_file(path)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["task_demo.hdf5"]  # no partial left


def test_an_interrupted_write_leaves_no_file_under_the_real_name(tmp_path):
    episode = synthetic_episode(0, 0, 8, 8)
    episode.attrs["not_storable"] = object()  # h5py raises while writing the demo
    with pytest.raises(TypeError):
        write_demo_file(
            tmp_path / "task_demo.hdf5", [episode], problem_info={}, bddl_file_name="",
            bddl_file_content="", env_name="", env_args={},
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.libero
@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_demos_command_refuses_an_out_folder_holding_the_task_file(tmp_path, capsys):
    """``embodied-rl demos --out <folder with a demo file>``: refused before any episode runs."""
    from simulators.libero.demos import demo_path, suite_tasks

    path = demo_path(tmp_path, suite_tasks("libero_object")[0])
    _write(path, demos=3)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    argv = ["demos", "--suite", "libero_object", "--tasks", "0", "--out", str(tmp_path)]
    refused(capsys, [*argv, "--no-progress"], path.name, "--overwrite")
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


# ------------------------------------------------------ item 9: simulator and rollout ranges
@pytest.mark.parametrize(
    ("config", "override", "words"),
    [
        ("srpo_reach", "simulator.options.success_radius=-1", ("success_radius must be > 0",)),
        ("srpo_reach", "simulator.options.render_size=-4", ("render_size must be >= 0",)),
        ("srpo_libero", "simulator.options.render_size=-4", ("render_size must be >= 0",)),
        ("srpo_reach", "rollout.max_steps=0", ("max_steps must be >= 1 or null",)),
    ],
)
def test_out_of_range_simulator_and_rollout_settings_are_refused_at_validate(
    config, override, words, tmp_path, capsys
):
    refused(capsys, ["validate", "--config-name", config, override], *words)
    refused(capsys, train(config, tmp_path, override), *words)
    assert not (tmp_path / "run").exists()


@pytest.mark.libero
@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_demos_command_refuses_an_out_inside_liberos_task_files(capsys):
    from pathlib import Path

    from simulators.libero.demos import suite_tasks

    task_files = Path(suite_tasks("libero_object")[0].bddl_path).resolve().parents[1]
    out = task_files / "libero_object" / "demos"
    argv = ["demos", "--suite", "libero_object", "--tasks", "0", "--out", str(out)]
    refused(capsys, argv, "lies inside LIBERO's task files", "Fix: choose another --out")
    assert not out.exists()


@pytest.mark.parametrize("where", ["below_a_file", "virtual"])
def test_a_run_folder_that_cannot_be_created_is_one_line(tmp_path, capsys, where):
    """It was a traceback (below a file) or a bare [Errno 2] (/proc)."""
    (tmp_path / "file").write_text("x")
    run_dir = tmp_path / "file" / "run" if where == "below_a_file" else "/proc/embodied_rl_run"
    argv = ["train", "--config-name", "srpo_reach", f"run_dir={run_dir}"]
    line = refused(capsys, argv, f"cannot create or write the run folder {run_dir}")
    assert "Fix: set run_dir (or output_root) to a writable folder" in line


@pytest.mark.parametrize(
    "config, override, reads",
    [
        ("srpo_reach", "models.actor.options.state_dim=5", "(mlp) reads a 5-d state"),
        ("srpo_oft_libero", "+models.actor.options.proprio_dim=6", "(openvla_oft) reads a 6-d"),
    ],
)
def test_a_policy_state_size_the_simulator_does_not_give_is_refused(
    tmp_path, capsys, config, override, reads
):
    """validate said OK, then the policy's first act failed in a worker after Ray started."""
    if config == "srpo_oft_libero":  # the shipped checkpoint has 8: start from scratch
        override = f"{override} models.actor.init_from=null"
    line = refused(capsys, train(config, tmp_path, *override.split()), reads, "8-d states")
    assert "Fix: set the policy's state size to 8" in line and not (tmp_path / "run").exists()
