"""One-demo SFT on LIBERO's four suites from scratch and from the LIBERO-90 pretrained checkpoint.

Issue 51, item 4: what the prior of ``pretrain_libero90`` buys. Per suite and per start, on
the init-state splits of ``embodied_rl/data/tasks.py`` (``heldout_every`` 5):

1. ``demos``: ONE scripted demonstration per task (``libero_suites.py``'s demos phase: init
   state 0, else the first success among training states 1-3), shared by both starts;
2. ``sft``: behaviour cloning of one multi-task ``--policy`` on those demos, the same command
   for both starts except that the pretrained one adds ``models.actor.init_from=<--pretrained>``
   and keeps its action/proprio statistics (``data.statistics=checkpoint``: the corpus's, which
   its weights were trained under);
3. ``test``: greedy success on the test split (10 tasks x 5 init states), evaluated once;
4. ``sampled``: the SFT policy's sampled rollouts on training init states at ``--temperature``
   (``record_libero``: ``--sampled-pairs`` (task, init state) pairs x 4 episodes): the success
   RL would sample, i.e. whether GRPO / SRPO groups would carry a signal.

Each phase is the CLI as a user runs it; a phase whose output exists is reused (the benchmark
resumes where it stopped; ``--fresh`` reruns). RL from the pretrained start is
``srpo_world_model.py --policy <policy> --sft <runs>/<suite>/pretrained/sft``.

Run (2 idle cores; per suite and start about 6 min of SFT, 5 of test episodes and 4 of
sampled ones)::

    .venv/bin/python scripts/bench/pretrained_starts.py \\
        --pretrained assets/checkpoints/openvla_oft_libero_pretrain90
    .venv/bin/python scripts/bench/pretrained_starts.py --policy openvla_oft_libero_tokens \\
        --pretrained assets/checkpoints/openvla_oft_libero_tokens_pretrain90 --temperature 0.3

Each policy's runs go to ``outputs/pretrained_starts_<policy>`` (``--runs``; the OFT rows of
``docs/benchmarks`` were run with ``--runs outputs/pretrained_starts``).

A run of some suites only keeps the rows of the others from an earlier JSON
(``--keep-from docs/benchmarks/pretrained_starts_<policy>.json``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import common
from libero_learning import cli, evaluation_file, run
from libero_suites import (
    MAX_STEPS,
    SUITES,
    demos_phase,
    kept_rows,
    per_task,
    percent,
    read_earlier,
)
from srpo_world_model import has_checkpoint, success, train_to_the_end, weights_sha256

NAME = "pretrained_starts"
STARTS = ("scratch", "pretrained")
SAMPLED_GROUP = 4  # episodes per (task, init state) pair in the sampled phase
# The paper's numbers for reference, not runs of this benchmark: SRPO (arXiv 2511.15605,
# abstract) starts OpenVLA* (a 7B VLA pretrained on a large robot corpus, then one-demo SFT)
# at 48.9% mean success over the four suites and reaches 99.2% after 200 RL steps.
PAPER = {"one-demo SFT (mean of 4 suites)": 48.9, "SRPO (mean of 4 suites)": 99.2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--pretrained", type=Path, required=True,
        help="the pretrained run (pretrain_libero90's run folder, or one shipped in assets/)",
    )  # fmt: skip
    parser.add_argument("--policy", default="openvla_oft_libero", help="its policy config")
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument("--starts", nargs="+", default=list(STARTS), choices=STARTS)
    parser.add_argument("--sft-steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3, help="SFT learning rate (both starts)")
    parser.add_argument("--temperature", type=float, default=0.05, help="sampled phase")
    parser.add_argument("--sampled-pairs", type=int, default=10, help="(task, init) pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--runs", type=Path, default=None,
        help="run folders (default: outputs/pretrained_starts_<policy>: one per policy, so "
        "that another policy's finished SFT is never taken for this one's)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument("--fresh", action="store_true", help="rerun phases with results")
    parser.add_argument(
        "--report", action="store_true", help="run nothing new: the table of finished cells"
    )  # fmt: skip
    parser.add_argument(
        "--keep-from", type=Path, default=None,
        help="an earlier JSON of this benchmark whose rows stand for the suites not run",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.runs = args.runs or Path("outputs") / result_name(args.policy)
    return args


def result_name(policy: str) -> str:
    return f"{NAME}_{policy}"


# ----------------------------------------------------------------------------- commands
def shared(args: argparse.Namespace, suite: str) -> list[str]:
    """What every phase of a suite shares: the policy, the simulator and the split size."""
    return [
        f"policy={args.policy}",
        f"simulator.options.suite={suite}",
        f"simulator.options.max_steps={MAX_STEPS[suite]}",
        "+simulator.options.max_cached_tasks=2",
        "data.heldout_every=5",
        f"seed={args.seed}",
    ]


def start_overrides(args: argparse.Namespace, start: str) -> list[str]:
    """The pretrained start's two overrides (none for the start from random weights)."""
    if start == "scratch":
        return []
    return [f"models.actor.init_from={args.pretrained.resolve()}", "data.statistics=checkpoint"]


