"""LIBERO's four suites as one table: one-demo SFT per suite, then SRPO on some of them.

Issue 25's table, shaped like the SRPO paper's (rows: suites; columns: one-demo SFT, SFT +
SRPO, RL wall time, RL episodes), on the init-state splits of ``embodied_rl/data/tasks.py``
(``heldout_every`` 5: of each task's 50 init states 40 train, 5 validation, 5 test). Per
suite, each phase the CLI as a user runs it (a phase whose output exists is reused, so the
benchmark resumes where it stopped; ``--fresh`` reruns):

1. ``demos``: ONE scripted demonstration per task, from init state 0 (``embodied-rl demos``,
   64 px); a task whose init-state-0 episode the planner fails takes its first success among
   init states 1-3 (``demos_retry``; all training states). A task whose goal the planner
   cannot parse (libero_10's microwave door, task 9) has no demo: the policy never saw it, and its
   row in the per-task detail says so.
2. ``sft``: one multi-task ``policy=mlp_image`` policy for the suite (behaviour cloning on
   those demos, ``world_model_pretraining.py``'s SFT command).
3. ``srpo_world_model.py`` on every task of the suite: the SFT start's greedy success on the
   validation and the test split; with ``--rl-suites`` naming the suite, SRPO
   (``srpo_pooled_pixels``: the pooled-pixel progress reward, not a world model) from it with
   a ``--rl-minutes`` wall-time budget, validation evaluations during RL, then the test split
   once. An RL run cut short resumes from its newest checkpoint.

Success is greedy, one episode per (task, test init state): 50 episodes per suite (5 per task),
so per-task cells move in steps of 20 points; one seed. Episode lengths (``MAX_STEPS``): about
1.5 times the planner's slowest task of the suite, at most LIBERO's per-suite default.

The JSON and plot go to ``docs/benchmarks/libero_suites.{json,png}`` (``--out``), with every
command; the runs under ``--runs``.

Run (2 idle cores: SFT cells 15-30 min per suite, each SRPO cell its budget + evaluations)::

    .venv/bin/python scripts/bench/libero_suites.py                      # SFT cells, 4 suites
    .venv/bin/python scripts/bench/libero_suites.py --rl-suites libero_object libero_goal

A benchmark spread over sessions on machines that do not keep their run folders reports the
suites run here and keeps the other suites' rows from the committed JSON (``--keep-from
docs/benchmarks/libero_suites.json``; each kept row names its source, machine and args).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import common
import srpo_world_model
from libero_learning import cli, evaluation_file, read_jsonl, run
from world_model_pretraining import sft_command

NAME = "libero_suites"
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
# env steps per episode: ~1.5x the planner's slowest task (mean steps of its 50 init states:
# 148, 106, 273, 203; docs/benchmarks/libero_planner_<suite>.json), capped at LIBERO's default
MAX_STEPS = {"libero_spatial": 220, "libero_object": 160, "libero_goal": 300, "libero_10": 320}
RETRY_INIT_STATES = (1, 2, 3)  # training states (heldout_every 5 holds out 4, 9, ...)
METHOD = "srpo_pooled_pixels"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=SUITES)
    parser.add_argument(
        "--rl-suites", nargs="*", default=[], choices=SUITES,
        help="suites that also get the SFT + SRPO cell (the others: SFT only)",
    )  # fmt: skip
    parser.add_argument("--sft-steps", type=int, default=2000)
    parser.add_argument("--rl-minutes", type=float, default=120.0, help="SRPO wall-time budget")
    parser.add_argument("--eval-every", type=int, default=5, help="RL steps between validations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=Path("outputs") / NAME)
    parser.add_argument("--out", type=Path, default=None, help="JSON/plot folder")
    parser.add_argument("--fresh", action="store_true", help="rerun phases with results")
    parser.add_argument(
        "--report", action="store_true",
        help="run nothing new: the table of the cells already finished",
    )  # fmt: skip
    parser.add_argument(
        "--keep-from", type=Path, default=None,
        help="an earlier libero_suites.json whose rows stand for the suites not in --suites",
    )  # fmt: skip
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------- demos
def planner_tasks(suite: str) -> tuple[list[int], dict[int, str]]:
    """The suite's task ids whose goal the planner handles, and the others with the reason."""
    from simulators.libero.demos import suite_tasks
    from simulators.libero.demos_cli import planner_goals

    goals = planner_goals(suite_tasks(suite))
    handled = [task for task, goal in goals.items() if not isinstance(goal, str)]
    return handled, {task: goal for task, goal in goals.items() if isinstance(goal, str)}


def demo_tasks(folders: list[Path]) -> dict[int, int]:
    """``{task id: init state of its first demo}`` over the demo folders, in folder order."""
    from embodied_rl.data.demo_formats import scan_demos

    first: dict[int, int] = {}
    existing = [str(f) for f in folders if f.is_dir() and any(f.glob("*.hdf5"))]
    for info in scan_demos(existing) if existing else []:
        if info.task_id is not None and info.task_id not in first:
            first[info.task_id] = -1 if info.init_state_id is None else info.init_state_id
    return first


