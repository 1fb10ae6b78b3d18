"""SRPO with a pretrained world model vs the pooled-pixel embedding vs binary GRPO, 3 seeds each.

Issue 29's replicated comparison, on the init-state splits of ``embodied_rl/data/tasks.py``:
``train`` (RL samples them), ``validation`` (the only states looked at while choosing
settings; evaluated during RL) and ``test`` (evaluated once, at the end of each run: the
reported number). All runs start from the same one-demo SFT checkpoint
(``world_model_pretraining.py``'s ``sft``: ``policy=mlp_image``, one scripted demo per task):

1. ``start``: the SFT checkpoint's greedy success on the validation split of every task;
   the ``--num-tasks`` tasks where it is lowest but not zero (successes rare: the regime SRPO
   was designed for; with none, neither reward has a signal) are the RL tasks, unless
   ``--tasks`` names them. With ``--sampled-validation`` (the start's *sampled* rollouts on
   the validation split, e.g. ``world_model_pretraining.py``'s ``record_sft_validation``) the
   choice is by their success instead: RL samples its rollouts, so the rare successes SRPO is
   meant for are rare *sampled* successes (greedy 1/5 tasks had 36-59% sampled successes in
   the first reported runs); tasks the start solves greedily on every validation state are
   left out (the reported test success is greedy: no room to rise). Then its test-split
   success on them.
2. for each method and seed: RL from the checkpoint on those tasks for ``--rl-minutes`` of
   training wall time (``trainer.time_limit_min``), validation evaluations every
   ``--eval-every`` steps, then one greedy evaluation of the test split (``eval_test``):
   - ``srpo_world_model``: ``srpo_libero`` with ``video_encoder.vjepa2`` loading the export of
     the pretrained world model (``--world-model``);
   - ``srpo_pooled_pixels``: ``srpo_libero`` with ``video_encoder.cheap``;
   - ``grpo``: ``grpo_libero`` (binary success reward).
   The seed (``seed=``) sets the rollouts' sampling and the task order; the SFT start is shared.

A finished run (its ``eval_test`` results exist, in ``<runs>/tasks_<ids>/<method>_seed<N>``)
is reused and a run cut short resumes from its newest checkpoint (``resume=true``; its
wall-time budget counts the earlier attempts), so the benchmark resumes where it stopped;
``--fresh`` reruns. ``--recorded`` (an
earlier JSON of this benchmark, e.g. ``docs/benchmarks/srpo_world_model.json``) resumes on
another machine: its rows stand in for the runs whose folders are not here, provided its SFT
start scored exactly as this one does and has the same weight digest (the check that both
runs start from the same policy; the SFT is deterministic given its command: rebuilt on a new
VM it gave the same sha256). There, rebuild the start and, for the world-model runs, the world
model with ``world_model_pretraining.py --phases demos sft record_random record_sft pretrain
export --recorded <its JSON>`` (it stops if either comes out different), then pass
``--recorded`` and the recorded ``--tasks`` (the start is then evaluated on those tasks only,
and compared there). Every command is
recorded in the JSON with the per-seed curves; the table gives mean and spread (sample
standard deviation over seeds) of test success.

``--policy`` (default ``mlp_image``) names the SFT start's policy config (e.g.
``flow_vla_tiny``, SFT'd by ``sft_libero`` with that ``policy=``); another policy's runs live
under ``<runs>/<policy>/`` and its results are ``srpo_world_model_<policy>.{json,png}``, so
every policy is compared on the same tasks, splits and budget without mixing results (the
table of docs/benchmarks/policies_task0.md runs ``--methods srpo_pooled_pixels`` for each, with the
policy's own ``--temperature`` and ``--rl-lr``). With ``--tasks`` the start is evaluated on
those tasks only. ``--world-model`` is needed by the ``srpo_world_model`` method only. Each
run's row also has its median seconds per RL step, peak worker memory and the sampled
training rollouts' success (first step, mean of the last three).

The world model's encoder pools its tokens with ``--world-model-pooling`` (default
``mean_and_end``: chosen on the validation videos of ``world_model_latents.py``, where it
separated successes best among the pretrained model's poolings;
docs/benchmarks/world_model_pretraining.md).

Run (about 35 minutes per (method, seed) on 2 idle cores: 30 of RL, then the test
evaluation; 9 runs, resumable, so a session can take a few of them)::

    .venv/bin/python scripts/bench/srpo_world_model.py \\
        --sft outputs/world_model_pretraining/sft \\
        --world-model outputs/world_model_pretraining/vjepa_libero
    .venv/bin/python scripts/bench/srpo_world_model.py ... --methods grpo --seeds 1   # one run
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import common
from libero_learning import cli, evaluations, read_jsonl, run
from world_model_pretraining import ENCODER_FRAMES, weights_sha256

NAME = "srpo_world_model"
DEFAULT_POLICY = "mlp_image"
TRAINED_MARKER = "bench_trained.json"  # written when a run's RL phase has finished
METHODS = ("srpo_world_model", "srpo_pooled_pixels", "grpo")
HELDOUT_EVERY = 5  # as world_model_pretraining: its validation videos are this split's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sft", type=Path, required=True, help="the one-demo SFT run")
    parser.add_argument(
        "--world-model", type=Path, default=None,
        help="embodied-rl export dir (needed by the srpo_world_model method only)",
    )  # fmt: skip
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="the SFT start's policy config")
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--tasks", type=int, nargs="+", default=None, help="default: weakest")
    parser.add_argument("--num-tasks", type=int, default=2)
    parser.add_argument(
        "--sampled-validation", type=Path, default=None,
        help="a recording (record_libero run folder) of the SFT start's sampled rollouts on "
        "the validation split: choose the tasks by their success",
    )  # fmt: skip
    parser.add_argument(
        "--methods", nargs="*", default=list(METHODS), choices=METHODS,
        help="none: only the SFT start's validation and test evaluations",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--world-model-pooling", default="mean_and_end")
    parser.add_argument("--rl-minutes", type=float, default=30.0)
    parser.add_argument(
        "--rl-steps", type=int, default=10000,
        help="also stop after this many RL steps: a step budget that a shared machine "
        "cannot change (the wall-time budget still applies)",
    )  # fmt: skip
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=160)
    parser.add_argument("--groups", type=int, default=8, help="(task, init state) groups a step")
    parser.add_argument("--temperature", type=float, default=0.3)
    parser.add_argument("--rl-lr", type=float, default=2e-4)
    parser.add_argument("--runs", type=Path, default=Path("outputs") / NAME)
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument("--fresh", action="store_true")
    parser.add_argument(
        "--recorded", type=Path, default=None,
        help="an earlier JSON of this benchmark whose runs stand in for missing run folders",
    )  # fmt: skip
    parser.add_argument(
        "--report", action="store_true",
        help="run nothing: the table and plot of the (method, seed) runs already finished",
    )  # fmt: skip
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- commands
def shared(args: argparse.Namespace, tasks: list[int] | None) -> list[str]:
    chosen = [f"data.tasks=[{','.join(str(t) for t in tasks)}]"] if tasks is not None else []
    return [
        f"policy={args.policy}",
        f"simulator.options.suite={args.suite}",
        f"simulator.options.max_steps={args.max_steps}",
        "+simulator.options.max_cached_tasks=2",
        f"data.heldout_every={HELDOUT_EVERY}",
        *chosen,
        "eval.max_videos=4",
    ]


def encoder_overrides(args: argparse.Namespace, method: str) -> list[str]:
    """The reward encoder of ``method``: the world model's export, or the config's own."""
    if method != "srpo_world_model":
        return []
    options = {
        "path": str(args.world_model.resolve()),
        "pooling": args.world_model_pooling,
        **ENCODER_FRAMES,
    }
    encoder = ["models.video_encoder.policy=video_encoder.vjepa2"]
    return encoder + [f"+models.video_encoder.options.{k}={v}" for k, v in options.items()]


def eval_command(
    args: argparse.Namespace,
    config: str,
    run_dir: Path,
    tasks: list[int] | None,
    split: str,
    overrides: Sequence[str] = (),
) -> list[str]:
    """Greedy episodes, one per (task, init state) of ``split``, of the run's checkpoint;
    ``overrides``: the run's own config changes (an evaluation refuses a run whose models
    differ from its config)."""
    pairs = 10 if tasks is None else len(tasks)  # tasks per suite: 10
    per_task = sum(1 for i in range(50) if _split_of(i) == split)
    return cli(
        "eval", "--config-name", config, "--no-progress", *shared(args, tasks), *overrides,
        f"eval.split={split}", f"eval.name=eval_{split}",
        f"eval.batch_size={pairs * per_task}",
        f"run_dir={run_dir}",
    )  # fmt: skip


def _split_of(init_state: int) -> str:
    from embodied_rl.data.tasks import split_of

    return split_of(init_state, HELDOUT_EVERY)


def rl_command(
    args: argparse.Namespace, method: str, seed: int, tasks: list[int], run_dir: Path
) -> list[str]:
    config = "grpo_libero" if method == "grpo" else "srpo_libero"
    validation = sum(1 for i in range(50) if _split_of(i) == "validation") * len(tasks)
    return cli(
        "train", "--config-name", config, "--no-progress", *shared(args, tasks),
        *encoder_overrides(args, method),
        f"seed={seed}",
        f"models.actor.init_from={args.sft.resolve()}",
        f"data.batch_size={args.groups}", "rollout.group_size=8", "rollout.num_envs=4",
        f"rollout.temperature={args.temperature}",
        f"models.actor.optimizer.lr={args.rl_lr}",
        "models.actor.optimizer.warmup_steps=8",
        "algorithm.actor.loss_agg_mode=seq-mean-token-mean",
        "algorithm.actor.ppo_epochs=2", "algorithm.actor.num_mini_batches=2",
        "algorithm.actor.micro_batch_size=64",
        f"trainer.total_steps={args.rl_steps}", f"trainer.time_limit_min={args.rl_minutes}",
        f"trainer.checkpoint_every={args.eval_every}", f"eval.every={args.eval_every}",
        "eval.split=validation", f"eval.batch_size={validation}",
        f"run_dir={run_dir}",
    )  # fmt: skip


# ------------------------------------------------------------------------------ results
def success(run_dir: Path, name: str, step: int | None = None) -> dict[str, Any] | None:
    """``{successes, episodes, rate}`` of an evaluation (its newest step by default)."""
    results = evaluations(run_dir, name)
    if not results:
        return None
    entry = results[max(results) if step is None else step]
    return {**entry, "rate": entry["successes"] / max(1, entry["episodes"])}


def weakest_tasks(run_dir: Path, count: int) -> tuple[list[int], dict[int, float]]:
    """The ``count`` tasks with the lowest greedy validation success above zero
    (:func:`lowest_solved`), and every task's rate."""
    folders = sorted(run_dir.glob("eval_validation*/eval_validation")) or [
        run_dir / "eval_validation"
    ]
    per_task: dict[int, list[int]] = {}
    for row in read_jsonl(folders[-1] / "results.jsonl"):
        entry = per_task.setdefault(int(row["task"]), [0, 0])
        entry[0] += int(row["successes"])
        entry[1] += int(row["episodes"])
    rates = {task: s / max(1, n) for task, (s, n) in sorted(per_task.items())}
    return lowest_solved(rates, count), rates