def sft_command(
    args: argparse.Namespace, suite: str, start: str, demos: list[Path], run_dir: Path
) -> list[str]:
    return cli(
        "train", "--config-name", "sft_libero", "--no-progress",
        *shared(args, suite), *start_overrides(args, start),
        f"data.paths=[{','.join(str(d) for d in demos)}]",
        "data.max_demos_per_task=1",
        "data.batch_size=64",
        f"models.actor.optimizer.lr={args.lr}",
        "eval.at_end=false",
        f"trainer.total_steps={args.sft_steps}",
        f"trainer.checkpoint_every={args.sft_steps}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def test_command(args: argparse.Namespace, suite: str, start: str, sft: Path) -> list[str]:
    """Greedy, one episode per (task, test init state): 10 x 5."""
    return cli(
        "eval", "--config-name", "sft_libero", "--no-progress",
        *shared(args, suite), *start_overrides(args, start),
        "eval.split=test", "eval.name=eval_test", "eval.batch_size=50", "eval.max_videos=4",
        "rollout.num_envs=5", "rollout.processes=2",
        f"run_dir={sft}",
    )  # fmt: skip


def sampled_command(args: argparse.Namespace, suite: str, sft: Path, run_dir: Path) -> list[str]:
    """One batch of ``--sampled-pairs`` training pairs x 4 episodes at ``--temperature``."""
    return cli(
        "train", "--config-name", "record_libero", "--no-progress",
        *shared(args, suite),
        f"models.actor.init_from={sft}",
        "data.split=train",
        f"data.batch_size={args.sampled_pairs}",
        f"rollout.group_size={SAMPLED_GROUP}",
        "rollout.num_envs=4",
        f"rollout.temperature={args.temperature}",
        "trainer.total_steps=1",
        f"run_dir={run_dir}",
    )  # fmt: skip


# ------------------------------------------------------------------------------- phases
def sampled_success(run_dir: Path) -> dict[str, Any] | None:
    """``{successes, episodes, rate}`` of the sampled phase, from the episodes it recorded."""
    from embodied_rl.data.episode_videos import scan_videos

    folder = run_dir / "episodes"
    videos = scan_videos([folder]) if folder.is_dir() else []
    if not videos:
        return None
    successes = sum(1 for video in videos if video.success)
    return {"successes": successes, "episodes": len(videos), "rate": successes / len(videos)}


def start_cell(
    args: argparse.Namespace, suite: str, start: str, demos: list[Path]
) -> dict[str, Any]:
    """SFT, then the test and sampled phases, of one (suite, start)."""
    folder = args.runs / suite / start
    logs = folder / "logs"
    sft, sampled = folder / "sft", folder / "sampled"
    commands = {
        "sft": sft_command(args, suite, start, demos, sft),
        "test": test_command(args, suite, start, sft),
        "sampled": sampled_command(args, suite, sft, sampled),
    }
    if not args.report:
        retrained = train_to_the_end(commands["sft"], sft, logs / "sft.log", args.fresh)
        if retrained or success(sft, "eval_test") is None:
            run(commands["test"], logs / "test.log")
        if retrained or sampled_success(sampled) is None:
            shutil.rmtree(sampled, ignore_errors=True)
            run(commands["sampled"], logs / "sampled.log")
    return {
        "test": success(sft, "eval_test"),
        "test_by_task": per_task(evaluation_file(sft, "eval_test")),
        "sampled_train": sampled_success(sampled),
        "weights_sha256": weights_sha256(sft) if has_checkpoint(sft) else None,
        "commands": {name: " ".join(command[2:]) for name, command in commands.items()},
    }


def suite_row(args: argparse.Namespace, suite: str) -> dict[str, Any]:
    commands: dict[str, str] = {}
    demos = demos_phase(args, suite, commands)
    row = {"suite": suite, "demos": {k: v for k, v in demos.items() if k != "paths"}}
    row["demo_commands"] = commands
    for start in args.starts:
        row[start] = start_cell(args, suite, start, demos["paths"])
    return row


# ------------------------------------------------------------------------------- output
def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def cell(row: dict[str, Any], start: str, key: str) -> str:
        return percent((row.get(start) or {}).get(key)) if row.get(start) else "not run"

    return [
        {
            "suite": row["suite"],
            "SFT scratch (test)": cell(row, "scratch", "test"),
            "SFT pretrained (test)": cell(row, "pretrained", "test"),
            "sampled train, scratch": cell(row, "scratch", "sampled_train"),
            "sampled train, pretrained": cell(row, "pretrained", "sampled_train"),
        }
        for row in rows
    ]


def plot(rows: list[dict[str, Any]], policy: str, out: Path | None) -> Path:
    fig, axes = common.new_figure(width=6.4, height=3.6)
    ax = axes[0]
    xs = range(len(rows))

    def rate(row: dict[str, Any], start: str) -> float:
        result = (row.get(start) or {}).get("test")
        return 100 * result["successes"] / max(1, result["episodes"]) if result else 0.0

    for offset, start in ((-0.2, "scratch"), (0.2, "pretrained")):
        ax.bar([x + offset for x in xs], [rate(r, start) for r in rows], 0.4, label=start)
    ax.axhline(PAPER["one-demo SFT (mean of 4 suites)"], color="black", linestyle=":",
               label="paper: one-demo SFT, mean of 4 suites (7B)")  # fmt: skip
    ax.set_xticks(list(xs), [r["suite"] for r in rows])
    ax.set_ylabel("test success (%), 50 episodes")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"one demo per task, {policy}: from scratch vs LIBERO-90 pretrained", fontsize=9)
    return common.save_figure(fig, result_name(policy), out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.pretrained.exists() and "pretrained" in args.starts:
        raise SystemExit(
            f"error: --pretrained {args.pretrained} does not exist. Fix: give the run folder of "
            "`embodied-rl train --config-name pretrain_libero90` or a checkpoint under "
            "assets/checkpoints/"
        )
    args.runs = args.runs.resolve()
    earlier = read_earlier(args.keep_from, result_name(args.policy))
    rows = kept_rows([suite_row(args, suite) for suite in args.suites], earlier)
    common.print_table(table(rows))
    payload = {
        "benchmark": result_name(args.policy),
        "args": {k: str(v) for k, v in vars(args).items()},
        "pretrained_sha256": weights_sha256(args.pretrained)
        if has_checkpoint(args.pretrained)
        else None,
        "paper": PAPER,
        "table": table(rows),
        "suites": rows,
    }
    common.write_results(result_name(args.policy), payload, args.out)
    plot(rows, args.policy, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