def demos_command(suite: str, tasks: list[int], inits: tuple[int, ...], out: Path) -> list[str]:
    return cli(
        "demos", "--suite", suite, "--tasks", *map(str, tasks),
        "--init-states", *map(str, inits),
        "--image-size", "64", "--no-progress", "--overwrite", "--processes", "2",
        "--out", str(out),
    )  # fmt: skip


def demos_phase(args: argparse.Namespace, suite: str, commands: dict[str, str]) -> dict[str, Any]:
    """One demo per handled task (init state 0, else the first success among 1-3)."""
    folder = args.runs / suite
    main, retry = folder / "demos", folder / "demos_retry"
    finished = folder / "demos_done.json"  # written once both calls have ended
    handled, unsupported = planner_tasks(suite)
    commands["demos"] = " ".join(demos_command(suite, handled, (0,), main)[2:])
    if not args.report and (args.fresh or not finished.exists()):
        shutil.rmtree(retry, ignore_errors=True)
        run(demos_command(suite, handled, (0,), main), folder / "logs" / "demos.log")
        missing = [t for t in handled if t not in demo_tasks([main])]
        if missing:
            command = demos_command(suite, missing, RETRY_INIT_STATES, retry)
            run(command, folder / "logs" / "demos_retry.log")
        finished.write_text(json.dumps({"retried": missing}))
    retried = json.loads(finished.read_text())["retried"] if finished.exists() else []
    if retried:
        command = demos_command(suite, retried, RETRY_INIT_STATES, retry)
        commands["demos_retry"] = " ".join(command[2:])
    first = demo_tasks([main, retry])
    return {
        "demo_init_state": first,
        "unsupported": unsupported,
        "no_demo": [t for t in handled if t not in first],
        "paths": [p for p in (main, retry) if p.is_dir() and any(p.glob("*.hdf5"))],
    }


# ------------------------------------------------------------------------------ phases
def sft_phase(
    args: argparse.Namespace, suite: str, demos: list[Path], commands: dict[str, str]
) -> Path:
    run_dir = args.runs / suite / "sft"
    settings = argparse.Namespace(suite=suite, max_steps=MAX_STEPS[suite], sft_steps=args.sft_steps)
    command = sft_command(settings, demos, run_dir)
    commands["sft"] = " ".join(command[2:])
    if not args.report:
        log = args.runs / suite / "logs" / "sft.log"
        srpo_world_model.train_to_the_end(command, run_dir, log, args.fresh)
    return run_dir


def srpo_argv(args: argparse.Namespace, suite: str, sft: Path) -> list[str]:
    """``srpo_world_model.py``'s arguments for the suite: every task; SRPO when asked."""
    methods = [METHOD] if suite in args.rl_suites else []
    argv = [
        "--sft", str(sft), "--suite", suite, "--tasks", *map(str, range(10)),
        "--methods", *methods, "--seeds", str(args.seed),
        "--rl-minutes", str(args.rl_minutes), "--eval-every", str(args.eval_every),
        "--max-steps", str(MAX_STEPS[suite]),
        "--runs", str(args.runs / suite / "rl"), "--out", str(args.runs / suite / "results"),
    ]  # fmt: skip
    return argv + (["--fresh"] if args.fresh else [])


def per_task(results: Path) -> dict[int, dict[str, int]]:
    """``{task: {successes, episodes}}`` of an evaluation's ``results.jsonl`` (newest step)."""
    rows = read_jsonl(results)
    if not rows:
        return {}
    last = max(int(r["step"]) for r in rows)
    return {
        int(r["task"]): {"successes": int(r["successes"]), "episodes": int(r["episodes"])}
        for r in rows
        if int(r["step"]) == last
    }


def suite_row(args: argparse.Namespace, suite: str) -> dict[str, Any]:
    """Demos, SFT, then the start's (and SRPO's) evaluations of one suite."""
    commands: dict[str, str] = {}
    demos = demos_phase(args, suite, commands)
    sft = sft_phase(args, suite, demos["paths"], commands)
    results = args.runs / suite / "results" / f"{srpo_world_model.NAME}.json"
    argv = srpo_argv(args, suite, sft)
    if not args.report:
        srpo_world_model.main(argv)
    if not results.exists():  # --report before the suite's start was evaluated
        return {"suite": suite, "sft_test": None, "srpo_test": None, "rl_minutes": None,
                "rl_episodes": None, "tasks": {}, "commands": commands}  # fmt: skip
    body = json.loads(results.read_text())
    srpo_args = srpo_world_model.parse_args(argv)
    tasks_dir = srpo_world_model.tasks_folder(srpo_args, srpo_args.tasks)
    start_tasks = per_task(evaluation_file(tasks_dir / "start_test", "eval_test"))
    rl = next((r for r in body["runs"] if r["method"] == METHOD), None)
    rl_tasks = per_task(evaluation_file(tasks_dir / f"{METHOD}_seed{args.seed}", "eval_test"))
    return {
        "suite": suite,
        "sft_test": body["start"]["test"],
        "srpo_test": rl["test"] if rl else None,
        "rl_minutes": rl["rl_minutes"] if rl else None,
        "rl_steps": rl["rl_steps"] if rl else None,
        # (task, init state) groups a step x episodes a group (rollout.group_size=8)
        "rl_episodes": rl["rl_steps"] * srpo_args.groups * 8 if rl else None,
        "srpo_validation_curve": rl["curve"] if rl else None,
        "sft_validation_by_task": body["start"]["validation_by_task"],
        "tasks": {
            task: {
                "demo_init_state": demos["demo_init_state"].get(task),
                "unsupported": demos["unsupported"].get(task),
                "sft_test": start_tasks.get(task),
                "srpo_test": rl_tasks.get(task),
            }
            for task in range(10)
        },
        "commands": {**commands, **body["start_commands"], **(rl["commands"] if rl else {})},
        "max_steps": MAX_STEPS[suite],
    }