def sampled_validation(recording: Path, sft: Path) -> dict[int, float]:
    """Success rate by task of ``recording``'s episodes (a ``record_libero`` run folder):
    the SFT start's sampled rollouts on the validation split.

    Raises:
        ValueError: the recording holds an init state outside the validation split, or its
            run started from another checkpoint than ``sft``.
    """
    from embodied_rl.data.episode_videos import scan_videos

    config = recording / "config.yaml"
    if config.is_file():
        from omegaconf import OmegaConf

        start = OmegaConf.load(config).models.actor.get("init_from")
        if start is None or Path(start).resolve() != sft.resolve():
            raise ValueError(
                f"--sampled-validation {recording}: its rollouts started from {start}, not "
                f"--sft {sft}. Fix: record the start's rollouts (record_libero with "
                f"models.actor.init_from={sft} data.split=validation) or pass that recording"
            )
    per_task: dict[int, list[int]] = {}
    for video in scan_videos([recording / "episodes" if config.is_file() else recording]):
        if video.task is None or video.init_state is None:
            raise ValueError(f"--sampled-validation: {video.source} records no task/init state")
        if _split_of(video.init_state) != "validation":
            raise ValueError(
                f"--sampled-validation: {video.source} is of init state {video.init_state}, "
                f"in the {_split_of(video.init_state)} split. Fix: record data.split=validation "
                f"with data.heldout_every={HELDOUT_EVERY}"
            )
        entry = per_task.setdefault(video.task, [0, 0])
        entry[0] += int(video.success)
        entry[1] += 1
    return {task: k / n for task, (k, n) in sorted(per_task.items())}


