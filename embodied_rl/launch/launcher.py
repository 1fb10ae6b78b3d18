"""``launch``: the entry of ``embodied-rl train`` and ``eval`` once the config is composed.

Before anything starts it validates the config, resolves and checks the run folder
(``runtime/run_folder.py``) and saves the resolved config there; it opens the trackers of
``trainer.loggers`` before Ray starts, hands the run to ``drive.py``, and ends the trackers'
runs as the run ended.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from embodied_rl.launch.drive import run_workers
from embodied_rl.launch.outcome import RunInterrupted, RunResult
from embodied_rl.runtime.config import validate_config
from embodied_rl.runtime.config_compose import REPO_ROOT
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.path_guard import check_apart, config_inputs
from embodied_rl.runtime.run_folder import (
    check_eval_source,
    create_run_folder,
    eval_output_folder,
    prepare_train_folder,
    record_command,
)
from embodied_rl.runtime.run_lock import RunLock, check_not_held
from embodied_rl.trackers.base import FAILED, FINISHED, KILLED
from embodied_rl.trackers.feed import open_trackers

APART_FIX = (
    "choose a run_dir apart from the inputs (unset, it is outputs/<name>/<time>), or move the "
    "input out of the run folder"
)


def resolve_run_dir(cfg: DictConfig, mode: str = "train") -> Path:
    """Where the run lives.

    ``run_dir`` if set. Otherwise ``resume=true`` (and ``eval``) take the newest run of this
    config that has checkpoints; a new training run gets a fresh timestamped directory (an
    eval with no earlier run gets one too, which ``run_folder.check_eval_source`` refuses).
    """
    if cfg.get("run_dir"):
        return Path(cfg.run_dir).resolve()
    root = Path(cfg.get("output_root") or "outputs").resolve() / str(cfg.name)
    runs = sorted(p for p in root.glob("*") if (p / "checkpoints").is_dir())
    if cfg.get("resume") or mode == "eval":
        if runs:
            return runs[-1]
        if mode != "eval":
            raise ConfigError(
                f"resume=true but no earlier run with checkpoints under {root}",
                "set run_dir=<a run folder with checkpoints/>, or drop resume=true to start a "
                "new run",
            )
    return root / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def _clear_status_files(run_dir: Path) -> None:
    """Remove the status files of an earlier attempt (a resumed run reuses its run_dir).

    A worker that dies before it writes its own file must not be blamed on the node an
    earlier process of the same rank died in.
    """
    for path in (run_dir / ".status").glob("rank_*.json"):
        path.unlink(missing_ok=True)


def launch(
    cfg: DictConfig, show_progress: bool = True, mode: str = "train", command: str | None = None
) -> RunResult:
    """Validate, start the workers, run to completion, and return rank 0's final metrics.

    ``mode="eval"`` runs the evaluation DAG once on the run's newest checkpoint and writes
    everything to a new folder ``<run_dir>/<eval.name>_<timestamp>/`` (``RunResult.run_dir``).
    The run folder is checked first (``run_folder.py``: one config per folder, ``resume``,
    ``overwrite``); a refused command has written nothing. ``command`` (the CLI's command
    line) is recorded in the folder's ``command.txt``. The trackers of ``trainer.loggers``
    start before Ray does (one that cannot start stops the command there) and end with the
    run, marked finished, failed or killed.
    """
    validate_config(cfg, mode)
    run_dir = resolve_run_dir(cfg, mode)
    inputs = config_inputs(OmegaConf.to_container(cfg, resolve=True), REPO_ROOT)
    if mode == "eval":
        check_eval_source(cfg, run_dir)
        check_not_held(run_dir)  # a live training may remove the checkpoint being read
        checkpoints = run_dir / "checkpoints"
        run_dir = eval_output_folder(cfg, run_dir)  # the eval writes only here
        check_apart("the evaluation's folder", run_dir, inputs, APART_FIX)
    else:
        check_apart("run_dir", run_dir, inputs, APART_FIX)
        check_not_held(run_dir)  # before overwrite=true could empty a live run's folder
        cfg = prepare_train_folder(cfg, run_dir)
        checkpoints = run_dir / "checkpoints"
    create_run_folder(run_dir)
    lock = RunLock(checkpoints.parent, command).acquire()  # the run's folder: one writer
    try:
        return _run_in(cfg, run_dir, checkpoints, mode, show_progress, command)
    finally:
        lock.release()


def _run_in(
    cfg: DictConfig,
    run_dir: Path,
    checkpoints: Path,
    mode: str,
    show_progress: bool,
    command: str | None,
) -> RunResult:
    """Save the config and command, start the trackers, run the workers (see :func:`launch`)."""
    _clear_status_files(run_dir)
    config_file = run_dir / ("config.yaml" if mode == "train" else "eval_config.yaml")
    OmegaConf.save(cfg, config_file, resolve=True)
    if command is not None:
        record_command(run_dir, command)
    feed = open_trackers(cfg, run_dir, mode, config_file)
    status = FAILED
    try:
        result = run_workers(cfg, run_dir, checkpoints, mode, show_progress, feed)
        result.trackers = {} if feed is None else feed.records
        status = FINISHED
        return result
    except (RunInterrupted, KeyboardInterrupt):
        status = KILLED
        raise
    finally:
        if feed is not None:
            feed.close(status)
