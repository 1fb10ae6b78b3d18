"""Metric reduction over workers, and rank 0's run logs: JSONL, TensorBoard, console, plots.

Workers log scalars into a :class:`~embodied_rl.runtime.context.MetricSink`; at the end of a
step the records of all ranks are gathered and combined by :func:`reduce_records`. Rank 0 then
hands the reduced values to :class:`RunLogger`, which appends one line per step to
``<run_dir>/metrics.jsonl``, writes TensorBoard scalars under ``<run_dir>/tensorboard`` and
draws ``<run_dir>/metrics.png``. The driver shows progress with :class:`ProgressBar`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

logger = logging.getLogger(__name__)

Record = tuple[float, float, str]  # (value, weight, reduce) as MetricSink.pop() returns them
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "metrics.png"
TENSORBOARD_DIR = "tensorboard"
_PLOT_PREFIXES = ("reward/", "loss/")


def _reduce_one(name: str, entries: Sequence[Record]) -> float:
    """Combine one metric's records from the ranks that logged it."""
    kinds = {kind for _, _, kind in entries}
    if len(kinds) != 1:
        raise ValueError(
            f"metric {name!r} is logged with different reductions {sorted(kinds)} on different "
            "ranks; log it with the same reduce= everywhere"
        )
    kind = kinds.pop()
    values = [float(value) for value, _, _ in entries]
    if kind == "sum":
        return sum(values)
    if kind == "max":
        return max(values)
    if kind == "min":
        return min(values)
    if kind != "mean":
        raise ValueError(f"metric {name!r} has unknown reduction {kind!r}")
    total = sum(float(weight) for _, weight, _ in entries)
    if total > 0:
        return sum(float(v) * float(w) for v, w, _ in entries) / total
    # No rank carried weight (e.g. no samples anywhere): fall back to the plain mean.
    return sum(values) / len(values)


def reduce_records(per_rank: Iterable[Mapping[str, Record] | None]) -> dict[str, float]:
    """Combine the ``MetricSink.pop()`` outputs of all ranks into one value per metric.

    ``mean`` is weighted by the weights, ``sum`` adds, ``max``/``min`` take the extreme.
    Ranks may log different metrics (nodes placed on subsets of the workers): each metric
    is reduced over the ranks that logged it.

    Args:
        per_rank: one records dict per rank (``None`` entries are skipped).

    Returns:
        ``{name: value}`` sorted by name.

    Raises:
        ValueError: a metric was logged with different reductions on different ranks.
    """
    grouped: dict[str, list[Record]] = {}
    for records in per_rank:
        for name, record in (records or {}).items():
            grouped.setdefault(name, []).append(record)
    return {name: _reduce_one(name, entries) for name, entries in sorted(grouped.items())}


def summary_items(
    metrics: Mapping[str, float], first: Sequence[str] = ("reward/mean",), limit: int = 4
) -> dict[str, str]:
    """A few headline metrics for a console line: ``first`` keys, then ``reward/*``, ``loss/*``."""
    chosen = [k for k in first if k in metrics]
    chosen += sorted(k for k in metrics if k.startswith(_PLOT_PREFIXES) and k not in chosen)
    return {k: f"{metrics[k]:.4g}" for k in chosen[:limit]}


def _parse_record(line: str | bytes, path: Path, number: int) -> dict[str, Any] | None:
    """One JSONL line as a record with an int ``step``; ``None`` for anything else."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except ValueError:
        logger.warning("%s: line %d is not valid JSON; ignoring it", path, number)
        return None
    if isinstance(record, dict) and isinstance(record.get("step"), int):
        return record
    return None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``; lines that do not parse (a torn write) are skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        parsed = (_parse_record(line, path, number) for number, line in enumerate(f, start=1))
        return [record for record in parsed if record is not None]


class MetricsTail:
    """The records appended to a ``metrics.jsonl`` since the last :meth:`read`.

    Follows a file that only grows (rank 0's :class:`RunLogger` rewrites it only when it opens
    it): each read starts where the last one ended and takes complete lines only, so a line
    still being written is read next time, whole.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._lines = 0

    def read(self) -> list[dict[str, Any]]:
        """The new records, in file order (``[]`` while the file does not exist)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        records = []
        for line in data[:end].splitlines():
            self._lines += 1
            record = _parse_record(line, self.path, self._lines)
            if record is not None:
                records.append(record)
        return records


def _drop_steps_from(path: Path, start_step: int) -> int:
    """Rewrite ``path`` keeping only records of steps before ``start_step``; returns # dropped."""
    if not path.is_file():
        return 0
    records = read_metrics(path)
    kept = [r for r in records if r["step"] < start_step]
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)  # never leave a half-rewritten log behind
    return len(records) - len(kept)


def _keys_to_plot(records: Sequence[Mapping[str, Any]], plot_keys: Sequence[str]) -> list[str]:
    present = {k for r in records for k in r if k != "step"}
    keys = [k for k in plot_keys if k in present]
    keys += sorted(k for k in present if k.startswith(_PLOT_PREFIXES) and k not in keys)
    return keys