def lowest_solved(rates: dict[int, float], count: int) -> list[int]:
    """The ``count`` tasks of lowest success above zero (ties: lower id).

    A task the start never solves is left out: both rewards learn only from groups with a
    success in them (GRPO's advantages are all zero otherwise, and SRPO scores a failure by
    its distance to the group's successes), so RL there measures nothing.
    """
    solved = [task for task, rate in rates.items() if rate > 0]
    return sorted(solved, key=lambda t: (rates[t], t))[:count]


def with_headroom(sampled: dict[int, float], greedy: dict[int, float]) -> dict[int, float]:
    """``sampled`` without the tasks whose greedy validation success is already 1: the
    reported test success is greedy, and such a task could not show a gain."""
    return {task: rate for task, rate in sampled.items() if greedy.get(task, 0.0) < 1.0}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: test success mean and sample std over seeds, the per-seed values and the
    mean number of RL steps (the same wall time buys a slower reward fewer steps)."""
    table = []
    for method in METHODS:
        done = [r for r in rows if r["method"] == method and r.get("test")]
        if not done:
            continue
        tests = [r["test"]["rate"] for r in done]
        table.append(
            {
                "method": method,
                "seeds": len(tests),
                "test_mean": statistics.mean(tests),
                "test_std": statistics.stdev(tests) if len(tests) > 1 else float("nan"),
                "per_seed": " ".join(f"{100 * t:.0f}" for t in tests),
                "rl_steps": statistics.mean(r.get("rl_steps", 0) for r in done),
            }
        )
    return table


def plot(rows: list[dict[str, Any]], start: float, policy: str, out: Path | None) -> Path:
    fig, axes = common.new_figure(width=6.0, height=4.0)
    ax = axes[0]
    ax.axhline(100 * start, color="grey", linestyle="--", label=f"SFT start ({100 * start:.0f}%)")
    colours = dict(zip(METHODS, ("tab:green", "tab:orange", "tab:blue")))
    for row in rows:
        xs = [0] + [p["step"] for p in row["curve"]]
        ys = [100 * start] + [100 * p["rate"] for p in row["curve"]]
        label = row["method"] if row["seed"] == min(r["seed"] for r in rows) else None
        ax.plot(xs, ys, color=colours[row["method"]], marker="o", alpha=0.7, label=label)
    ax.set_xlabel("RL step")
    ax.set_ylabel("validation success (%)")
    ax.set_ylim(0, 104)  # markers at 100% stay whole
    ax.legend(loc="lower right")
    ax.set_title(f"{policy}: SRPO rewards vs GRPO (a line per seed)", fontsize=10)
    return common.save_figure(fig, result_name(policy), out)


# ------------------------------------------------------------------------------- phases
def result_name(policy: str) -> str:
    """The JSON / plot name of ``policy``'s results (the default policy's: the benchmark's)."""
    return NAME if policy == DEFAULT_POLICY else f"{NAME}_{policy}"


