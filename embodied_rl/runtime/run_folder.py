"""A run folder belongs to one config: the checks the driver makes before it writes anything.

``embodied-rl train`` and ``eval`` call :func:`prepare_train_folder` /
:func:`check_eval_source` after the config is validated and before the run folder is created,
Ray is started or a file is written, so a refused command leaves the user's files as they were.

What makes two configs "the same run" (:func:`run_identity`): the run ``name``, the ids and
types of the training DAG's nodes, and each model's policy type and architecture
``options``. Everything else may change between the attempts of one run (``run_dir``,
``resume``, ``overwrite``, ``trainer.total_steps``, time limits, workers, Ray, evaluation,
learning rates, batch sizes ...): the checkpoint and loader-state checks of the worker refuse
the changes that cannot be resumed.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from embodied_rl.checkpoint import latest_checkpoint, read_manifest
from embodied_rl.dag.spec import DagSpec
from embodied_rl.runtime.config import (
    check_pretraining_suite,
    dag_from_config,
    section,
    trained_suites,
)
from embodied_rl.runtime.config_errors import ConfigError, plain_value
from embodied_rl.runtime.run_lock import LOCK_FILE

SAVED_CONFIG = "config.yaml"
COMMAND_FILE = "command.txt"  # the command line of every attempt (embodied-rl export's card)


def run_identity(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """What makes a config a different run: name, DAG node ids/types, models' architecture."""
    dag = plain_value(cfg, "dag") or {}
    models = plain_value(cfg, "models") or {}
    return {
        "name": plain_value(cfg, "name"),
        "dag nodes": [(n.get("id"), n.get("type")) for n in dag.get("nodes") or []],
        **{
            f"models.{name}": (spec.get("policy"), spec.get("options"))
            for name, spec in sorted(models.items())
            if isinstance(spec, Mapping)
        },
    }


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The identity keys whose values differ (present in one only counts too)."""
    return [key for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]


def _saved_identity(run_dir: Path) -> dict[str, Any] | None:
    """The identity of the run saved in ``run_dir/config.yaml`` (``None``: no such file).

    Raises:
        ConfigError: the file exists but cannot be read as a config.
    """
    path = run_dir / SAVED_CONFIG
    if not path.is_file():
        return None
    try:
        return run_identity(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
    except Exception as err:  # noqa: BLE001 - yaml and omegaconf raise several types
        raise ConfigError(
            f"cannot read {path}: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            "point run_dir at a run folder written by embodied-rl, or choose a new run_dir",
        ) from None


def check_same_run(cfg: DictConfig, run_dir: Path, fix: str) -> None:
    """Refuse when ``run_dir`` holds a run of another config (compared by :func:`run_identity`).

    Raises:
        ConfigError: naming both configs' names, what differs, and ``fix``.
    """
    saved = _saved_identity(run_dir)
    if saved is None:
        return
    differ = _differences(saved, run_identity(cfg))
    if differ:
        raise ConfigError(
            f"run_dir {run_dir} holds a run of config {saved.get('name')!r} (its {SAVED_CONFIG}),"
            f" not of this config {cfg.get('name')!r}: they differ in {', '.join(differ)}",
            fix,
        )


def _has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir/checkpoints`` holds a sealed checkpoint (the worker checksums it)."""
    return latest_checkpoint(run_dir / "checkpoints", checksums=False) is not None


def check_world_size(cfg: DictConfig, run_dir: Path) -> None:
    """The newest checkpoint must have been written by ``workers.num_workers`` ranks: shards
    cannot be re-split, and the worker would find out only after the run folder was written.

    Raises:
        ConfigError: naming both worker counts.
    """
    newest = latest_checkpoint(run_dir / "checkpoints", checksums=False)
    try:
        saved = int(read_manifest(newest)["world_size"]) if newest else None
    except (OSError, ValueError, KeyError, TypeError):
        return  # an unreadable manifest is the checkpoint checks' to report
    workers = section(cfg, "workers").num_workers
    if saved is not None and saved != workers:
        raise ConfigError(
            f"the newest checkpoint {newest} was written by {saved} worker(s), this config "
            f"has workers.num_workers={workers}",
            f"set workers.num_workers={saved}",
        )


