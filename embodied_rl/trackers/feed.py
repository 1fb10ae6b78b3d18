"""The driver's side of the trackers: open them, feed them from the run folder, close them.

Rank 0's worker appends one ``metrics.jsonl`` row per step, after the step's evaluation (if
any) wrote its report (``<run_dir>/<name>/step_N/`` and a line per task in
``<run_dir>/<name>/results.jsonl``). At every status poll :meth:`TrackerFeed.poll` reads what
is new and sends it on, in step order: each row's scalars, then the evaluations whose
success metrics that row holds. The driver never receives more from the workers than before;
the run folder is the hand-over (it is shared by the ranks already: checkpoints, status
files). ``trackers.json`` in the run folder names each tracker's run, so the folder links to
them, and a ``resume=true`` run continues the same tracker runs.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from embodied_rl.eval_episodes import RESULTS_FILE, step_folder
from embodied_rl.metrics import METRICS_FILE, MetricsTail, read_metrics
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import section
from embodied_rl.runtime.config_sections import TRACKERS
from embodied_rl.runtime.run_folder import remove_contents
from embodied_rl.trackers.base import FAILED, KILLED, EvalReport, RunInfo, Tracker, TrackerError

logger = logging.getLogger(__name__)

TRACKERS_FILE = "trackers.json"


def report_row(report_step: int, mode: str) -> int:
    """The ``metrics.jsonl`` step whose row holds an evaluation's success metrics.

    Training logs the evaluation after step ``s`` (report ``step_{s+1}``) with step ``s``'s
    metrics, and the one before the first step (``eval.at_start``, ``step_0``) with step 0's;
    ``embodied-rl eval`` logs its one evaluation with the checkpoint's step (worker.py).
    """
    return report_step if mode == "eval" else max(report_step - 1, 0)


class TrackerFeed:
    """Sends the run folder's new metrics rows and evaluation reports to the trackers.

    A tracker that raises is reported once (a warning naming it and the error) and gets
    nothing more; the others and the training go on.
    """

    def __init__(
        self,
        trackers: Sequence[Tracker],
        run_dir: Path,
        eval_names: Sequence[str],
        mode: str,
    ) -> None:
        self.trackers = list(trackers)
        self.run_dir, self.eval_names, self.mode = run_dir, tuple(eval_names), mode
        self.records = {t.name: t.record() for t in self.trackers}
        self._metrics = MetricsTail(run_dir / METRICS_FILE)
        self._start_step: int | None = None  # set once the workers are set up
        self._seen: set[tuple[str, int]] = set()
        self._pending: list[EvalReport] = []
        self._write_record()

    def start(self, start_step: int) -> None:
        """Rows and reports of steps before ``start_step`` were sent by an earlier attempt."""
        self._start_step = start_step

    def poll(self) -> None:
        """Send every complete row written since the last poll, and the evaluations it holds.

        Nothing before :meth:`start`: until the workers are set up, the log may still hold
        rows an interrupted attempt wrote past its checkpoint (rank 0 drops them then).
        """
        if self._start_step is None:
            return
        rows = self._metrics.read()
        # After the rows: a row's evaluation is written before it, so it is found now too.
        self._pending += self._new_reports()
        for row in rows:
            step = int(row.pop("step"))
            if step < self._start_step:
                continue
            self._send("log_metrics", step, row)
            for report in [r for r in self._pending if r.row <= step]:
                self._send("log_eval", report)
                self._pending.remove(report)

    def close(self, status: str) -> None:
        """Send what is left (an evaluation whose row was never written too), end the runs."""
        self.poll()
        for report in self._pending:
            self._send("log_eval", report)
        self._pending.clear()
        for tracker in list(self.trackers):
            self._send_to(tracker, "finish", status)
        self._write_record()

    def _new_reports(self) -> list[EvalReport]:
        """Reports whose ``results.jsonl`` lines appeared since the last poll.

        ``eval.report`` writes ``results.jsonl`` last and whole (a rename), after the report
        folder and, before it, every rank's videos: a step listed there is complete.
        """
        found = []
        for name in self.eval_names:
            by_step: dict[int, list[dict[str, Any]]] = {}
            for record in read_metrics(self.run_dir / name / RESULTS_FILE):
                by_step.setdefault(record["step"], []).append(record)
            for step, table in sorted(by_step.items()):
                row = report_row(step, self.mode)
                if (name, step) in self._seen or row < (self._start_step or 0):
                    continue
                self._seen.add((name, step))
                folder = step_folder(self.run_dir, name, step)
                found.append(EvalReport(name, step, row, table, folder))
        return found

    def _send(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            self._send_to(tracker, method, *args)

    def _send_to(self, tracker: Tracker, method: str, *args: Any) -> None:
        try:
            getattr(tracker, method)(*args)
        except Exception as err:  # noqa: BLE001 - a tracker must never stop the training
            self.trackers.remove(tracker)
            logger.warning(
                "the %s tracker failed in %s (%s: %s); it gets nothing more from this run, "
                "which goes on (metrics.jsonl and the reports in %s keep everything)",
                tracker.name, method, type(err).__name__, err, self.run_dir,
            )  # fmt: skip
            if method != "finish":
                _finish_quietly(tracker)

    def _write_record(self) -> None:
        text = json.dumps(self.records, indent=1, sort_keys=True)
        (self.run_dir / TRACKERS_FILE).write_text(text + "\n")


def _finish_quietly(tracker: Tracker) -> None:
    """End a failed tracker's run, ignoring a second failure (it was reported once)."""
    try:
        tracker.finish(FAILED)
    except Exception:  # noqa: BLE001, S110 - already reported; the run goes on
        pass