def policy_folder(args: argparse.Namespace) -> Path:
    """Where ``--policy``'s runs and logs live (the default policy's runs keep the layout of
    the first reported runs: directly under ``--runs``)."""
    return args.runs if args.policy == DEFAULT_POLICY else args.runs / args.policy


def tasks_folder(args: argparse.Namespace, tasks: list[int]) -> Path:
    """Where the runs on ``tasks`` live: another task choice or policy never reuses their
    results."""
    return policy_folder(args) / ("tasks_" + "_".join(str(t) for t in tasks))


def start_phase(
    args: argparse.Namespace, commands: dict[str, str], sampled: dict[int, float] | None = None
) -> tuple[list[int], dict]:
    """Validation success of the SFT start on every task; the RL tasks (by ``sampled``
    validation success when given, :func:`sampled_validation`); their test success; the
    digest of its weights (:func:`weights_sha256`: how a rerun knows it starts there)."""
    # every task when the benchmark chooses them, else the given ones only
    command = eval_command(args, "sft_libero", args.sft, args.tasks, "validation")
    commands["start_validation"] = " ".join(command[2:])  # also when reused: the JSON's record
    if success(args.sft, "eval_validation") is None or args.fresh:
        run(command, policy_folder(args) / "logs" / "start_validation.log")
    tasks, rates = weakest_tasks(args.sft, args.num_tasks)
    if sampled is not None:
        tasks = lowest_solved(with_headroom(sampled, rates), args.num_tasks)
    tasks = args.tasks if args.tasks is not None else tasks
    start_test = tasks_folder(args, tasks) / "start_test"  # the RL tasks' test split
    command = eval_command(args, "sft_libero", start_test, tasks, "test")
    commands["start_test"] = " ".join(command[2:])
    if success(start_test, "eval_test") is None or args.fresh:
        shutil.rmtree(start_test, ignore_errors=True)
        shutil.copytree(args.sft, start_test, ignore=shutil.ignore_patterns("eval*"))
        run(command, tasks_folder(args, tasks) / "logs" / "start_test.log")
    return tasks, {
        "validation_by_task": rates,
        "sampled_validation_by_task": sampled,
        "test": success(start_test, "eval_test"),
        "weights_sha256": weights_sha256(args.sft),
    }


