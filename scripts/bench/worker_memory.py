"""What a DAG worker's memory is made of on LIBERO, before and after a change, in one run.

What is measured: the main command, ``embodied-rl train --config-name srpo_libero`` (2 CPU
workers on an embedded Ray cluster, the tiny random-init OpenVLA-OFT, 2 in-process LIBERO
envs per worker), for ``--steps`` steps (default 3) with its closing evaluation, run once
from this checkout (``after``) and once from ``--before REV`` (a temporary git worktree of
that commit; default :data:`BEFORE_COMMIT`, the commit before the memory work of issue 15),
one after the other. Each run loads the plugin ``worker_memory_probe`` (next to this file),
which records each worker's RSS around its own phases inside the Ray worker: imports, model
builds, set-up, every node of every step (and, inside the rollout node, every LIBERO scene
build and renderer), and each step's end. A plain Python process importing what a worker
imports (torch, the core, ``policies``, ``rollout``, ``simulators``) gives the libraries'
share; the rest of the RSS at import time is Ray's worker runtime.

The table shows rank 0's footprint (its steps and evaluation match rank 1's; it also writes
the logs) split into components, in MiB of RSS: the change between two readings of the
process's RSS, so freed-and-reused memory is not counted twice and a component's row is
what the process grew by while it ran. ``total at step 1`` is the RSS at the end of the walk
of step index 1 (the issue's "step 1"), before any evaluation; ``total after evaluation``
follows the closing evaluation (the training rollout's envs were built by then).

Checks: both runs logged every step, each worker wrote its probe records, and the two runs
trained on the same tasks (``rollout/success_rate`` and the data are seeded alike).

Run (about 5 minutes)::

    .venv/bin/python scripts/bench/worker_memory.py
    .venv/bin/python scripts/bench/worker_memory.py --before HEAD~3 --out /tmp/wm

Writes ``docs/benchmarks/worker_memory.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import common

BEFORE_COMMIT = "5a0783a"  # main before issue 15 (texture-light scenes, allocator, sharing)
PROBE = "worker_memory_probe"
CONFIG = "srpo_libero"
# What a worker imports before its plugins are loaded, measured in a plain process.
PLAIN_IMPORTS = (
    "import psutil, ray, torch\n"
    "from embodied_rl.runtime.worker import DAGWorker\n"
    "from embodied_rl.runtime.config import load_all_plugins\n"
    "load_all_plugins({'plugins': ['policies', 'rollout', 'simulators']})\n"
    "import embodied_rl, simulators\n"
    "print(embodied_rl.__file__, simulators.__file__)\n"
    "print(psutil.Process().memory_info().rss / 1024**2)\n"
)
COMPONENTS = (
    ("python, torch and libraries", "imports in a plain process"),
    ("Ray worker runtime", "RSS at import in the worker minus the plain process"),
    ("models (policy, video encoder)", "weights of the models built"),
    ("worker set-up", "node set-up: vector envs, LIBERO import (models excluded)"),
    ("simulators: scenes", "LIBERO scenes built in step 0 (robosuite, MuJoCo models)"),
    ("simulators: renderer", "the GL context with the task's textures"),
    ("rollout, rest", "first episodes: robosuite/numba first use, buffers, policy passes"),
    ("encoder, reward, advantage", "the other nodes of step 0"),
    ("training (gradients, Adam)", "the train node of step 0"),
    ("step 1 and the rest", "process groups, metrics, logger, step 1"),
)


def worktree(rev: str, root: Path) -> Path:
    """A detached git worktree of ``rev`` under ``root``."""
    path = root / f"tree_{rev.replace('/', '_')}"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), rev],
        cwd=common.REPO_ROOT,
        check=True,
        capture_output=True,
    )
    return path


def run_env(tree: Path) -> dict[str, str]:
    """The environment of a run from ``tree``: its packages and the probe first on the path.

    A caller's ``MALLOC_ARENA_MAX`` is dropped, so each tree runs with its own settings.
    """
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(common.BENCH_DIR)])
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def plain_imports_mb(tree: Path) -> float:
    """RSS of a plain process that imports what a worker imports from ``tree``; checks that
    the packages come from ``tree`` (not from this checkout's editable install)."""
    out = subprocess.run(
        [sys.executable, "-c", PLAIN_IMPORTS],
        cwd=tree,
        env=run_env(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    *_, where, rss = out.stdout.strip().splitlines()
    if any(not Path(path).resolve().is_relative_to(tree.resolve()) for path in where.split()):
        raise SystemExit(f"packages imported from {where}, not from {tree}")
    return float(rss)


def train(tree: Path, run_dir: Path, steps: int) -> None:
    overrides = [
        f"trainer.total_steps={steps}",
        "trainer.checkpoint_every=100",
        "trainer.log_to_console=false",
        "eval.at_end=true",
        f"run_dir={run_dir}",
        f"plugins=[policies,rollout,simulators,{PROBE}]",
    ]
    cmd = [sys.executable, "-m", "embodied_rl.cli", "train", "--config-name", CONFIG, *overrides]
    done = subprocess.run(cmd, cwd=tree, env=run_env(tree), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the run failed ({done.returncode}):\n{done.stderr[-4000:]}")


def read_run(run_dir: Path, steps: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rank 0's probe records and the run's metrics lines; checks both are complete."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if [int(x["step"]) for x in lines] != list(range(steps)):
        raise SystemExit(f"{run_dir}: metrics.jsonl lacks steps: {[x['step'] for x in lines]}")
    for rank in (0, 1):
        if not (run_dir / "memory_probe" / f"rank_{rank}.jsonl").exists():
            raise SystemExit(f"{run_dir}: worker {rank} wrote no probe records")
    text = (run_dir / "memory_probe" / "rank_0.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()], lines


def _event(records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [r for r in records if r["event"] == name]
    if not found:
        raise SystemExit(f"no probe record {name!r}; recorded: {[r['event'] for r in records]}")
    return found[0]


def _grew(record: dict[str, Any]) -> float:
    return record["after_mb"] - record["before_mb"]


def _grew_inside(records: list[dict[str, Any]], outer: dict[str, Any], prefix: str) -> float:
    """What the events named ``prefix...`` that ran inside ``outer`` grew the RSS by."""
    return sum(
        _grew(r)
        for r in records
        if r is not outer
        and r["event"].startswith(prefix)
        and outer["t0_s"] <= r["t0_s"]
        and r["t1_s"] <= outer["t1_s"]
    )


def components(records: list[dict[str, Any]], plain_mb: float, steps: int) -> dict[str, float]:
    """Rank 0's RSS split into :data:`COMPONENTS` (MiB), plus the totals and the evaluation.

    A model is built on first use, inside the set-up or a node: its growth is counted under
    ``models`` and left out of the phase it happened in.
    """
    setups = [r for r in records if r["event"].startswith("setup:")]
    rollout = _event(records, "node:train:rollout:0")
    train_node = _event(records, "node:train:train:0")
    others = [
        r
        for r in records
        if r["event"].startswith("node:train:")
        and r["event"].endswith(":0")
        and r is not rollout
        and r is not train_node
    ]
    scenes = _grew_inside(records, rollout, "scene")
    renderer = _grew_inside(records, rollout, "renderer")
    imports = _event(records, "imports")["after_mb"]
    at_step_1 = _event(records, "walk:train:1")["after_mb"]
    parts = {
        "python, torch and libraries": plain_mb,
        "Ray worker runtime": imports - plain_mb,
        "models (policy, video encoder)": sum(
            _grew(r) for r in records if r["event"].startswith("model:")
        ),
        "worker set-up": sum(_grew(r) - _grew_inside(records, r, "model:") for r in setups),
        "simulators: scenes": scenes,
        "simulators: renderer": renderer,
        "rollout, rest": _grew(rollout)
        - scenes
        - renderer
        - _grew_inside(records, rollout, "model:"),
        "encoder, reward, advantage": sum(
            _grew(r) - _grew_inside(records, r, "model:") for r in others
        ),
        "training (gradients, Adam)": _grew(train_node)
        - _grew_inside(records, train_node, "model:"),
    }
    parts["step 1 and the rest"] = at_step_1 - sum(parts.values())
    parts["total at step 1"] = at_step_1
    evaluation = _event(records, f"walk:eval:{steps}")
    parts["evaluation (first)"] = _grew(evaluation)
    parts["total after evaluation"] = evaluation["after_mb"]
    return parts


def measure(tree: Path, run_dir: Path, steps: int) -> dict[str, Any]:
    print(f"{tree}: {steps} steps of {CONFIG} ...", flush=True)
    plain = plain_imports_mb(tree)
    train(tree, run_dir, steps)
    records, lines = read_run(run_dir, steps)
    return {
        "components_mb": components(records, plain, steps),
        "worker_rss_mb": [x["memory/worker_rss_mb"] for x in lines],
        "step_s": [x["time/step"] for x in lines],
        "records_rank0": records,
    }


def table(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    before, after = results["before"]["components_mb"], results["after"]["components_mb"]
    notes = dict(COMPONENTS)
    rows = []
    for name in before:
        rows.append(
            {
                "component": name,
                "before_mb": round(before[name]),
                "after_mb": round(after[name]),
                "change_mb": round(after[name] - before[name]),
                "what": notes.get(name, ""),
            }
        )
    return rows


def plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    fig, (ax,) = common.new_figure(ncols=1, width=7.5, height=4.2)
    names = [name for name, _ in COMPONENTS]
    for col, variant in enumerate(("before", "after")):
        parts = results[variant]["components_mb"]
        bottom = 0.0
        for k, name in enumerate(names):
            value = max(parts[name], 0.0)
            ax.bar(col, value, bottom=bottom, color=f"C{k}", label=name if col == 0 else None)
            bottom += value
        ax.text(col, bottom + 40, f"{parts['total at step 1']:.0f} MiB", ha="center")
    ax.set_xticks([0, 1], [f"before ({results['before']['rev']})", "after"])
    ax.set_ylabel("worker RSS at step 1 (MiB)")
    ax.set_title(f"{CONFIG}: what a worker's memory is made of (rank 0)")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_xlim(-0.6, 2.6)
    common.save_figure(fig, "worker_memory", out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE_COMMIT, help="commit to compare with")
    parser.add_argument("--steps", type=int, default=3, help="training steps (>= 3)")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be >= 3 (step 1 is read before the closing evaluation)")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="worker_memory_") as tmp:
        root = Path(tmp)
        before_tree = worktree(args.before, root)
        try:
            results["before"] = measure(before_tree, root / "run_before", args.steps)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(before_tree)],
                cwd=common.REPO_ROOT,
                check=False,
            )
        results["after"] = measure(common.REPO_ROOT, root / "run_after", args.steps)
    results["before"]["rev"] = args.before
    rows = table(results)
    common.print_table(rows, ("component", "before_mb", "after_mb", "change_mb", "what"))
    payload = {"config": CONFIG, "steps": args.steps, "before": args.before, "rows": rows}
    payload["runs"] = results
    common.write_results("worker_memory", payload, args.out)
    plot(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