# ------------------------------------------------------------------------------ output
def percent(result: dict[str, Any] | None) -> str:
    if not result:
        return "-"
    successes, episodes = result["successes"], result["episodes"]
    return f"{100 * successes / max(1, episodes):.0f}% ({successes}/{episodes})"


def table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "suite": row["suite"],
            "one-demo SFT": percent(row["sft_test"]),
            "SFT + SRPO": percent(row["srpo_test"]) if row["srpo_test"] else "not run",
            "RL wall min": row["rl_minutes"] if row["rl_minutes"] is not None else "-",
            "RL episodes": row["rl_episodes"] if row["rl_episodes"] is not None else "-",
        }
        for row in rows
    ]


def task_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (suite, task): the demo's init state (or why there is none) and test success."""
    return [
        {
            "suite": row["suite"],
            "task": task,
            "demo": f"init {cell['demo_init_state']}"
            if cell["demo_init_state"] is not None
            else ("none: goal unsupported" if cell["unsupported"] else "none: planner failed"),
            "one-demo SFT": percent(cell["sft_test"]),
            "SFT + SRPO": percent(cell["srpo_test"]),
        }
        for row in rows
        for task, cell in row["tasks"].items()
    ]


def plot(rows: list[dict[str, Any]], out: Path | None) -> Path:
    fig, axes = common.new_figure(width=6.0, height=3.6)
    ax = axes[0]
    xs = range(len(rows))

    def rate(result: dict[str, Any] | None) -> float:
        return 100 * result["successes"] / max(1, result["episodes"]) if result else 0.0

    ax.bar([x - 0.2 for x in xs], [rate(r["sft_test"]) for r in rows], 0.4, label="one-demo SFT")
    ax.bar([x + 0.2 for x in xs], [rate(r["srpo_test"]) for r in rows], 0.4, label="SFT + SRPO")
    for x, row in zip(xs, rows):
        for offset, key in ((-0.2, "sft_test"), (0.2, "srpo_test")):
            if row[key] is None:
                ax.text(x + offset, 2, "not run", ha="center", rotation=90, fontsize=8)
    ax.set_xticks(list(xs), [r["suite"] for r in rows])
    ax.set_ylabel("test success (%), 50 episodes")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper right")
    ax.set_title("LIBERO, one demo per task, mlp_image (one seed)", fontsize=10)
    return common.save_figure(fig, NAME, out)


def read_earlier(path: Path | None, benchmark: str = NAME) -> dict[str, Any] | None:
    """The earlier JSON of ``--keep-from`` (read before any work starts), or ``None``.

    ``benchmark``: the name its JSON must record (``libero_suites``, or a benchmark that
    keeps rows the same way, e.g. ``pretrained_starts_<policy>``).
    """
    if path is None:
        return None
    try:
        body = json.loads(path.read_text())
        if body["benchmark"] != benchmark:
            raise ValueError(f"it is {body['benchmark']!r}, not {benchmark!r}")
        return {"source": {"json": str(path), "machine": body["machine"], "args": body["args"]},
                "suites": list(body["suites"])}  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(
            f"error: --keep-from {path} is not a {benchmark}.json ({err}). Fix: give the JSON "
            f"an earlier run wrote, e.g. docs/benchmarks/{benchmark}.json"
        ) from None


def kept_rows(rows: list[dict[str, Any]], earlier: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``rows`` and, for every suite they lack, its row from an ``earlier`` JSON of this
    benchmark (:func:`read_earlier`: cells measured in another session, whose run folders are
    gone), marked with where it came from; in :data:`SUITES` order."""
    by_suite = {row["suite"]: row for row in rows}
    for row in earlier["suites"] if earlier else []:
        if row["suite"] not in by_suite:
            by_suite[row["suite"]] = {**row, "kept_from": row.get("kept_from", earlier["source"])}
    return [by_suite[suite] for suite in SUITES if suite in by_suite]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.runs = args.runs.resolve()
    earlier = read_earlier(args.keep_from)
    rows = kept_rows([suite_row(args, suite) for suite in args.suites], earlier)
    common.print_table(task_table(rows))
    common.print_table(table(rows))
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "table": table(rows),
        "suites": rows,
    }
    common.write_results(NAME, payload, args.out)
    plot(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
