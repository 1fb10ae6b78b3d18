"""CLI fuzz test: every subcommand over a fixed corpus of bad inputs (issue 28, last item).

Each case runs ``embodied_rl.cli.main`` in-process with the working directory set to a folder
of the user's own files (a trained-looking run folder, a demo file, data files) and asserts:

- exit code 2, the CLI's code for an input error (``main`` returns it for ``ConfigError`` and
  the other user errors);
- stderr holds exactly one line starting with ``error:``, in the project's format: one line
  ``error: <what>. Fix: <what to do>``, or the DAG validator's list of several problems
  (``error: invalid DAG (N problem(s)):`` then one ``  - ... Fix: ...`` line per problem);
- no ``Traceback``;
- nothing of the user's changed: every path under the folder, its bytes and its mtime (folders'
  mtimes too, so a file written and removed again shows) are the same afterwards, and no run
  folder (``outputs/...``) appeared.

Malformed command lines (a missing or unknown flag) never reach ``main``'s handler: argparse
exits with code 2 and its own ``usage: ...`` + ``embodied-rl <cmd>: error: ...`` lines, which
name the flag and show the usage instead of a ``Fix:``. Those cases assert argparse's format.

Every case is refused by validation on the driver, before Ray starts or a model is built
(about 0.1 s each). Inputs that pass the driver's checks are not in the corpus: they would start
Ray (e.g. ``eval`` of a run whose checkpoint holds no model).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.cli import main
from embodied_rl.runtime.config import compose
from tests.embodied_rl.synthetic_demos import write_synthetic_demos

HAS_LIBERO = importlib.util.find_spec("libero") is not None
LIBERO = [
    pytest.mark.libero,
    pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO is not installed"),
]
# A trained-looking run of srpo_reach: its saved config and one sealed checkpoint of 2 ranks
# (srpo_reach's worker count, so eval and resume get past the worker-count check).
RUN = "my_run"


@pytest.fixture
def user_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's folder, also the working directory: a run, demos, data and an empty folder."""
    run = tmp_path / RUN
    run.mkdir()
    OmegaConf.save(compose("srpo_reach"), run / "config.yaml", resolve=True)
    for rank in (0, 1):
        checkpoint.write_rank_shard(run / "checkpoints", 1, rank, {"w": torch.ones(2)})
    checkpoint.finalize(run / "checkpoints", 1, 2)
    (run / "metrics.jsonl").write_text('{"step": 1, "train/reward": 0.5}\n')
    write_synthetic_demos(tmp_path / "demos", tasks=1, demos=1)
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(
        pa.table({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}), data / "ok.parquet"
    )
    (data / "broken.parquet").write_bytes(b"this is not a parquet file\n" * 64)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under ``root``: a file's bytes (``None`` for a folder) and its mtime (ns)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def _argv(command: str, root: Path) -> list[str]:
    """``command`` split on spaces, with ``{tmp}`` standing for the user's folder."""
    return [word.replace("{tmp}", str(root)) for word in command.split()]


def _error_lines(err: str) -> list[str]:
    """stderr without blank lines and robosuite's import warnings (the LIBERO cases)."""
    return [
        line for line in err.splitlines() if line.strip() and not line.startswith("[robosuite ")
    ]


def assert_project_error(err: str) -> None:
    """One ``error: ... Fix: ...`` line, or the DAG validator's list of problems."""
    assert "Traceback" not in err, err
    lines = _error_lines(err)
    assert lines and lines[0].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    if len(lines) == 1:
        assert ". Fix: " in lines[0], err
        return
    # several problems at once: "error: invalid DAG (N problem(s)):" and N "  - ..." lines
    assert lines[0] == f"error: invalid DAG ({len(lines) - 1} problem(s)):", err
    assert all(line.startswith("  - ") and ". Fix: " in line for line in lines[1:]), err


