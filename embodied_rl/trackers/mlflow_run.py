"""The MLflow tracker (``mlflow`` in ``trainer.loggers``; ``trainer.mlflow``).

By default a local file store inside the run directory, ``file:<run_dir>/mlruns``: no server
and no network; ``mlflow ui --backend-store-uri <run_dir>/mlruns`` shows it (the UI needs the
full ``mlflow`` package, the runs need only ``mlflow-skinny``). MLflow 3 refuses file stores
unless ``MLFLOW_ALLOW_FILE_STORE`` is set; the tracker sets it (a value the user set wins).

Every call goes through ``MlflowClient`` with an explicit run id: no fluent "active run"
state in the driver. The config is logged as the run's ``config.yaml`` artifact and as
flattened params (first attempt only: MLflow refuses to change a param, and a resumed run may
change e.g. ``trainer.total_steps``); evaluations as artifacts under ``<name>/step_N/``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from embodied_rl.runtime.config_compose import one_line
from embodied_rl.runtime.config_sections import MlflowConfig
from embodied_rl.trackers.base import (
    FAILED,
    FINISHED,
    TABLE_COLUMNS,
    EvalReport,
    RunInfo,
    Tracker,
    TrackerError,
    check_writable,
)

STORE_FOLDER = "mlruns"
RUN_DIR_TAG = "embodied_rl.run_dir"
_STATUS = {FINISHED: "FINISHED", FAILED: "FAILED"}  # anything else: KILLED
_BATCH = 100  # MLflow's log_batch takes at most 100 params (and 1000 metrics) per call
_PARAM_VALUE_LIMIT = 6000
_INVALID_NAME = re.compile(r"[^\w./\- :]")  # MLflow keys: alphanumerics, _ - . / space :


def metric_key(name: str, file_store: bool) -> str:
    """``name`` as an MLflow key: characters MLflow refuses (``time/transfer/a->b``'s ``>``)
    become ``_``, and on a file store ``/`` becomes ``.``.

    A file store keeps each metric in a file at the path its name spells, so ``a/b`` cannot
    be a metric beside ``a/b/c``, and runs log both (``time/rollout``,
    ``time/rollout/policy``). Other stores keep the names as ``metrics.jsonl`` has them.
    """
    name = _INVALID_NAME.sub("_", name)
    return name.replace("/", ".") if file_store else name


class MlflowTracker(Tracker):
    """One MLflow run per training run (a resumed run continues it: same run id)."""

    name = "mlflow"

    def __init__(self, settings: MlflowConfig, info: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri(settings.tracking_uri, info.run_dir)
        self.file_store = self.uri.startswith("file:")
        if self.file_store:
            check_writable(_file_store(self.uri), "trainer.mlflow.tracking_uri")
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        previous = info.previous.get(self.name, {})
        if previous.get("tracking_uri") != self.uri:
            previous = {}  # an earlier attempt logged elsewhere: a new run here
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            self.run_id = previous.get("run_id") or self._new_run(settings, info)
            if previous:
                self.client.update_run(self.run_id, status="RUNNING")
            self.client.log_artifact(self.run_id, str(info.config_file))
        except Exception as err:  # noqa: BLE001 - MlflowException, OSError, requests errors
            raise TrackerError(
                f"trainer.loggers: MLflow could not start a run at {self.uri} "
                f"({type(err).__name__}: {one_line(err)})",
                "set trainer.mlflow.tracking_uri to a writable file: folder or a reachable "
                "tracking server (null: inside the run directory), or remove mlflow from "
                "trainer.loggers",
            ) from None

    def _new_run(self, settings: MlflowConfig, info: RunInfo) -> str:
        name = settings.experiment or info.name
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(name)
        )
        tags = {RUN_DIR_TAG: str(info.run_dir), "embodied_rl.mode": info.mode}
        tags["mlflow.note.content"] = f"embodied_rl run folder: {info.run_dir}"
        run_id = self.client.create_run(experiment_id, run_name=info.title, tags=tags).info.run_id
        self._log_params(run_id, info.config)
        return run_id

    def _log_params(self, run_id: str, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_PARAM_VALUE_LIMIT]) for key, value in _flat(config)]
        for start in range(0, len(params), _BATCH):
            self.client.log_batch(run_id, params=params[start : start + _BATCH])

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(metric_key(k, self.file_store), float(v), now, step) for k, v in values.items()
        ]
        for start in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH])

    def log_eval(self, report: EvalReport) -> None:
        where = f"{report.name}/{report.folder.name}"
        table = {"columns": list(TABLE_COLUMNS), "data": report.table_rows()}
        self.client.log_dict(self.run_id, table, f"{where}/success_table.json")
        # report.md / .html, the chart and the videos, as the run folder holds them
        self.client.log_artifacts(self.run_id, str(report.folder), where)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, _STATUS.get(status, "KILLED"))

    def record(self) -> dict[str, Any]:
        return {"tracking_uri": self.uri, "run_id": self.run_id}


def _flat(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``("trainer.total_steps", 60)`` pairs of a nested config (lists stay whole)."""
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            yield from _flat(value, f"{prefix}{key}.")
        else:
            yield _INVALID_NAME.sub("_", f"{prefix}{key}"), value


def tracking_uri(setting: str | None, run_dir: Path) -> str:
    """The store's URI: ``setting``, a plain path as a ``file:`` URI, ``<run_dir>/mlruns``
    when unset."""
    uri = setting or str(run_dir / STORE_FOLDER)
    return Path(uri).expanduser().resolve().as_uri() if not urlparse(uri).scheme else uri


def _file_store(uri: str) -> Path:
    """The folder of a ``file:`` tracking URI."""
    return Path(unquote(urlparse(uri).path))