def _open_wandb(trainer: Any, info: RunInfo) -> Tracker:
    from embodied_rl.trackers.wandb_run import WandbTracker

    return WandbTracker(trainer.wandb, info)


def _open_mlflow(trainer: Any, info: RunInfo) -> Tracker:
    from embodied_rl.trackers.mlflow_run import MlflowTracker

    return MlflowTracker(trainer.mlflow, info)


OPENERS: dict[str, Callable[[Any, RunInfo], Tracker]] = {  # keys: config_sections.TRACKERS
    "wandb": _open_wandb,
    "mlflow": _open_mlflow,
}


def eval_report_names(plain: Mapping[str, Any]) -> list[str]:
    """The ``name`` of every ``eval.report`` node of the evaluation DAG (``eval``)."""
    node_type = NODE_TYPES.get("eval.report")
    nodes = (plain.get("eval_dag") or {}).get("nodes") or []
    return [
        node_type.build_config(node.get("config") or {}).name
        for node in nodes
        if node.get("type") == "eval.report"
    ]


def open_trackers(
    cfg: DictConfig, run_dir: Path, mode: str, config_file: Path
) -> TrackerFeed | None:
    """Start the trackers ``trainer.loggers`` names (``None`` when it names none).

    Called by the launcher after the run folder and its config are written and before Ray
    starts, so a tracker that cannot start stops the command before anything else runs; the
    folder is then left as the command found it (a fresh run's emptied, an evaluation's own
    removed), so the same command can simply be run again.

    Raises:
        TrackerError: a tracker cannot start; its message names the setting to change.
    """
    trainer = section(cfg, "trainer")
    names = [name for name in dict.fromkeys(trainer.loggers) if name in TRACKERS]
    if not names:
        return None
    try:
        return _open(cfg, trainer, names, run_dir, mode, config_file)
    except TrackerError:
        if mode == "eval":
            shutil.rmtree(run_dir)
        elif not cfg.get("resume"):
            remove_contents(run_dir)
        raise


def _open(
    cfg: DictConfig,
    trainer: Any,
    names: Sequence[str],
    run_dir: Path,
    mode: str,
    config_file: Path,
) -> TrackerFeed:
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["run_dir"] = str(run_dir)
    previous = _previous(run_dir) if cfg.get("resume") and mode == "train" else {}
    info = RunInfo(run_dir, str(cfg.name), mode, plain, config_file, previous)
    trackers: list[Tracker] = []
    try:
        for name in names:
            trackers.append(OPENERS[name](trainer, info))
    except BaseException:
        for tracker in trackers:  # the ones that started before one failed
            tracker.finish(KILLED)
        raise
    return TrackerFeed(trackers, run_dir, eval_report_names(plain), mode)


def _previous(run_dir: Path) -> dict[str, Any]:
    """What an earlier attempt of this run wrote to ``trackers.json`` (``{}``: none)."""
    try:
        return json.loads((run_dir / TRACKERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