def _run_refused(root: Path, capsys: pytest.CaptureFixture, command: str, word: str) -> None:
    """Run ``command``; it must exit 2 with the project's error naming ``word``, and leave
    every file of ``root`` as it was."""
    before = _snapshot(root)
    code = main(_argv(command, root))
    err = capsys.readouterr().err
    assert code == 2, err
    assert_project_error(err)
    assert word.replace("{tmp}", str(root)) in err, (word, err)
    assert _snapshot(root) == before
    assert not (root / "outputs").exists()


# (command, a word the error must contain); {tmp} is the user's folder, also the cwd.
CASES = [
    # ------------------------------------------------------------- config names and keys
    pytest.param("train --config-name nonsense", "no config 'nonsense'", id="train-unknown-config"),
    pytest.param("validate -c nonsense", "no config 'nonsense'", id="validate-unknown-config"),
    pytest.param("plan --config-name nonsense", "no config 'nonsense'", id="plan-unknown-config"),
    pytest.param("eval --config-name nonsense", "no config 'nonsense'", id="eval-unknown-config"),
    pytest.param(
        "train --config-name srpo_reach --config-dir {tmp}/empty",
        "no config 'srpo_reach'",
        id="train-config-dir-without-configs",
    ),
    pytest.param(
        "validate --config-name srpo_reach trainer.totl_steps=5",
        "did you mean 'total_steps'",
        id="validate-typo-key",
    ),
    pytest.param(
        "train --config-name srpo_reach +trainer.nope=1", "trainer.nope", id="train-added-key"
    ),
    pytest.param("train --config-name grpo_llm +bogus=1", "'bogus'", id="train-unknown-top-key"),
    pytest.param(
        "plan --config-name grpo_llm workers.num_wrokers=2",
        "workers.num_wrokers",
        id="plan-typo-key",
    ),
    # ------------------------------------------------------------------- wrong value types
    pytest.param("train --config-name srpo_reach trainer.total_steps=abc", "int", id="steps-str"),
    pytest.param("train --config-name srpo_reach trainer.total_steps=1.5", "int", id="steps-float"),
    pytest.param(
        "train --config-name srpo_reach trainer.total_steps=[1,2]", "int", id="steps-list"
    ),
    pytest.param(
        "validate --config-name srpo_reach trainer.total_steps=null", "int", id="steps-null"
    ),
    pytest.param(
        "plan --config-name srpo_reach workers.num_workers=abc", "int", id="plan-workers-str"
    ),
    pytest.param("train --config-name srpo_reach device=tpu", "'tpu'", id="device-unknown"),
    pytest.param("train --config-name srpo_reach trainer=", "mapping", id="section-empty"),
    pytest.param(
        "validate --config-name srpo_reach simulator.options.success_radius=abc",
        "node 'rollout'",
        id="radius-str",
    ),
    # ---------------------------------------------------------- negative and zero sizes
    pytest.param(
        "train --config-name srpo_reach trainer.total_steps=-1", "got -1", id="steps-negative"
    ),
    pytest.param(
        "train --config-name srpo_reach workers.num_workers=0", "got 0", id="workers-zero"
    ),
    pytest.param(
        "plan --config-name srpo_reach workers.num_workers=-2", "got -2", id="plan-workers-neg"
    ),
    pytest.param(
        "train --config-name srpo_reach simulator.options.render_size=-4",
        "render_size must be >= 0",
        id="reach-render-size-negative",
    ),
    pytest.param(
        "validate --config-name srpo_libero simulator.options.render_size=-4",
        "render_size must be >= 0",
        id="libero-render-size-negative",
    ),
    pytest.param(
        "train --config-name srpo_reach simulator.options.success_radius=-1",
        "success_radius must be > 0",
        id="radius-negative",
    ),
    pytest.param(
        "train --config-name srpo_reach rollout.max_steps=0",
        "max_steps must be >= 1",
        id="max-steps-zero",
    ),
    pytest.param(
        "train --config-name srpo_reach rollout.group_size=0",
        "group_size must be >= 1",
        id="group-size-zero",
    ),
    pytest.param(
        "train --config-name srpo_reach data.batch_size=3", "not divisible", id="batch-odd"
    ),
    pytest.param(  # eight nodes refuse it: the validator's list of problems, one per line
        "train --config-name srpo_reach data.batch_size=7 rollout.group_size=3",
        "invalid DAG (8 problem(s))",
        id="batch-and-group-odd-several-problems",
    ),  # (an odd eval.batch_size is no error: evaluations pad to the workers)
    pytest.param(
        "train --config-name srpo_reach trainer.preempt_grace_s=-1",
        "preempt_grace_s",
        id="grace-negative",
    ),
    # ------------------------------------------------------------ task and init-state ids
    pytest.param(
        "train --config-name srpo_reach simulator.num_init_states=100",
        "50 init states per task",
        id="reach-init-states-100",
    ),
    pytest.param(
        "train --config-name srpo_libero simulator.num_init_states=100",
        "50 init states per task",
        id="libero-init-states-100",
    ),
    pytest.param(
        "validate --config-name srpo_libero simulator.num_tasks=12", "10 tasks", id="tasks-12"
    ),
    pytest.param(
        "train --config-name srpo_reach simulator.num_init_states=0",
        "num_init_states must be >= 1",
        id="init-states-zero",
    ),
    pytest.param("train --config-name srpo_reach data.tasks=[99]", "[99]", id="task-99"),
    pytest.param("train --config-name srpo_reach data.tasks=[]", "empty list", id="tasks-empty"),
    # ------------------------------------------------------------------------ run folders
    pytest.param(
        "eval --config-name srpo_reach run_dir={tmp}/missing", "does not exist", id="eval-missing"
    ),
    pytest.param(
        "eval --config-name srpo_reach run_dir={tmp}/empty",
        "no complete checkpoint",
        id="eval-empty-folder",
    ),
    pytest.param(
        "eval --config-name srpo_reach run_dir={tmp}/demos",
        "no complete checkpoint",
        id="eval-not-a-run",
    ),
    pytest.param("eval --config-name srpo_reach", "does not exist", id="eval-no-run-yet"),
    pytest.param(
        f"eval --config-name srpo_reach run_dir={{tmp}}/{RUN} eval.batch_size=8",
        "eval.batch_size=40",
        id="eval-batch-not-the-split",
    ),
    pytest.param(
        f"eval --config-name srpo_reach run_dir={{tmp}}/{RUN} workers.num_workers=1",
        "written by 2 worker(s)",
        id="eval-other-worker-count",
    ),
    pytest.param(
        f"eval --config-name grpo_llm run_dir={{tmp}}/{RUN}",
        "no eval_dag",
        id="eval-config-without-eval-dag",
    ),
    pytest.param(
        f"train --config-name grpo_llm run_dir={{tmp}}/{RUN}",
        "'srpo_reach'",
        id="train-into-run-of-other-config",
    ),
    pytest.param(
        f"train --config-name grpo_llm run_dir={{tmp}}/{RUN} resume=true",
        "'srpo_reach'",
        id="resume-run-of-other-config",
    ),
    pytest.param(
        f"train --config-name srpo_reach run_dir={{tmp}}/{RUN}",
        "resume=true",
        id="fresh-train-into-own-run",
    ),
    pytest.param(
        f"train --config-name srpo_reach run_dir={{tmp}}/{RUN} resume=true overwrite=true",
        "contradict",
        id="resume-and-overwrite",
    ),
    pytest.param(
        f"train --config-name srpo_reach run_dir={{tmp}}/{RUN} resume=true workers.num_workers=1",
        "written by 2 worker(s)",
        id="resume-other-worker-count",
    ),
    pytest.param(
        "train --config-name srpo_reach run_dir={tmp}/demos overwrite=true",
        "not a run folder",
        id="overwrite-a-folder-that-is-not-a-run",
    ),
    pytest.param(
        "train --config-name srpo_reach run_dir={tmp}/data/ok.parquet",
        "is a file",
        id="run-dir-is-a-file",
    ),
    pytest.param(
        "train --config-name srpo_reach resume=true run_dir={tmp}/empty",
        "no complete checkpoint",
        id="resume-empty-folder",
    ),
    pytest.param(
        "train --config-name srpo_reach resume=true",
        "no earlier run",
        id="resume-without-any-run",
    ),
    # ------------------------------------------------------------------ data and demo files
    pytest.param(
        "train --config-name grpo_llm data.train_path={tmp}/data/broken.parquet",
        "cannot be read as Parquet",
        id="corrupt-parquet",
    ),
    pytest.param(
        "validate --config-name grpo_llm data.train_path={tmp}/data/missing.parquet",
        "not found",
        id="missing-parquet",
    ),
    pytest.param(
        "train --config-name grpo_llm data.train_path={tmp}/empty",
        "{tmp}/empty",
        id="data-path-is-a-folder",
    ),
    pytest.param(
        "train --config-name sft_libero data.paths=[{tmp}/empty]", "no *.hdf5", id="demos-empty"
    ),
    pytest.param(
        "train --config-name sft_libero data.paths=[{tmp}/missing]",
        "does not exist",
        id="demos-missing",
    ),
    pytest.param(
        "validate --config-name sft_libero data.paths=[{tmp}/data/broken.parquet]",
        "cannot be read as HDF5",
        id="demos-not-hdf5",
    ),
    pytest.param("train --config-name sft_libero data.paths=[]", "paths is empty", id="demos-none"),
    pytest.param(
        "train --config-name sft_libero data.paths=[{tmp}/demos] simulator.options.suite=libero_object",
        "'libero_spatial'",
        id="demos-of-another-suite",
    ),
    pytest.param(
        "train --config-name srpo_reach +models.actor.init_from={tmp}/missing",
        "does not exist",
        id="init-from-missing",
    ),
    pytest.param(
        f"train --config-name srpo_reach +models.actor.init_from={{tmp}}/{RUN}/checkpoints/step_000001",
        "models.actor.init_from",
        id="init-from-checkpoint-without-models",
    ),
    # ------------------------------------------------------------- override syntax (hydra)
    pytest.param(
        "train --config-name srpo_reach trainer.total_steps",
        "trainer.total_steps",
        id="override-without-equals",
    ),
    pytest.param(
        "train --config-name srpo_reach policy=nonsense",
        "policy",
        id="override-of-a-group-not-in-defaults",
    ),
    pytest.param(
        "validate --config-name srpo_reach ~trainer",
        "trainer",
        id="deleted-trainer-section",
    ),
    # ----------------------------------------------------------------------------- export
    pytest.param("export {tmp}/missing --out {tmp}/out", "does not exist", id="export-no-run"),
    pytest.param(
        "export {tmp}/empty --out {tmp}/out", "has no config.yaml", id="export-not-a-run-folder"
    ),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}}/out",
        "cannot load models.actor",
        id="export-checkpoint-without-models",
    ),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}}/out --step 7", "step_000001", id="export-no-such-step"
    ),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}}/out --critic",
        "has no models.critic",
        id="export-no-critic",
    ),
    pytest.param(f"export {{tmp}}/{RUN} --out {{tmp}}/data", "--force", id="export-out-not-empty"),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}}/data/ok.parquet", "is a file", id="export-out-a-file"
    ),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}} --force",
        "contains the run folder",
        id="export-force-over-the-run",
    ),
    pytest.param(
        f"export {{tmp}}/{RUN} --out {{tmp}}/{RUN}/checkpoints --force",
        "lies inside the run folder",
        id="export-force-into-the-run",
    ),
    # ------------------------------------------------------------------------------ demos
    pytest.param(
        "demos --suite libero_object --image-size 0 --out {tmp}/out",
        "--image-size 0",
        id="demos-image-size-zero",
    ),
    pytest.param(
        "demos --suite libero_object --image-size -3 --out {tmp}/demos",
        "--image-size -3",
        id="demos-image-size-negative",
    ),
    pytest.param(
        "demos --suite nonsense --out {tmp}/out",
        "'nonsense'",
        id="demos-unknown-suite",
        marks=LIBERO,
    ),
    pytest.param(
        "demos --suite libero_object --tasks 99 --out {tmp}/out",
        "[99]",
        id="demos-task-99",
        marks=LIBERO,
    ),
    pytest.param(
        "demos --suite libero_object --tasks 0 --init-states 999 --out {tmp}/out",
        "[999]",
        id="demos-init-state-999",
        marks=LIBERO,
    ),
    pytest.param(
        "demos --suite libero_object --tasks 0 --out {tmp}/data/ok.parquet",
        "is a file",
        id="demos-out-is-a-file",
        marks=LIBERO,
    ),
]


