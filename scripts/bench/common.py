"""Shared plumbing of the benchmark scripts: machine facts, RSS sampling, tables, JSON, plots.

Every script under ``scripts/bench/`` measures ours and a reference in the same run, prints a
table with :func:`print_table`, and writes ``docs/benchmarks/<name>.json`` and ``<name>.png``
with :func:`write_results` / :func:`save_figure`. Scripts import this module as ``common``:
a script run as a file (``.venv/bin/python scripts/bench/<name>.py``) has its folder as
``sys.path[0]``, so its sibling modules import by name; the repository's packages come from
the venv (editable install).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parents[1]
RESULTS_DIR = REPO_ROOT / "docs" / "benchmarks"
MB = 1024**2


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, memory, GPU, key versions, date."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "date": dt.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "gpu": gpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of one process (this one by default), MiB."""
    return psutil.Process(pid).memory_info().rss / MB


def tree_rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process and all its descendants, MiB (e.g. simulator pools)."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / MB


class PeakRss:
    """Samples a process's RSS in a background thread; ``peak_mb`` after (or during) the block.

    The OS high-water mark (``ru_maxrss``) never goes down, so it cannot show one phase of a
    long process; sampling every ``interval`` seconds can, and misses only spikes shorter than
    the interval.

    Example::

        with PeakRss() as driver:
            run_phase()
        print(driver.peak_mb - driver.start_mb)
    """

    def __init__(self, pid: int | None = None, interval: float = 0.005) -> None:
        self.pid, self.interval = pid, interval
        self.start_mb = self.peak_mb = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRss:
        self.start_mb = self.peak_mb = rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid))
        except psutil.NoSuchProcess:
            pass


class Timer:
    """Accumulates wall seconds per named phase: ``with timer("generate"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._name: str | None = None

    def __call__(self, name: str) -> Timer:
        self._name = name
        return self

    def __enter__(self) -> Timer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._name is not None
        elapsed = time.perf_counter() - self._started
        self.seconds[self._name] = self.seconds.get(self._name, 0.0) + elapsed


def fmt(value: Any) -> str:
    """A table cell: floats with 3 significant digits, everything else as ``str``."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def print_table(rows: Sequence[dict[str, Any]], columns: Iterable[str] | None = None) -> str:
    """Print ``rows`` as a Markdown table (pasteable into BENCHMARKS.md); returns the text.
    No rows (a benchmark with nothing finished yet) print the header alone."""
    cols = list(columns) if columns is not None else list(rows[0])
    cells = [[fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(cols)]
    line = lambda items: "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths)) + " |"  # noqa: E731
    text = "\n".join(
        [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)]
    )
    print(text, flush=True)
    return text


def write_results(name: str, payload: dict[str, Any], out_dir: Path | None = None) -> Path:
    """Write ``<out_dir>/<name>.json`` with the machine facts added; returns the path."""
    out_dir = out_dir or RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    body = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(body, indent=2, default=float) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def save_figure(fig: Any, name: str, out_dir: Path | None = None) -> Path:
    """Save a matplotlib figure as ``<out_dir>/<name>.png`` and close it."""
    import matplotlib.pyplot as plt

    out_dir = out_dir or RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", flush=True)
    return path


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6) -> tuple[Any, Any]:
    """A figure with ``ncols`` side-by-side axes (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])