def recorded_runs(
    path: Path | None, tasks: list[int], start: dict[str, Any], name: str = NAME
) -> dict[tuple[str, int], dict[str, Any]]:
    """The finished runs of an earlier JSON of this benchmark, by (method, seed), each marked
    ``reused_from`` the file and, where the row does not say, ``ran`` at the file's commit
    and date (those of the report that wrote it: the run itself may be older). The starts
    must agree in their scores (validation: on every task both evaluated, the RL tasks among
    them) and, where both files have it, their weights' digest.

    Raises:
        ValueError: the file is another benchmark's (or policy's: ``name`` is the result
            name, :func:`result_name`), or its runs were on other tasks or from
            a start that scored differently (then they are not comparable with new runs).
    """
    if path is None:
        return {}
    body = json.loads(path.read_text())
    if body.get("benchmark") != name:
        raise ValueError(
            f"--recorded {path}: not a {name} result (benchmark={body.get('benchmark')!r})"
        )
    theirs = body.get("start", {})
    # JSON keys are strings: compare the start's numbers task by task
    their_rates = {int(k): v for k, v in theirs.get("validation_by_task", {}).items()}
    their_test = (theirs.get("test") or {}).get("successes")
    ours_test = (start.get("test") or {}).get("successes")
    mismatch = []
    if body.get("tasks") != tasks:
        mismatch.append(f"RL tasks {body.get('tasks')} vs {tasks}")
    # a start evaluated on the RL tasks only (``--tasks``) is compared on those tasks
    ours_rates = start["validation_by_task"]
    both = sorted(set(their_rates) & set(ours_rates))
    if not set(tasks) <= set(both) or any(their_rates[t] != ours_rates[t] for t in both):
        mismatch.append(f"start validation {their_rates} vs {ours_rates}")
    if their_test != ours_test:
        mismatch.append(f"start test successes {their_test} vs {ours_test}")
    their_weights, our_weights = theirs.get("weights_sha256"), start.get("weights_sha256")
    if their_weights and our_weights and their_weights != our_weights:
        mismatch.append(f"start weights sha256 {their_weights[:12]} vs {our_weights[:12]}")
    if mismatch:
        raise ValueError(
            f"--recorded {path}: its runs did not start where these do ({'; '.join(mismatch)});"
            " rebuild the SFT start with the command in its JSON, or leave --recorded out"
        )
    machine = body.get("machine", {})
    written = {"commit": machine.get("commit"), "date": machine.get("date")}
    return {
        (row["method"], int(row["seed"])): {
            **row,
            "ran": row.get("ran") or written,
            "reused_from": str(path),
        }
        for row in body.get("runs", [])
        if row.get("test")
    }


