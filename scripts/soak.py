"""Soak test: does memory stay flat over long training runs?

What is measured: ``grpo_llm``, the SRPO MLP quick start ``srpo_reach`` and the LIBERO
configs ``srpo_libero`` (the main command: in-process simulators) and ``grpo_libero`` (one
simulator process per worker) each train for their number of steps (:data:`CONFIGS`:
200, 200, 300, 300; ``--steps`` sets all) through the real launcher (2 CPU workers on an
embedded Ray cluster, checkpoints as configured, the LIBERO configs with an evaluation every
50 steps). Every step each DAG worker logs its own
resident memory (``memory/worker_rss_mb``) and that of its child processes
(``memory/simulator_rss_mb``: the simulator processes), both reduced with ``max`` over the
workers into the run's ``metrics.jsonl``; ``srpo_reach`` runs with
``rollout.processes=--sim-processes`` (default 2 per worker; the quick start's 0 keeps the
simulator inside the worker, where its memory counts as worker memory). A thread of this
script samples the driver's RSS along with the number of logged steps.

For each config and process kind (worker, simulator, driver) it reports the RSS at the
first step after the warm-up, at the last step and the peak, and the least-squares slope of
RSS against step over the steps after the warm-up (``--warmup``, default 20: allocator
pools, lazily built models and the first checkpoint settle there, and ``srpo_reach`` starts
the simulators of its evaluation DAG in its first evaluation, at the end of step index 19),
with its standard error. Later evaluations (every 20 steps) stay in the fit: they are part
of a run.

Target: flat = slope < 0.1 MB/step, i.e. < 20 MB over 200 steps (1 GB over 10k steps); for
the LIBERO configs < 1 MB/step (< 0.3 GB over 300 steps: a worker builds and frees LIBERO
scenes, hundreds of MB each, whenever the task changes).
RSS moves by a few MB from step to step (allocator arenas, checkpoint and evaluation steps);
a few MB of noise over 180 fitted steps gives a slope standard error near 0.01 MB/step (the
table shows the measured one), so the target sits well above the noise. It flags a leak
of more than 100 KB per step (e.g. one step's log-probs or logits kept alive); a leak of
a few KB per step (one batch of token ids) needs thousands of steps to show.

Checks: every config logged each step exactly once with both memory metrics, and the
``srpo_reach`` simulator processes were alive (RSS > 0) at every step when enabled. The exit
status is 1 when a row misses the target.

Run::

    .venv/bin/python scripts/soak.py --configs grpo_llm srpo_reach   # 200 steps each
    .venv/bin/python scripts/soak.py --configs srpo_libero grpo_libero  # 300 steps, ~75 min
    .venv/bin/python scripts/soak.py --steps 20 --out /tmp/soak      # check that it works
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

from embodied_rl.launch.launcher import launch  # noqa: E402
from embodied_rl.runtime.config import compose  # noqa: E402


@dataclass(frozen=True)
class SoakConfig:
    """How one config is soaked: its steps, its target and what the run changes."""

    steps: int
    flat_mb_per_step: float
    overrides: tuple[str, ...] = ()
    simulator_processes: bool = False  # its workers have simulator processes to measure


CONFIGS = {
    "grpo_llm": SoakConfig(200, 0.1),
    "srpo_reach": SoakConfig(200, 0.1, simulator_processes=True),  # --sim-processes of them
    "srpo_libero": SoakConfig(300, 1.0, ("eval.every=50",)),
    "grpo_libero": SoakConfig(
        300, 1.0, ("rollout.processes=1", "eval.every=50"), simulator_processes=True
    ),
}
METRIC_OF_KIND = {"worker": "memory/worker_rss_mb", "simulator": "memory/simulator_rss_mb"}
COLOR_OF_KIND = {"worker": "C0", "simulator": "C1", "driver": "C2"}
COLUMNS = (
    "config",
    "process",
    "start_mb",
    "end_mb",
    "peak_mb",
    "slope_mb_per_step",
    "slope_stderr",
    "growth_mb",
    "target",
    "met",
)


class DriverSampler(threading.Thread):
    """Samples this process's RSS every ``interval`` s with the number of steps logged so far.

    The driver only receives small records, but it keeps them, so a soak must watch it too.
    """

    def __init__(self, metrics_path: Path, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.metrics_path, self.interval = metrics_path, interval
        self.samples: list[tuple[int, float]] = []  # (steps logged, RSS MiB)
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                steps = sum(1 for _ in self.metrics_path.open())
            except OSError:
                continue  # the run has not logged yet
            self.samples.append((steps, common.rss_mb()))

    def stop(self) -> list[tuple[int, float]]:
        self._done.set()
        self.join()
        return self.samples


def overrides_for(config: str, steps: int, run_dir: Path, sim_processes: int) -> list[str]:
    extra = [f"rollout.processes={sim_processes}"] if config == "srpo_reach" else []
    return [
        f"trainer.total_steps={steps}",
        f"run_dir={run_dir}",
        "trainer.log_to_console=false",
        *CONFIGS[config].overrides,
        *extra,
    ]


def run_config(config: str, steps: int, run_root: Path, sim_processes: int) -> dict[str, Any]:
    """Train ``config`` for ``steps`` steps; returns its per-step RSS series and checks."""
    run_dir = run_root / config
    cfg = compose(config, overrides_for(config, steps, run_dir, sim_processes))
    sampler = DriverSampler(run_dir / "metrics.jsonl")
    sampler.start()
    started = time.perf_counter()
    try:
        launch(cfg, show_progress=False)
    finally:
        driver = sampler.stop()
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expect_simulators = CONFIGS[config].simulator_processes and (
        config != "srpo_reach" or sim_processes > 0
    )
    check_lines(config, lines, steps, expect_simulators)
    series = {
        kind: [line[metric] for line in lines]
        for kind, metric in METRIC_OF_KIND.items()
        if any(line[metric] > 0 for line in lines)  # no simulator processes: no series
    }
    series["driver"] = driver_per_step(driver, steps)
    return {"seconds": seconds, "steps": steps, "rss_mb": series}


def check_lines(config: str, lines: list[dict], steps: int, expect_simulators: bool) -> None:
    """Every step logged once, with both memory metrics; simulators alive when enabled."""
    logged = [int(line["step"]) for line in lines]
    if logged != list(range(steps)):
        raise SystemExit(f"{config}: metrics.jsonl has steps {logged}, expected 0..{steps - 1}")
    for line in lines:
        missing = [m for m in METRIC_OF_KIND.values() if m not in line]
        if missing or line["memory/worker_rss_mb"] <= 0:
            raise SystemExit(f"{config}: step {line['step']} lacks memory metrics: {line}")
        if expect_simulators and line["memory/simulator_rss_mb"] <= 0:
            raise SystemExit(f"{config}: no simulator process RSS at step {line['step']}")


def driver_per_step(samples: list[tuple[int, float]], steps: int) -> list[float | None]:
    """The driver's RSS at each step: the last sample taken while that step was the newest."""
    per_step: list[float | None] = [None] * steps
    for logged, rss in samples:
        if 1 <= logged <= steps:
            per_step[logged - 1] = rss
    return per_step


