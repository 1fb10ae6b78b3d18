"""LIBERO that learns on one CPU: scripted demos -> one-demo SFT -> SRPO vs binary GRPO.

The project's main use case measured end to end with the real commands, on held-out init
states that training never saw:

1. ``demos``: ``embodied-rl demos`` writes ONE scripted demonstration per task (init state 0)
   at the rollouts' image size (``simulators/libero/planner.py``).
2. ``sft``: ``embodied-rl train --config-name sft_libero`` trains the fast CPU policy
   (``policy=mlp_image``: 3-conv image encoder, proprio, instruction, Gaussian head over
   chunks of 8 actions) by behaviour cloning on those demos (SRPO's one-shot setting), then
   evaluates it greedily on every held-out init state of the tasks (``eval``) and on every
   training init state (``embodied-rl eval`` with ``eval.split=train``).
3. ``srpo`` and ``grpo``: RL from the SFT checkpoint (``models.actor.init_from``) with the same
   rollouts, optimiser and wall-time budget (``trainer.time_limit_min``): SRPO's
   video-embedding progress reward (``srpo_libero``) vs the binary success reward
   (``grpo_libero``), held-out evaluation every ``--eval-every`` steps and at the end, then
   the training init states.

Every phase is a subprocess running the CLI as a user would; its exact command is printed,
logged and recorded in the JSON. The runs, their logs, reports and MP4 videos stay under
``--runs`` (``outputs/libero_learning`` by default); the table goes to stdout and the JSON and
the success-vs-wall-time plot to ``docs/benchmarks/libero_learning.{json,png}``. A phase
whose run directory already holds its results is reused (``--fresh`` reruns everything), so
an interrupted benchmark continues where it stopped.

Held-out split: init states ``i`` with ``i % heldout_every == heldout_every - 1`` (25 of 50
per task with the default 2), never used for demos (the loader refuses them) or RL.

Run (about 5 hours on 2 idle cores: SFT ~15 min, each RL run its budget plus evaluations)::

    .venv/bin/python scripts/bench/libero_learning.py
    .venv/bin/python scripts/bench/libero_learning.py --methods srpo --eval-every 5  # the 2-h row
    .venv/bin/python scripts/bench/libero_learning.py --rl-minutes 15 --runs /tmp/ll --out /tmp/ll
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common

NAME = "libero_learning"
EVAL_TRAIN = "eval_train"
RL_CONFIGS = {"srpo": "srpo_libero", "grpo": "grpo_libero"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--tasks", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--heldout-every", type=int, default=2)
    parser.add_argument("--num-init-states", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=160, help="env steps per episode")
    parser.add_argument("--sft-steps", type=int, default=2000)
    parser.add_argument("--rl-minutes", type=float, default=120.0, help="RL wall-time budget")
    parser.add_argument("--eval-every", type=int, default=10, help="RL steps between evals")
    parser.add_argument("--temperature", type=float, default=0.3)
    # Defaults: the configuration that met the 2-hour target (docs/benchmarks/libero_learning.md);
    # the first two attempts used --rl-groups 4 --rl-lr 1e-4 --rl-warmup 0 --loss-agg token-mean.
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument(
        "--rl-warmup", type=int, default=8, help="RL lr warmup (optimizer updates; 0 = off)"
    )
    parser.add_argument(
        "--rl-groups", type=int, default=8, help="(task, init state) groups per RL step"
    )
    parser.add_argument(
        "--loss-agg",
        default="seq-mean-token-mean",
        choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"],
        help="RL loss aggregation (token-mean weighs an episode by its length)",
    )
    parser.add_argument("--methods", nargs="+", default=list(RL_CONFIGS), choices=RL_CONFIGS)
    parser.add_argument("--runs", type=Path, default=Path("outputs") / NAME)
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument("--fresh", action="store_true", help="rerun phases with results")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- commands
def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "embodied_rl.cli", *args]


def split_sizes(args: argparse.Namespace) -> dict[str, int]:
    """(task, init state) pairs of each split over the chosen tasks."""
    held = args.num_init_states // args.heldout_every
    per_task = {"heldout": held, "train": args.num_init_states - held}
    return {split: n * len(args.tasks) for split, n in per_task.items()}


def shared_overrides(args: argparse.Namespace) -> list[str]:
    """What every phase shares: policy, simulator, tasks, split, evaluation size."""
    tasks = ",".join(str(t) for t in args.tasks)
    return [
        "policy=mlp_image",
        f"simulator.options.suite={args.suite}",
        f"simulator.options.max_steps={args.max_steps}",
        "+simulator.options.max_cached_tasks=2",  # a worker's tasks stay built
        f"data.tasks=[{tasks}]",
        f"data.heldout_every={args.heldout_every}",
        f"eval.batch_size={split_sizes(args)['heldout']}",
        "eval.max_videos=6",
        "trainer.log_to_console=true",
    ]


def sft_command(args: argparse.Namespace, demos: Path, run_dir: Path) -> list[str]:
    return cli(
        "train", "--config-name", "sft_libero", "--no-progress",
        *shared_overrides(args),
        f"data.paths=[{demos}]",
        "data.max_demos_per_task=1",
        "data.batch_size=64",
        "models.actor.optimizer.lr=1e-3",
        f"trainer.total_steps={args.sft_steps}",
        f"trainer.checkpoint_every={args.sft_steps}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def rl_command(args: argparse.Namespace, method: str, sft: Path, run_dir: Path) -> list[str]:
    return cli(
        "train", "--config-name", RL_CONFIGS[method], "--no-progress",
        *shared_overrides(args),
        f"models.actor.init_from={sft}",
        f"data.batch_size={args.rl_groups}",  # (task, init state) groups per step
        "rollout.group_size=8",
        "rollout.num_envs=4",
        f"rollout.temperature={args.temperature}",
        f"models.actor.optimizer.lr={args.rl_lr}",
        f"models.actor.optimizer.warmup_steps={args.rl_warmup}",
        f"algorithm.actor.loss_agg_mode={args.loss_agg}",
        "algorithm.actor.ppo_epochs=2",
        "algorithm.actor.num_mini_batches=2",
        "algorithm.actor.micro_batch_size=64",
        "trainer.total_steps=10000",
        f"trainer.time_limit_min={args.rl_minutes}",
        f"trainer.checkpoint_every={args.eval_every}",
        f"eval.every={args.eval_every}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def train_split_command(args: argparse.Namespace, config: str, run_dir: Path) -> list[str]:
    """Greedy episodes on every training init state of the run's newest checkpoint."""
    overrides = [o for o in shared_overrides(args) if not o.startswith("eval.batch_size")]
    return cli(
        "eval", "--config-name", config, "--no-progress", *overrides,
        "eval.split=train", f"eval.name={EVAL_TRAIN}",
        f"eval.batch_size={split_sizes(args)['train']}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def run(command: list[str], log: Path) -> float:
    """Run one phase, its output into ``log``; returns wall seconds; raises on failure."""
    print("$ " + " ".join(command), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise RuntimeError(f"exit {code} after {seconds:.0f} s; last lines of {log}:\n{tail}")
    print(f"  done in {seconds / 60:.1f} min (log: {log})", flush=True)
    return seconds


# ------------------------------------------------------------------------------ results
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluation_file(run_dir: Path, name: str) -> Path:
    """The ``results.jsonl`` of evaluation ``name``: the training run's ``<name>/``, or the
    newest standalone ``embodied-rl eval`` folder ``<name>_<timestamp>/`` when it has none."""
    folder = run_dir / name
    if not folder.is_dir():
        standalone = sorted(run_dir.glob(f"{name}_2*/{name}"))
        folder = standalone[-1] if standalone else folder
    return folder / "results.jsonl"


def evaluations(run_dir: Path, name: str) -> dict[int, dict[str, int]]:
    """``{step: {"successes", "episodes"}}`` summed over tasks (:func:`evaluation_file`)."""
    out: dict[int, dict[str, int]] = {}
    for row in read_jsonl(evaluation_file(run_dir, name)):
        entry = out.setdefault(int(row["step"]), {"successes": 0, "episodes": 0})
        entry["successes"] += int(row["successes"])
        entry["episodes"] += int(row["episodes"])
    return out


def curve(run_dir: Path, start_minutes: float) -> list[dict[str, float]]:
    """Held-out success after each evaluation against training wall minutes."""
    elapsed = {
        int(m["step"]) + 1: float(m["time/elapsed_s"])
        for m in read_jsonl(run_dir / "metrics.jsonl")
        if "time/elapsed_s" in m
    }
    points = []
    for step, result in sorted(evaluations(run_dir, "eval").items()):
        if step in elapsed:
            rate = result["successes"] / max(result["episodes"], 1)
            minutes = start_minutes + elapsed[step] / 60.0
            points.append({"step": step, "minutes": minutes, "success": rate})
    return points


def summary(run_dir: Path, method: str, seconds: float, command: list[str]) -> dict[str, Any]:
    """One table row: the newest evaluation of each split, episodes, wall time, command."""
    row: dict[str, Any] = {"method": method}
    for split, name in (("heldout", "eval"), ("train", EVAL_TRAIN)):
        results = evaluations(run_dir, name)
        last = results[max(results)] if results else {"successes": 0, "episodes": 0}
        row[f"{split}_success"] = last["successes"] / max(last["episodes"], 1)
        row[f"{split}_episodes"] = f"{last['successes']}/{last['episodes']}"
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    row["steps"] = len(metrics)
    row["train_minutes"] = metrics[-1].get("time/elapsed_s", 0.0) / 60.0 if metrics else 0.0
    row["phase_minutes"] = seconds / 60.0
    row["command"] = " ".join(command[2:])  # without the interpreter: `-m embodied_rl.cli ...`
    return row


# ------------------------------------------------------------------------------- phases
def done(run_dir: Path, fresh: bool) -> bool:
    """Whether a phase's run already holds its final results (the train-split evaluation)."""
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    return bool(evaluations(run_dir, EVAL_TRAIN))


def demos_phase(args: argparse.Namespace) -> tuple[Path, list[str]]:
    out = args.runs / "demos"
    tasks = [str(t) for t in args.tasks]
    # --overwrite: this script itself decides when the demos are made again (below)
    command = cli(
        "demos", "--suite", args.suite, "--tasks", *tasks, "--init-states", "0",
        "--image-size", "64", "--no-progress", "--overwrite", "--out", str(out),
    )  # fmt: skip
    if args.fresh or len(list(out.glob("*.hdf5"))) < len(args.tasks):
        run(command, args.runs / "logs" / "demos.log")
    return out, command


def train_and_evaluate(
    args: argparse.Namespace, name: str, config: str, command: list[str]
) -> tuple[Path, float]:
    """Train (unless done), then score the training init states; returns (run, seconds)."""
    run_dir = args.runs / name
    seconds_file = run_dir / "phase_seconds.json"
    if not done(run_dir, args.fresh):
        seconds = run(command, args.runs / "logs" / f"{name}.log")
        seconds += run(
            train_split_command(args, config, run_dir),
            args.runs / "logs" / f"{name}_train_split.log",
        )
        seconds_file.write_text(json.dumps({"seconds": seconds}))
    return run_dir, json.loads(seconds_file.read_text())["seconds"]


def plot(rows: list[dict[str, Any]], curves: dict[str, list], sft_minutes: float, out: Path | None):
    fig, axes = common.new_figure(width=6.0, height=4.0)
    ax = axes[0]
    sft = rows[0]["heldout_success"]
    ax.axhline(100 * sft, color="grey", linestyle="--", label=f"SFT only ({100 * sft:.0f}%)")
    for method, points in curves.items():
        xs = [sft_minutes] + [p["minutes"] for p in points]
        ys = [100 * sft] + [100 * p["success"] for p in points]
        ax.plot(xs, ys, marker="o", label=f"SFT + {method.upper()}")
    ax.set_xlabel("wall time (min): SFT, then RL (evaluations included)")
    ax.set_ylabel("held-out success (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower right")
    ax.set_title("LIBERO, one demo per task: held-out init states")
    return common.save_figure(fig, NAME, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.runs = args.runs.resolve()
    demos, demos_cmd = demos_phase(args)
    sft_cmd = sft_command(args, demos, args.runs / "sft")
    sft_dir, sft_seconds = train_and_evaluate(args, "sft", "sft_libero", sft_cmd)
    rows = [summary(sft_dir, "SFT only (1 demo/task)", sft_seconds, sft_cmd)]
    sft_minutes = rows[0]["train_minutes"]
    curves = {}
    for method in args.methods:
        command = rl_command(args, method, sft_dir, args.runs / method)
        run_dir, seconds = train_and_evaluate(args, method, RL_CONFIGS[method], command)
        row = summary(run_dir, f"SFT + {method.upper()}", seconds, command)
        row["rl_episodes"] = row["steps"] * args.rl_groups * 8  # groups x group_size
        row["gain_points"] = 100 * (row["heldout_success"] - rows[0]["heldout_success"])
        rows.append(row)
        curves[method] = curve(run_dir, sft_minutes)
    columns = [
        "method", "heldout_success", "heldout_episodes", "train_success", "train_episodes",
        "steps", "rl_episodes", "train_minutes", "phase_minutes", "gain_points",
    ]  # fmt: skip
    common.print_table(rows, columns)
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "demos_command": " ".join(demos_cmd[2:]),
        "rows": rows,
        "curves": curves,
        "splits": split_sizes(args),
    }
    common.write_results(NAME, payload, args.out)
    plot(rows, curves, sft_minutes, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