def _is_empty(run_dir: Path) -> bool:
    """Whether ``run_dir`` is missing or an empty folder (a file there is refused); a stale
    run lock alone (a driver that died right after taking it) counts as empty."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run_dir {run_dir} is a file, not a folder", "choose a folder path")
    return not run_dir.exists() or all(p.name == LOCK_FILE for p in run_dir.iterdir())


def prepare_train_folder(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """Check ``run_dir`` for a training run, and with ``overwrite=true`` empty it.

    - ``resume=true``: the folder must hold a checkpoint and, where it has a saved config,
      one of the same run (:func:`run_identity`). A run of the same config that stopped
      before its first checkpoint has nothing to continue from: it starts again from its
      first step in the same folder (a requeued job that always passes ``resume=true``, the
      hint of a run stopped that early);
    - a fresh run: the folder must be new or empty, unless ``overwrite=true``, which removes
      everything in it (the old run's config, metrics, checkpoints, evaluations and any other
      file there); only a run folder (one with a saved ``config.yaml``) is overwritten.

    Returns:
        ``cfg``, or a copy with ``resume=false`` where a resume starts from the first step.

    Raises:
        ConfigError: the folder cannot be used; nothing has been written or removed.
    """
    resume, overwrite = bool(cfg.get("resume")), bool(cfg.get("overwrite"))
    if resume and overwrite:
        raise ConfigError(
            "resume=true and overwrite=true contradict each other",
            "resume=true continues the run in run_dir; overwrite=true replaces it: set one",
        )
    if resume and _stopped_before_a_checkpoint(cfg, run_dir):
        print(
            f"note: {run_dir} holds this run stopped before its first checkpoint; nothing to "
            "resume from, so it starts again from its first step there",
            file=sys.stderr,
        )
        remove_contents(run_dir)
        fresh = cfg.copy()
        with open_dict(fresh):
            fresh.resume = False
        return fresh
    if resume:
        _check_resumable(cfg, run_dir)
    elif not _is_empty(run_dir):
        _check_replaceable(cfg, run_dir, overwrite)
        remove_contents(run_dir)
    return cfg


def _stopped_before_a_checkpoint(cfg: DictConfig, run_dir: Path) -> bool:
    """A folder of this very run (its saved config) with no complete checkpoint."""
    if not (run_dir / SAVED_CONFIG).is_file() or _has_checkpoint(run_dir):
        return False
    _check_same_run_to_resume(cfg, run_dir)
    return True


def _check_same_run_to_resume(cfg: DictConfig, run_dir: Path) -> None:
    check_same_run(
        cfg,
        run_dir,
        f"resume that run with the config it was trained with, or point run_dir at a run of "
        f"{cfg.get('name')!r}",
    )


def _check_resumable(cfg: DictConfig, run_dir: Path) -> None:
    _check_same_run_to_resume(cfg, run_dir)
    if not _has_checkpoint(run_dir):
        raise ConfigError(
            f"resume=true but {run_dir / 'checkpoints'} holds no complete checkpoint",
            "run without resume=true and with overwrite=true to start that run afresh, or "
            "point run_dir at a run with checkpoints",
        )
    check_world_size(cfg, run_dir)
    check_same_batches(cfg, run_dir)


def _node_batch_sizes(plain: Mapping[str, Any]) -> dict[str, Any]:
    """``{node id: its config's batch_size}`` of the training DAG's nodes that have one."""
    nodes = (plain.get("dag") or {}).get("nodes") or []
    return {
        node["id"]: node["config"]["batch_size"]
        for node in nodes
        if isinstance(node.get("config"), Mapping) and "batch_size" in node["config"]
    }


def check_same_batches(cfg: DictConfig, run_dir: Path) -> None:
    """``resume=true`` with the batch sizes the run was trained with: the checkpoint's loader
    positions count batches of that size (the worker would refuse them only after the run's
    config had been rewritten).

    Raises:
        ConfigError: naming the node, both sizes and the saved config.
    """
    path = run_dir / SAVED_CONFIG
    if not path.is_file():
        return
    saved = _node_batch_sizes(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    current = _node_batch_sizes(OmegaConf.to_container(cfg, resolve=True))
    for node, size in current.items():
        if node in saved and saved[node] != size:
            raise ConfigError(
                f"resume=true: node {node!r} has batch_size {size}, but the run in {run_dir} "
                f"was trained with {saved[node]} ({path}); its checkpoint's data position counts "
                f"batches of {saved[node]}",
                f"resume with batch size {saved[node]} (data.batch_size in the shipped configs), "
                "or start a new run",
            )


def _check_replaceable(cfg: DictConfig, run_dir: Path, overwrite: bool) -> None:
    """A fresh run into a non-empty folder: only ``overwrite=true`` on a run folder may."""
    if not (run_dir / SAVED_CONFIG).is_file():
        raise ConfigError(
            f"run_dir {run_dir} is not empty and is not a run folder (no {SAVED_CONFIG})",
            "choose a new or empty run_dir, or leave run_dir unset for a fresh timestamped one",
        )
    if not overwrite:
        check_same_run(
            cfg, run_dir, "choose a new run_dir, or add overwrite=true to replace that run"
        )
        if _failed_start(run_dir):
            print(
                f"note: {run_dir} holds a start of this run that failed before its first step "
                "(no checkpoint, no metrics); starting it again there",
                file=sys.stderr,
            )
            return
        raise ConfigError(
            f"run_dir {run_dir} already holds a run of {cfg.get('name')!r}; a fresh run would "
            "mix its metrics and checkpoints with the old ones",
            "add resume=true to continue it, overwrite=true to replace it, or choose another "
            "run_dir",
        )


def _failed_start(run_dir: Path) -> bool:
    """A run that wrote its config but never completed a step: no checkpoint, no metrics row
    (a plain retry of the same command may reuse its folder; nothing in it was trained)."""
    metrics = run_dir / "metrics.jsonl"
    no_rows = not metrics.is_file() or not metrics.read_text().strip()
    return no_rows and not (run_dir / "checkpoints").exists()


def remove_contents(run_dir: Path) -> None:
    """Remove every entry of the run folder, not the folder itself (``overwrite=true``, and a
    fresh run whose trackers could not start)."""
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def check_eval_source(cfg: DictConfig, run_dir: Path) -> None:
    """``embodied-rl eval`` evaluates a trained run: it must exist, hold a checkpoint, be of
    this config, and the evaluation must cover each (task, init state) pair once.

    Raises:
        ConfigError: naming the folder (or batch size) and the fix; nothing was written.
    """
    if not run_dir.is_dir() or not _has_checkpoint(run_dir):
        what = "does not exist" if not run_dir.is_dir() else "holds no complete checkpoint"
        raise ConfigError(
            f"eval: run_dir {run_dir} {what}, so there is no trained policy to evaluate",
            f"train first (embodied-rl train --config-name {cfg.get('name')} ...), or point "
            "run_dir at a run folder with checkpoints/",
        )
    check_same_run(
        cfg, run_dir, "evaluate it with the config it was trained with, or choose another run_dir"
    )
    check_world_size(cfg, run_dir)
    num_workers = section(cfg, "workers").num_workers
    evaluation = dag_from_config(cfg, num_workers, key="eval_dag")  # once, for both checks
    check_eval_covers_split(evaluation)
    check_eval_suite(evaluation, num_workers, run_dir)


def check_eval_suite(evaluation: DagSpec, num_workers: int, run_dir: Path) -> None:
    """The evaluation asks a pretraining-only suite (LIBERO-90) only of a run trained on it,
    the suites trained on read from the run's saved ``config.yaml`` (overrides of this
    command, e.g. ``simulator.options.suite=libero_90``, do not change what it was trained on).

    Raises:
        ConfigError: naming the suite asked, the suites trained on and the fix.
    """
    if not (run_dir / SAVED_CONFIG).is_file():  # a checkpoint copied without its config
        return
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / SAVED_CONFIG), resolve=True)
    trained = trained_suites(dag_from_config(saved, num_workers))
    check_pretraining_suite(evaluation, trained, f"its {SAVED_CONFIG} in {run_dir}")


def check_eval_covers_split(dag: DagSpec) -> None:
    """A standalone evaluation walks its DAG once: each source node that lists its rows
    (``data.tasks``: the (task, init state) pairs of the split) must take them all in one
    batch, so each pair is evaluated exactly once.

    Raises:
        ConfigError: naming the number of pairs and the batch size to set.
    """
    for node in dag.nodes:
        rows = getattr(node.config, "rows", None)
        if not node.type.source or rows is None:
            continue
        pairs = len(rows())
        if node.config.batch_size != pairs:
            raise ConfigError(
                f"eval: eval.batch_size={node.config.batch_size} but the evaluated split has "
                f"{pairs} (task, init state) pairs (eval_dag node {node.id!r}); a standalone "
                "evaluation covers each pair exactly once, in one batch",
                f"set eval.batch_size={pairs}, or select fewer tasks (data.tasks=[...])",
            )


def eval_output_folder(cfg: DictConfig, run_dir: Path) -> Path:
    """A new folder for a standalone evaluation: ``<run_dir>/<eval.name>_<timestamp>/``.

    The training run's own ``<eval.name>/`` folder (its rows and videos) is never written.
    """
    name = section(cfg, "eval").name
    return run_dir / f"{name}_{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"


def create_run_folder(run_dir: Path) -> None:
    """Create ``run_dir`` (and its parents), or refuse in one line: below a file, on a
    read-only or full file system, without permission.

    Raises:
        ConfigError: naming the folder, the system's reason and the fix.
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"")  # a folder that exists but cannot be written to fails here
        probe.unlink()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(run_dir) else ""
        raise ConfigError(
            f"cannot create or write the run folder {run_dir}: {reason}{where}",
            "set run_dir (or output_root) to a writable folder",
        ) from None


def record_command(run_dir: Path, command: str) -> None:
    """Append the command line that started this attempt to ``<run_dir>/command.txt``.

    One line per attempt, ``<ISO time>  <command>``: the first is the training command, later
    ones resume it (``embodied-rl export`` writes them into the model card).
    """
    stamp = datetime.now().isoformat(timespec="seconds")
    with open(run_dir / COMMAND_FILE, "a", encoding="utf-8") as f:
        f.write(f"{stamp}  {command}\n")