@pytest.mark.parametrize(("command", "word"), CASES)
def test_bad_input_is_one_error_line_and_changes_nothing(user_files, capsys, command, word):
    _run_refused(user_files, capsys, command, word)


@pytest.mark.parametrize(
    "command",
    [
        pytest.param("train", id="no-config-name"),
        pytest.param("eval --config-name", id="config-name-without-value"),
        pytest.param("demos --suite libero_object", id="demos-without-out"),
        pytest.param("frobnicate --config-name srpo_reach", id="unknown-command"),
        pytest.param("validate --config-name srpo_reach --bogus-flag", id="unknown-flag"),
        pytest.param("plan --config-name srpo_reach --no-progress", id="flag-of-another-command"),
        pytest.param("demos --tasks x --out {tmp}/out", id="demos-task-not-an-id"),
        pytest.param("demos --image-size abc --out {tmp}/out", id="demos-image-size-not-int"),
        pytest.param("export --out {tmp}/out", id="export-without-run"),
        pytest.param(f"export {{tmp}}/{RUN}", id="export-without-out"),
        pytest.param(f"export {{tmp}}/{RUN} --out {{tmp}}/out --step x", id="export-step-not-int"),
    ],
)
def test_a_malformed_command_line_gets_argparse_usage_and_changes_nothing(
    user_files, capsys, command
):
    """argparse refuses before ``main`` runs: its usage and one ``error:`` line, exit 2."""
    before = _snapshot(user_files)
    with pytest.raises(SystemExit) as exit_info:
        main(_argv(command, user_files))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err and err.startswith("usage: embodied-rl"), err
    lines = _error_lines(err)
    assert [line for line in lines if ": error: " in line] == [lines[-1]], err
    assert lines[-1].startswith("embodied-rl"), err
    assert _snapshot(user_files) == before
    assert not (user_files / "outputs").exists()


@pytest.mark.libero
@pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO is not installed")
def test_demos_out_holding_the_task_file_is_refused_and_changes_nothing(user_files, capsys):
    """``demos --out <folder with the task's demo file>``: refused before any episode runs."""
    from simulators.libero.demos import demo_path, suite_tasks

    out = user_files / "libero_demos"
    write_synthetic_demos(out, tasks=1, demos=1)
    (out / "task_0_demo.hdf5").rename(demo_path(out, suite_tasks("libero_object")[0]))
    _run_refused(
        user_files,
        capsys,
        "demos --suite libero_object --tasks 0 --no-progress --out {tmp}/libero_demos",
        "--overwrite",
    )


def test_demos_without_libero_installed_is_one_error_line(user_files, capsys, monkeypatch):
    """A fresh install without LIBERO: ``demos`` should say how to install it, in one line.

    ``None`` in ``sys.modules`` makes Python's import fail as if the package were absent
    (LIBERO itself is not replaced by anything)."""
    for name in ("libero", "libero.libero", "libero.libero.benchmark", "libero.libero.envs"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "libero.libero.envs.env_wrapper", None)
    _run_refused(
        user_files, capsys, "demos --suite libero_object --tasks 0 --out {tmp}/out", "install"
    )
