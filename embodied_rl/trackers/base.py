"""What the driver hands a tracker, and what every tracker implements."""

from __future__ import annotations

import abc
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied_rl.runtime.config_errors import ConfigError

# How a run ended, as the trackers' ``finish`` takes it.
FINISHED, FAILED, KILLED = "finished", "failed", "killed"


class TrackerError(ConfigError):
    """A tracker cannot start; the message names the setting to change."""


@dataclass(frozen=True)
class RunInfo:
    """The run a tracker records.

    Attributes:
        run_dir: the run folder (an ``embodied-rl eval`` writes its own, under the run's).
        name: the run config's ``name``.
        mode: ``train`` or ``eval``.
        config: the resolved config as plain data, ``run_dir`` set to the folder.
        config_file: the resolved config the launcher saved (``config.yaml``).
        previous: what an earlier attempt of this run recorded in ``trackers.json`` (a
            ``resume=true`` run continues its tracker runs), by tracker name.
    """

    run_dir: Path
    name: str
    mode: str
    config: Mapping[str, Any]
    config_file: Path
    previous: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """``<config name>/<run folder name>``: how the tracker names the run."""
        return f"{self.name}/{self.run_dir.name}"


@dataclass(frozen=True)
class EvalReport:
    """One evaluation the ``eval.report`` node wrote (``<run_dir>/<name>/step_N/``).

    Attributes:
        name: the evaluation's name (its metric prefix and folder, ``eval``).
        step: ``N``, the steps trained before it (the report folder's number).
        row: the step of the ``metrics.jsonl`` row that holds its success metrics.
        table: one ``results.jsonl`` record per task (task, instruction, episodes,
            successes, success_rate, suite).
        folder: the report folder: report.md/html, success_by_task.png, the MP4 videos.
    """

    name: str
    step: int
    row: int
    table: list[dict[str, Any]]
    folder: Path

    @property
    def videos(self) -> list[Path]:
        return sorted(self.folder.glob("*.mp4"))

    def table_rows(self) -> list[list[Any]]:
        """The success table, one list per task in the order of :data:`TABLE_COLUMNS`."""
        return [[row.get(column) for column in TABLE_COLUMNS] for row in self.table]


TABLE_COLUMNS = ("task", "instruction", "episodes", "successes", "success_rate")


class Tracker(abc.ABC):
    """One experiment tracker's run. Calls come from the driver, in step order."""

    name: str

    @abc.abstractmethod
    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """The reduced metrics of ``step`` (a ``metrics.jsonl`` row)."""

    @abc.abstractmethod
    def log_eval(self, report: EvalReport) -> None:
        """An evaluation's success table and videos, at the step of its metrics row."""

    @abc.abstractmethod
    def finish(self, status: str) -> None:
        """End the tracker's run (``FINISHED``, ``FAILED`` or ``KILLED``) and stop its services."""

    @abc.abstractmethod
    def record(self) -> dict[str, Any]:
        """What ``trackers.json`` keeps: the ids that find this run (and resume it)."""


def check_writable(folder: Path, key: str) -> None:
    """Create ``folder`` and a file in it, or raise :class:`TrackerError` naming ``key``.

    Trackers fall back to a temporary directory (W&B) or fail late when their folder is not
    writable; checking first turns that into a start-up error.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as err:
        raise TrackerError(
            f"{key}: cannot write to {folder} ({type(err).__name__}: {err.strerror or err})",
            f"set {key} to a writable directory (null: inside the run directory)",
        ) from None