def where_run() -> dict[str, Any]:
    """The commit and date a run finished at (kept in its marker, reported with its row)."""
    return {"commit": common.machine_info()["commit"], "date": date.today().isoformat()}


def run_provenance(marker: Path) -> dict[str, Any]:
    """``{commit, date}`` from a run's marker; a marker written before they were kept gives
    its file date and no commit."""
    if not marker.exists():
        return {"commit": None, "date": None}
    body = json.loads(marker.read_text())
    written = date.fromtimestamp(marker.stat().st_mtime).isoformat()
    return {"commit": body.get("commit"), "date": body.get("date", written)}


def rl_phase(
    args: argparse.Namespace,
    method: str,
    seed: int,
    tasks: list[int],
    recorded: dict[tuple[str, int], dict[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """One (method, seed): RL, then the test evaluation; each phase is skipped when done.
    A run with no folder here that ``recorded`` holds is that row (unless ``--fresh``).
    With ``--report``, ``None`` for a run not finished (nothing is run)."""
    run_dir = tasks_folder(args, tasks) / f"{method}_seed{seed}"
    finished = success(run_dir, "eval_test") is not None
    if not run_dir.exists() and not args.fresh and (method, seed) in (recorded or {}):
        return recorded[(method, seed)]
    if args.report and not finished:
        return None
    config = "grpo_libero" if method == "grpo" else "srpo_libero"
    encoder = encoder_overrides(args, method)
    commands = {
        "train": rl_command(args, method, seed, tasks, run_dir),
        "test": eval_command(args, config, run_dir, tasks, "test", encoder),
    }
    logs = run_dir.parent / "logs"
    trained = run_dir / TRAINED_MARKER
    if args.report:
        pass  # a finished run, read as it is
    elif args.fresh or not trained.exists():
        attempt = training_attempt(commands["train"], run_dir, args.fresh)
        suffix = "_resumed" if attempt[-1] == "resume=true" else ""
        seconds = run(attempt, logs / f"{method}_seed{seed}_train{suffix}.log")
        marker = {"seconds": seconds, "command": commands["train"], **where_run()}
        trained.write_text(json.dumps(marker))
    if not args.report and success(run_dir, "eval_test") is None:
        run(commands["test"], logs / f"{method}_seed{seed}_test.log")
    validation = evaluations(run_dir, "eval")
    curve = [
        {"step": step, "rate": e["successes"] / max(1, e["episodes"])}
        for step, e in sorted(validation.items())
    ]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    ran = run_provenance(trained)
    return {
        "method": method,
        "seed": seed,
        "test": success(run_dir, "eval_test"),
        "validation_last": curve[-1]["rate"] if curve else None,
        "curve": curve,
        "rl_steps": len(metrics),
        "rl_minutes": metrics[-1].get("time/elapsed_s", 0.0) / 60.0 if metrics else 0.0,
        **step_costs(metrics),
        "commands": {k: " ".join(v[2:]) for k, v in commands.items()},
        "ran": ran,
    }


def training_attempt(command: list[str], run_dir: Path, fresh: bool) -> list[str]:
    """The command that (re)starts a run not yet trained: a run cut short (a SIGTERM, a killed
    benchmark) resumes from its newest checkpoint (``resume=true``; its wall-time budget counts the
    earlier attempts' training time, ``trainer.time_limit_min``); otherwise, or with
    ``fresh``, whatever the folder holds is removed and the run starts from the SFT start."""
    if not fresh and has_checkpoint(run_dir):
        return [*command, "resume=true"]
    shutil.rmtree(run_dir, ignore_errors=True)
    return list(command)


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a complete checkpoint a training run can resume from."""
    from embodied_rl.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir / "checkpoints") is not None  # None: no folder either


def configured_steps(run_dir: Path) -> int | None:
    """``trainer.total_steps`` of the run's saved ``config.yaml`` (None: no config yet)."""
    from omegaconf import OmegaConf

    config = run_dir / "config.yaml"
    return int(OmegaConf.load(config).trainer.total_steps) if config.is_file() else None


def trained(run_dir: Path) -> bool:
    """Whether the run's newest checkpoint is its last step. A run cut short (a SIGTERM, a
    killed benchmark) has a checkpoint too, but is not trained: it resumes from it."""
    from embodied_rl.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir / "checkpoints") if run_dir.is_dir() else None
    steps = configured_steps(run_dir)
    return latest is not None and steps is not None and latest.name == f"step_{steps:06d}"


def train_to_the_end(command: list[str], run_dir: Path, log: Path, fresh: bool) -> bool:
    """Run the training ``command`` unless ``run_dir`` is trained (and not ``fresh``): a run
    cut short resumes (``training_attempt``), and the standalone evaluations it holds
    (``<name>_<timestamp>/`` of ``embodied-rl eval``) are removed, since they evaluated
    weights that were not the finished run's. Returns whether it ran (the weights changed:
    what was measured of them before must be measured again)."""
    if trained(run_dir) and not fresh:
        return False
    for stale in run_dir.glob("eval*_2*"):
        shutil.rmtree(stale)
    run(training_attempt(command, run_dir, fresh), log)
    return True


def step_costs(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """What the RL steps cost and how the sampled training rollouts did: median seconds per
    step, peak worker RSS (MB, max over steps and ranks), rollout success of the first step
    and the mean of the last three (training init states, sampled at the run's temperature)."""
    if not metrics:
        return {}
    rates = [m["rollout/success_rate"] for m in metrics if "rollout/success_rate" in m]
    rss = [m["memory/worker_rss_mb"] for m in metrics if "memory/worker_rss_mb" in m]
    return {
        "seconds_per_step": statistics.median(m.get("time/step", 0.0) for m in metrics),
        "peak_worker_rss_mb": max(rss) if rss else None,
        "train_rollout_success_first": rates[0] if rates else None,
        "train_rollout_success_last3": statistics.mean(rates[-3:]) if rates else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "srpo_world_model" in args.methods and args.world_model is None:
        raise SystemExit(
            "error: the srpo_world_model method needs --world-model (an `embodied-rl export` "
            "of the pretrained world model). Fix: pass it, or leave the method out with "
            "--methods srpo_pooled_pixels grpo"
        )
    if args.recorded is not None and not args.recorded.is_file():  # refused before any run
        raise SystemExit(
            f"error: --recorded {args.recorded}: no such file. Fix: give an earlier JSON of "
            f"this benchmark (e.g. docs/benchmarks/{result_name(args.policy)}.json) or leave it out"
        )
    sampled = None
    if args.sampled_validation is not None:  # refused before any run
        try:
            sampled = sampled_validation(args.sampled_validation, args.sft)
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
        except FileNotFoundError as err:
            raise SystemExit(
                f"error: --sampled-validation: {err}. Fix: give the record_libero run folder of "
                f"the start's validation rollouts (world_model_pretraining.py's "
                f"record_sft_validation)"
            ) from None
    args.runs = args.runs.resolve()
    args.runs.mkdir(parents=True, exist_ok=True)
    commands: dict[str, str] = {}
    tasks, start = start_phase(args, commands, sampled)
    print(f"RL tasks {tasks}; SFT start validation by task {start['validation_by_task']}")
    if sampled is not None:
        print(f"  sampled validation success by task (the choice) {sampled}")
    recorded = recorded_runs(args.recorded, tasks, start, result_name(args.policy))
    # seed-major: a session that stops early has every method at the same number of seeds
    rows = [
        rl_phase(args, method, seed, tasks, recorded)
        for seed in args.seeds
        for method in args.methods
    ]
    rows = [row for row in rows if row is not None]
    table = summarise(rows)
    if start["test"] is not None:
        print(f"SFT start, test split of the RL tasks: {start['test']['rate']:.2f}")
    common.print_table(table, ["method", "seeds", "test_mean", "test_std", "per_seed", "rl_steps"])
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "tasks": tasks,
        "start": start,
        "start_commands": commands,
        "table": table,
        "runs": rows,
    }
    common.write_results(result_name(args.policy), payload, args.out)
    # the curves are validation success on the RL tasks (equal episodes per task)
    by_task = start["validation_by_task"]
    plot(rows, statistics.mean(by_task[t] for t in tasks), args.policy, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