def plot_metrics(
    metrics_path: str | Path, out_path: str | Path, plot_keys: Sequence[str] = ("reward/mean",)
) -> Path | None:
    """Draw one subplot per metric over steps into a PNG; ``None`` when nothing to plot.

    The keys are ``plot_keys`` that occur in the log, then every ``reward/*`` and ``loss/*``.
    """
    # The object-oriented API with an Agg canvas: no pyplot global state, no GUI backend.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    keys = _keys_to_plot(records, plot_keys)
    if not keys:
        logger.info("no metrics to plot in %s (looked for %s)", metrics_path, list(plot_keys))
        return None
    fig = Figure(figsize=(7.0, 2.2 * len(keys) + 0.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False, sharex=True)[:, 0]
    for ax, key in zip(axes, keys):
        points = sorted((r["step"], r[key]) for r in records if key in r)
        steps, values = zip(*points)
        ax.plot(steps, values, marker="." if len(points) <= 50 else None, linewidth=1.2)
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    out_path = Path(out_path)
    partial = out_path.with_name(f".{out_path.name}.partial")
    fig.savefig(partial, format="png", dpi=100)
    os.replace(partial, out_path)  # a reader never sees a half-written image
    return out_path


class RunLogger:
    """Rank 0's writer of the run's metric logs.

    On resume (``start_step > 0``) the log is appended to, after removing lines of steps
    ``>= start_step`` that an interrupted run wrote past its last checkpoint, so the file
    holds each step once. With ``start_step == 0`` an existing log is emptied the same way.
    """

    def __init__(
        self,
        run_dir: str | Path,
        total_steps: int,
        start_step: int = 0,
        tensorboard: bool = True,
        plot_keys: Sequence[str] = ("reward/mean",),
        console: bool = True,
    ) -> None:
        """Open (and, on resume, clean up) the logs under ``run_dir``.

        Args:
            run_dir: the run directory (created if missing).
            total_steps: steps of the whole run, for the console line.
            start_step: the first step this process will log (0-based).
            tensorboard: also write TensorBoard scalars.
            plot_keys: metrics plotted first by :meth:`plot`.
            console: print one short line per step.
        """
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.total_steps, self.start_step = total_steps, start_step
        self.plot_keys, self.console = tuple(plot_keys), console
        self.metrics_path = self.run_dir / METRICS_FILE
        dropped = _drop_steps_from(self.metrics_path, start_step)
        if dropped:
            logger.info(
                "dropped %d logged steps >= %d from %s", dropped, start_step, self.metrics_path
            )
        self._file: TextIO | None = open(self.metrics_path, "a", encoding="utf-8")
        self._writer = self._open_tensorboard() if tensorboard else None

    def _open_tensorboard(self) -> Any:
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when asked for

        # purge_step makes TensorBoard discard events of steps >= start_step that an
        # interrupted run wrote, the same cleanup as for the JSONL log.
        purge = self.start_step if self.start_step > 0 else None
        return SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append the reduced metrics of ``step`` (0-based) to every log."""
        if self._file is None:
            raise RuntimeError("RunLogger.log called after close()")
        if "step" in metrics:
            raise ValueError("'step' is reserved in metrics.jsonl; rename that metric")
        values = {name: float(value) for name, value in metrics.items()}
        record = {"step": int(step), **values}
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()  # a crash loses at most the line being written
        if self._writer is not None:
            for name, value in sorted(values.items()):
                self._writer.add_scalar(name, value, int(step))
            self._writer.flush()
        if self.console:
            shown = summary_items(values, self.plot_keys, limit=6)
            text = "  ".join(f"{k} {v}" for k, v in shown.items())
            tqdm.write(f"step {step + 1}/{self.total_steps}  {text}".rstrip())

    def plot(self) -> Path | None:
        """Write ``<run_dir>/metrics.png`` from the whole JSONL log (earlier runs included)."""
        if self._file is not None:
            self._file.flush()
        return plot_metrics(self.metrics_path, self.run_dir / PLOT_FILE, self.plot_keys)

    def close(self) -> None:
        """Close the log files; calling it twice is fine."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProgressBar:
    """The driver's progress bar: steps done out of ``total``, headline metrics as postfix.

    A thin wrapper around ``tqdm``. With the default ``disable=None`` tqdm turns itself off
    when the output is not a terminal (CI logs, pytest), and every method stays safe to call.
    """

    def __init__(
        self,
        total: int,
        start: int = 0,
        *,
        file: TextIO | None = None,
        disable: bool | None = None,
        max_metrics: int = 4,
    ) -> None:
        """Create the bar.

        Args:
            total: steps of the whole run.
            start: steps already done (a resumed run).
            file: where to draw (``sys.stderr`` by default).
            disable: ``None`` = only on a terminal; ``True``/``False`` to force.
            max_metrics: how many metrics the postfix shows.
        """
        self.max_metrics = max_metrics
        self._bar = tqdm(
            total=total, initial=start, file=file, disable=disable, unit="step", dynamic_ncols=True
        )

    @property
    def n(self) -> int:
        return int(self._bar.n)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Show ``step`` steps done and the headline ``metrics`` (reward/mean, loss/*)."""
        delta = int(step) - self._bar.n
        if delta > 0 and not self._bar.disable:
            self._bar.update(delta)  # through update() so tqdm's rate estimate stays right
        else:
            self._bar.n = int(step)  # a disabled tqdm ignores update(); keep n right anyway
        postfix = summary_items(metrics, ("reward/mean",), limit=self.max_metrics)
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