def fit(series: list[float | None], warmup: int) -> dict[str, Any]:
    """Start/end/peak RSS and the least-squares slope (MiB/step) after ``warmup`` steps."""
    points = [(step, value) for step, value in enumerate(series) if value is not None]
    fitted = [(s, v) for s, v in points if s >= warmup]
    if len(fitted) < 3:
        return {"start_mb": None, "end_mb": None, "peak_mb": None, "slope_mb_per_step": None}
    x, y = np.array(fitted, dtype=float).T
    (slope, intercept), residuals = np.polyfit(x, y, 1, full=True)[:2]
    dof = len(x) - 2
    sigma2 = float(residuals[0]) / dof if len(residuals) and dof > 0 else 0.0
    stderr = float(np.sqrt(sigma2 / np.sum((x - x.mean()) ** 2)))
    return {
        "start_mb": float(y[0]),
        "end_mb": float(y[-1]),
        "peak_mb": float(max(v for _, v in points)),
        "slope_mb_per_step": float(slope),
        "slope_stderr": stderr,
        "intercept_mb": float(intercept),
        "fit_from_step": int(x[0]),
        "growth_mb": float(slope * len(series)),
    }


def warmup_for(steps: int, warmup: int) -> int:
    """Steps left out of the fit: short check runs keep at least half of theirs in it."""
    return min(warmup, steps // 2)


def summarise(results: dict[str, dict[str, Any]], warmup: int) -> list[dict[str, Any]]:
    rows = []
    for config, result in results.items():
        flat = CONFIGS[config].flat_mb_per_step
        for kind, series in result["rss_mb"].items():
            stats = fit(series, warmup_for(result["steps"], warmup))
            slope = stats["slope_mb_per_step"]
            rows.append(
                {
                    "config": config,
                    "process": kind,
                    **stats,
                    "target": f"< {flat} MB/step",
                    "met": None if slope is None else bool(slope < flat),
                }
            )
    return rows


def as_shown(row: dict[str, Any]) -> dict[str, Any]:
    """The row with whole MiB for the RSS columns (the table's 3 digits would round them)."""
    rss = ("start_mb", "end_mb", "peak_mb")
    return {k: round(v) if k in rss and v is not None else v for k, v in row.items()}


def plot(
    results: dict[str, dict[str, Any]], rows: list[dict[str, Any]], out: Path, name: str
) -> None:
    fig, axes = common.new_figure(ncols=len(results), width=5.5, height=3.8)
    for ax, (config, result) in zip(axes, results.items()):
        for kind, series in result["rss_mb"].items():
            steps = [s for s, v in enumerate(series) if v is not None]
            color = COLOR_OF_KIND[kind]
            ax.plot(steps, [series[s] for s in steps], label=kind, lw=1.2, color=color)
            row = next(r for r in rows if r["config"] == config and r["process"] == kind)
            if row["slope_mb_per_step"] is not None:
                xs = np.array([row["fit_from_step"], len(series) - 1])
                ys = row["intercept_mb"] + row["slope_mb_per_step"] * xs
                label = f"{row['slope_mb_per_step']:+.3f} MB/step"
                ax.plot(xs, ys, ls="--", color=color, lw=1, label=label)
        ax.set_title(f"{config}: RSS per step (max over workers)")
        ax.set_xlabel("training step")
        ax.set_ylabel("RSS (MiB)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    common.save_figure(fig, name, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="steps of every config (default: its own)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the fit")
    parser.add_argument("--sim-processes", type=int, default=2, help="srpo_reach simulators")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--name", default="soak", help="file name of the table and the plot")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="soak_") as run_root:
        for config in args.configs:
            steps = args.steps or CONFIGS[config].steps
            print(f"{config}: {steps} steps ...", flush=True)
            results[config] = run_config(config, steps, Path(run_root), args.sim_processes)
            print(f"{config}: {results[config]['seconds']:.0f} s", flush=True)
    rows = summarise(results, args.warmup)
    common.print_table([as_shown(row) for row in rows], COLUMNS)
    payload = {
        "warmup": args.warmup,
        "sim_processes": args.sim_processes,
        "configs": {name: dataclasses.asdict(CONFIGS[name]) for name in args.configs},
        "rows": rows,
        "runs": results,
    }
    common.write_results(args.name, payload, args.out)
    plot(results, rows, args.out, args.name)
    return 0 if all(row["met"] is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
