"""A run folder belongs to one config; ``eval`` needs a trained run and writes its own folder.

The reproductions of issue 28 items 1-4 through the real CLI: each refusal is one
``error: ... Fix: ...`` line with exit code 2, given before anything is written, and the
existing run's files are byte-identical afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embodied_rl.cli import main

# One worker, one step, two tasks: the held-out split is 2 tasks x 10 init states = 20 pairs.
REACH = [
    "trainer.total_steps=1",
    "workers.num_workers=1",
    "data.batch_size=2",
    "rollout.group_size=2",
    "rollout.num_envs=4",
    "algorithm.actor.num_mini_batches=1",
    "data.tasks=[0,1]",
    "eval.batch_size=20",
    "eval.max_videos=2",
]
PAIRS = 20


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time (ns)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _refused(capsys, *args: str) -> str:
    """Run the CLI; it must exit 2 with one ``error: ... Fix: ...`` line and no traceback."""
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def reach_run(tmp_path_factory) -> Path:
    """A real srpo_reach run: one step, a checkpoint, the training-time evaluation."""
    run_dir = tmp_path_factory.mktemp("reach") / "run"
    assert main(["train", "--config-name", "srpo_reach", *REACH, f"run_dir={run_dir}"]) == 0
    assert (run_dir / "checkpoints" / "step_000001" / "manifest.json").is_file()
    assert (run_dir / "eval" / "results.jsonl").is_file()
    assert not (run_dir / ".lock").exists()  # released when the run ended
    return run_dir


def test_a_second_writer_into_a_live_run_is_refused_naming_the_holder(reach_run, capsys):
    """A resume=true of a live run truncated its metrics.jsonl and wrote the same steps."""
    import socket
    import subprocess

    import psutil

    holder = subprocess.Popen(["sleep", "60"])  # stands for the live run's driver
    try:
        started = psutil.Process(holder.pid).create_time()
        record = {"pid": holder.pid, "host": socket.gethostname(), "started": started,
                  "command": "embodied-rl train -c srpo_reach"}  # fmt: skip
        (reach_run / ".lock").write_text(json.dumps(record))
        before = _files(reach_run)
        for args in (
            ["train", "-c", "srpo_reach", *REACH, "resume=true"],
            ["eval", "-c", "srpo_reach", *REACH],
        ):
            line = _refused(capsys, *args, f"run_dir={reach_run}")
            assert f"in use by a live run: pid {holder.pid}" in line and "Fix: wait" in line
        assert _files(reach_run) == before
    finally:
        holder.kill()
        holder.wait()
        (reach_run / ".lock").unlink()


def test_eval_of_a_run_dir_without_a_checkpoint_is_refused_and_writes_nothing(tmp_path, capsys):
    # Issue 28, item 1: it used to create the folder and evaluate a random-init policy.
    missing = tmp_path / "does" / "not" / "exist"
    line = _refused(capsys, "eval", "--config-name", "srpo_reach", f"run_dir={missing}")
    assert f"run_dir {missing} does not exist" in line and "train first" in line
    assert not (tmp_path / "does").exists()
    empty = tmp_path / "no_checkpoint"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "notes.txt").write_text("mine")
    before = _files(empty)
    line = _refused(capsys, "eval", "--config-name", "srpo_reach", f"run_dir={empty}")
    assert "holds no complete checkpoint" in line and "checkpoints/" in line
    assert _files(empty) == before and sorted(p.name for p in empty.iterdir()) == [
        "checkpoints",
        "notes.txt",
    ]


def test_a_fresh_run_into_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys):
    (tmp_path / "paper.tex").write_text("mine")
    for extra in ([], ["overwrite=true"]):  # overwrite replaces runs, never other folders
        line = _refused(capsys, "train", "--config-name", "grpo_llm", f"run_dir={tmp_path}", *extra)
        assert "is not empty and is not a run folder" in line
    assert [p.name for p in tmp_path.iterdir()] == ["paper.tex"]
    line = _refused(
        capsys, "train", "-c", "grpo_llm", "resume=true", "overwrite=true", f"run_dir={tmp_path}"
    )
    assert "contradict" in line


@pytest.mark.ray
def test_training_another_config_into_a_run_folder_is_refused(reach_run, capsys):
    # Issue 28, item 2: it used to overwrite config.yaml and metrics.jsonl.
    before = _files(reach_run)
    line = _refused(capsys, "train", "-c", "grpo_llm", f"run_dir={reach_run}")
    assert "holds a run of config 'srpo_reach'" in line and "'grpo_llm'" in line
    assert "name" in line and "models.actor" in line and "overwrite=true" in line
    # The same config, a fresh run: refused too (it would mix two runs in one folder).
    line = _refused(capsys, "train", "--config-name", "srpo_reach", *REACH, f"run_dir={reach_run}")
    assert "already holds a run of 'srpo_reach'" in line and "resume=true" in line
    assert _files(reach_run) == before


@pytest.mark.ray
def test_resuming_a_run_of_another_config_is_refused_naming_both(reach_run, capsys):
    # Issue 28, item 3: it used to rewrite config.yaml, then fail with a state_dict traceback.
    before = _files(reach_run)
    line = _refused(
        capsys, "train", "--config-name", "grpo_llm", "resume=true", f"run_dir={reach_run}"
    )
    assert "'srpo_reach'" in line and "'grpo_llm'" in line and "resume that run" in line
    line = _refused(  # a checkpoint of another worker count: refused before writing, too
        capsys, "train", "-c", "srpo_reach", *REACH, "workers.num_workers=2", "resume=true",
        f"run_dir={reach_run}",
    )  # fmt: skip
    assert "written by 1 worker(s)" in line and "workers.num_workers=1" in line
    # Another batch size rewrote the finished run's config.yaml, then failed in a worker.
    line = _refused(
        capsys, "train", "-c", "srpo_reach", *REACH, "data.batch_size=4", "resume=true",
        f"run_dir={reach_run}",
    )  # fmt: skip
    assert "node 'tasks' has batch_size 4" in line and "trained with 2" in line
    assert _files(reach_run) == before


@pytest.mark.ray
def test_standalone_eval_covers_each_pair_once_in_its_own_folder(reach_run, capsys):
    # Issue 28, item 4: other batch sizes repeated pairs or evaluated some, and replaced the
    # training run's eval rows (stale videos stayed).
    before = _files(reach_run)
    for size in (8, 100):
        line = _refused(
            capsys, "eval", "-c", "srpo_reach", *REACH, f"eval.batch_size={size}",
            f"run_dir={reach_run}",
        )  # fmt: skip
        assert f"eval.batch_size={size}" in line and f"has {PAIRS} (task, init state) pairs" in line
        assert f"set eval.batch_size={PAIRS}" in line
    assert _files(reach_run) == before
    assert main(["eval", "-c", "srpo_reach", *REACH, f"run_dir={reach_run}"]) == 0
    after = _files(reach_run)
    (own,) = [p for p in reach_run.iterdir() if p.name.startswith("eval_")]
    assert {k: v for k, v in after.items() if not k.startswith(own.name)} == before
    rows = [json.loads(x) for x in (own / "eval" / "results.jsonl").read_text().splitlines()]
    assert [(r["task"], r["episodes"]) for r in rows] == [(0, 10), (1, 10)]
    assert (own / "eval_config.yaml").is_file() and (own / "metrics.jsonl").is_file()
    shutil.rmtree(own)  # the module's run again as the other tests expect it


@pytest.mark.ray
def test_overwrite_replaces_the_run_and_resume_continues_it(reach_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(reach_run, copy)
    (copy / "leftover.txt").write_text("from the old run")
    assert main(["train", "-c", "srpo_reach", *REACH, "overwrite=true", f"run_dir={copy}"]) == 0
    assert not (copy / "leftover.txt").exists()
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0]
    more = [*REACH, "trainer.total_steps=2", "resume=true", f"run_dir={copy}"]
    assert main(["train", "-c", "srpo_reach", *more]) == 0
    lines = (copy / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1]


def test_a_start_that_failed_before_its_first_step_is_started_again_in_place(tmp_path, capsys):
    """Its folder blocked the retry, and the suggested resume=true was refused in turn."""
    from omegaconf import OmegaConf

    from embodied_rl.runtime.config import compose
    from embodied_rl.runtime.config_errors import ConfigError
    from embodied_rl.runtime.run_folder import prepare_train_folder

    run_dir = tmp_path / "run"
    cfg = compose("srpo_reach", [*REACH, f"run_dir={run_dir}"])
    run_dir.mkdir()
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)  # what a start writes first
    (run_dir / "command.txt").write_text("embodied-rl train -c srpo_reach\n")
    (run_dir / "metrics.jsonl").write_text("")
    prepare_train_folder(cfg, run_dir)
    assert "failed before its first step" in capsys.readouterr().err
    assert list(run_dir.iterdir()) == []  # emptied for the new start
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")  # a step completed
    with pytest.raises(ConfigError, match="already holds a run of 'srpo_reach'"):
        prepare_train_folder(cfg, run_dir)


def test_resume_of_a_run_stopped_before_its_first_checkpoint_starts_it_again(tmp_path, capsys):
    """Ctrl-C before the first checkpoint named resume=true, which was refused ("no complete
    checkpoint"); a requeued job that always passes resume=true failed the same way."""
    from omegaconf import OmegaConf

    from embodied_rl.runtime.config import compose
    from embodied_rl.runtime.config_errors import ConfigError
    from embodied_rl.runtime.run_folder import prepare_train_folder

    run_dir = tmp_path / "run"
    cfg = compose("srpo_reach", [*REACH, "resume=true", f"run_dir={run_dir}"])
    run_dir.mkdir()
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")  # never checkpointed
    (run_dir / "checkpoints" / "step_000001").mkdir(parents=True)  # a write cut short: unsealed
    started = prepare_train_folder(cfg, run_dir)
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    assert started.resume is False and cfg.resume is True  # the caller's config is left alone
    assert list(run_dir.iterdir()) == []
    other = compose("grpo_llm", ["resume=true", f"run_dir={run_dir}"])
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    with pytest.raises(ConfigError, match="'srpo_reach'"):  # another run's is still refused
        prepare_train_folder(other, run_dir)
    assert (run_dir / "config.yaml").is_file()
