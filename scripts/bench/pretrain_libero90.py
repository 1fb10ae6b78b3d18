"""Pretraining on the LIBERO-90 corpus: the runs of ``pretrain_libero90``, one per policy.

Issue 51, item 2: instruction-conditioned multi-task behaviour cloning over the scripted
corpus (``configs/pretrain_libero90.yaml``), for OpenVLA-OFT with its L1 head, OpenVLA-OFT
with discrete tokens and OpenVLA. Per policy, the CLI as a user runs it
(``embodied-rl train --config-name pretrain_libero90 policy=<policy>``); a finished run is
read back, a stopped one resumes (``resume=true``). The report has, per run: the corpus it
read (files, episodes, steps), parameters, wall time, samples/s, the loss at the start and
end, the greedy success on the held-out validation init states of the config's ten
evaluation tasks at each evaluation (per task at the end), and the sha256 of the newest
checkpoint's shard (what a checkpoint shipped under ``assets/`` records in its PROVENANCE).

Writes ``docs/benchmarks/pretrain_libero90.{json,png}`` (``--out``) with every command; runs
go to ``outputs/pretrain_libero90/<short name>``.

Run (2 idle cores, with the corpus in demos/libero_90; about 20-30 minutes a policy)::

    .venv/bin/python scripts/bench/pretrain_libero90.py
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path
from typing import Any

import common
from libero_learning import cli, evaluations, read_jsonl
from libero_suites import per_task
from srpo_world_model import has_checkpoint, train_to_the_end, trained

CONFIG = "pretrain_libero90"
POLICIES = {
    "openvla_oft_libero": "oft_l1",
    "openvla_oft_libero_tokens": "oft_tokens",
    "openvla_libero": "openvla",
}
LOSS = "sft/loss"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--runs", type=Path, default=Path("outputs") / CONFIG)
    parser.add_argument("--corpus", type=Path, default=Path("demos") / "libero_90")
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument(
        "--report", action="store_true", help="run nothing: the report of finished runs"
    )  # fmt: skip
    return parser.parse_args(argv)


def train_command(run_dir: Path, policy: str) -> list[str]:
    """The pretraining run as started; a run cut short gets ``resume=true`` added
    (``train_to_the_end``)."""
    return cli("train", "--config-name", CONFIG, "--no-progress", f"policy={policy}",
               f"run_dir={run_dir}")  # fmt: skip


def shard_sha256(run_dir: Path) -> dict[str, Any] | None:
    """``{checkpoint, sha256, bytes}`` of the newest checkpoint's one shard."""
    from embodied_rl.checkpoint import latest_checkpoint, shard_name

    latest = latest_checkpoint(run_dir / "checkpoints")
    if latest is None:
        return None
    shard = latest / shard_name(0)
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    return {"checkpoint": latest.name, "sha256": digest, "bytes": shard.stat().st_size}


def corpus_summary(folder: Path) -> dict[str, Any]:
    """Demo files, episodes, env steps and bytes of the corpus folder."""
    from embodied_rl.data.demos import find_demo_files, scan_demo_file

    files = find_demo_files([folder]) if folder.is_dir() else []
    infos = [info for path in files for info in scan_demo_file(path)]
    return {
        "folder": str(folder),
        "demo_files": len(files),
        "tasks": len({info.task_id for info in infos}),
        "episodes": len(infos),
        "env_steps": sum(info.length for info in infos),
        "gigabytes": round(sum(path.stat().st_size for path in files) / 1e9, 2),
    }


def wall_minutes(metrics: list[dict[str, Any]]) -> float | None:
    """The run's ``time/elapsed_s`` at its last step, in minutes (evaluations included)."""
    elapsed = [float(m["time/elapsed_s"]) for m in metrics if "time/elapsed_s" in m]
    return round(elapsed[-1] / 60, 1) if elapsed else None


def run_row(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    run_dir = (args.runs / POLICIES[policy]).resolve()
    command = train_command(run_dir, policy)
    if not args.report:
        log = run_dir.parent / "logs" / f"{POLICIES[policy]}.log"
        train_to_the_end(command, run_dir, log, fresh=False)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    losses = [(int(m["step"]), float(m[LOSS])) for m in metrics if LOSS in m]
    step_seconds = [float(m["time/step"]) for m in metrics if "time/step" in m]
    batch = 64  # configs/pretrain_libero90.yaml data.batch_size
    return {
        "policy": policy,
        "run_dir": str(run_dir),
        "command": " ".join(command[2:]),
        "finished": trained(run_dir),
        "steps": len(step_seconds),
        "wall_minutes": wall_minutes(metrics),
        # the median step: evaluation steps are much longer than the others
        "samples_per_s": round(batch / statistics.median(step_seconds), 1)
        if step_seconds
        else None,
        "loss_first": losses[0][1] if losses else None,
        "loss_first100": statistics.mean(v for _, v in losses[:100]) if losses else None,
        # the mean of the last 100 steps: one step's loss is one batch's
        "loss_last100": statistics.mean(v for _, v in losses[-100:]) if losses else None,
        "loss_curve": losses[:: max(1, len(losses) // 200)],
        "eval": [
            {"step": step, **result}
            for step, result in sorted(evaluations(run_dir, "eval").items())
        ],
        "eval_by_task": per_task(run_dir / "eval" / "results.jsonl"),
        "shard": shard_sha256(run_dir) if has_checkpoint(run_dir) else None,
    }


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def last_eval(row: dict[str, Any]) -> str:
        if not row["eval"]:
            return "-"
        end = row["eval"][-1]
        rate = 100 * end["successes"] / max(1, end["episodes"])
        return f"{rate:.0f}% ({end['successes']}/{end['episodes']})"

    return [
        {
            "policy": row["policy"],
            "steps": row["steps"],
            "wall min": row["wall_minutes"],
            "samples/s": row["samples_per_s"],
            "loss first 100": row["loss_first100"],
            "loss last 100": row["loss_last100"],
            "held-out success (end)": last_eval(row),
        }
        for row in rows
    ]


def plot(rows: list[dict[str, Any]], out: Path | None) -> Path:
    fig, axes = common.new_figure(ncols=2, width=10.0, height=3.6)
    for row in rows:
        xs, ys = zip(*row["loss_curve"]) if row["loss_curve"] else ((), ())
        axes[0].plot(xs, ys, label=row["policy"])
        evals = row["eval"]
        axes[1].plot([e["step"] for e in evals],
                     [100 * e["successes"] / max(1, e["episodes"]) for e in evals],
                     marker="o", label=row["policy"])  # fmt: skip
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss (L1 or cross-entropy)")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("greedy success (%), 50 held-out episodes")
    axes[1].set_ylim(0, 100)
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle("pretrain_libero90: behaviour cloning over the LIBERO-90 corpus", fontsize=10)
    return common.save_figure(fig, CONFIG, out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    corpus = corpus_summary(args.corpus)
    rows = [run_row(args, policy) for policy in args.policies]
    common.print_table(table(rows))
    payload = {
        "benchmark": CONFIG,
        "args": {k: str(v) for k, v in vars(args).items()},
        "corpus": corpus,
        "table": table(rows),
        "runs": rows,
    }
    common.write_results(CONFIG, payload, args.out)
    plot(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
