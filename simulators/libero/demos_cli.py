"""``embodied-rl demos``: the command (argument checks, the run over tasks) and its report.

The episodes and the demo files come from :mod:`simulators.libero.demos`; this module picks
the tasks and init states, runs them with a progress bar, and with ``--report`` summarises
the planner on every official init state of each task (no cameras) in ``report.json`` and
``report.md``: successes, mean episode steps of the successes, failed init states and why,
and tasks whose goal the planner does not handle.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from embodied_rl.registry import COMMANDS
from embodied_rl.runtime.config import ConfigError
from simulators.libero.demos import EpisodeResult, TaskInfo, demo_path, run_task, suite_tasks
from simulators.libero.goals import Step, UnsupportedGoalError, goal_steps, parse_goal
from simulators.libero.planner import PlannerConfig


@dataclass
class TaskReport:
    """Planner outcome on one task over the init states it ran on."""

    task_id: int
    name: str
    instruction: str
    episodes: int = 0
    successes: int = 0
    mean_steps: float | None = None  # over successful episodes
    failed_init_states: list[int] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    unsupported: str | None = None  # the planner has no skill for the goal

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def check_request(
    tasks: Sequence[TaskInfo], task_ids: Sequence[int], init_ids: Sequence[int], out: Path
) -> None:
    """Refuse ids out of range and an output path that is a file, naming the fix."""
    bad = [t for t in task_ids if not 0 <= t < len(tasks)]
    if bad:
        raise ConfigError(
            f"task id(s) {bad} out of range", f"use ids 0..{len(tasks) - 1} (or 'all')"
        )
    limit = min(tasks[t].num_init_states for t in task_ids) if task_ids else 0
    bad = [i for i in init_ids if not 0 <= i < limit]
    if bad:
        raise ConfigError(
            f"init state id(s) {bad} out of range", f"use ids 0..{limit - 1} (or 'all')"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file", "give a directory (it is created if missing)")


def check_no_demo_files(out: Path, tasks: Sequence[TaskInfo]) -> None:
    """Refuse, before any episode runs, to replace demo files that ``out`` already holds."""
    existing = [demo_path(out, task) for task in tasks if demo_path(out, task).exists()]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise ConfigError(
            f"--out {out} already holds {existing[0].name}{more}; writing would replace it",
            "pass --overwrite to replace it, or choose another --out folder",
        )


def summarise(task: TaskInfo, results: Sequence[EpisodeResult]) -> TaskReport:
    """Success count, mean successful length and failures of one task's episodes."""
    lengths = [r.steps for r in results if r.success]
    failed = [r for r in results if not r.success]
    return TaskReport(
        task_id=task.task_id,
        name=task.name,
        instruction=task.instruction,
        episodes=len(results),
        successes=len(lengths),
        mean_steps=float(np.mean(lengths)) if lengths else None,
        failed_init_states=[r.init_state_id for r in failed],
        failures={r.init_state_id: str(r.failure) for r in failed},
    )


def report_markdown(suite: str, reports: Sequence[TaskReport]) -> str:
    """A Markdown table: task, instruction, successes/episodes, rate, mean steps, failures."""
    lines = [
        f"# Scripted planner on {suite}",
        "",
        "| task | instruction | successes | rate | mean steps | failed init states |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in reports:
        if r.unsupported is not None:
            lines.append(
                f"| {r.task_id} | {r.instruction} | - | - | - | unsupported: {r.unsupported} |"
            )
            continue
        steps = "-" if r.mean_steps is None else f"{r.mean_steps:.1f}"
        failed = ", ".join(map(str, r.failed_init_states)) or "none"
        lines.append(
            f"| {r.task_id} | {r.instruction} | {r.successes}/{r.episodes} | "
            f"{r.rate:.0%} | {steps} | {failed} |"
        )
    ran = [r for r in reports if r.unsupported is None]
    total, wins = sum(r.episodes for r in ran), sum(r.successes for r in ran)
    if total:
        lines += ["", f"Overall: {wins}/{total} ({wins / total:.1%})."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, suite: str, reports: Sequence[TaskReport]) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": suite,
        "tasks": [{**asdict(r), "rate": r.rate} for r in reports],
    }
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(report_markdown(suite, reports), encoding="utf-8")
    return json_path, md_path


def finished_reports(out: Path, suite: str, infos: Sequence[TaskInfo]) -> dict[int, TaskReport]:
    """The task reports a stopped ``--report`` run left in ``out/report.json`` (``--resume``).

    Only tasks that ran on every official init state are kept; a report of another suite is
    refused rather than mixed in.
    """
    path = out / "report.json"
    if not path.exists():
        return {}
    payload = json.loads(path.read_text(encoding="utf-8"))
    if payload.get("suite") != suite:
        raise ConfigError(
            f"--resume: {path} is a report of {payload.get('suite')!r}, not {suite!r}",
            "give the --out folder of the same suite's report, or drop --resume",
        )
    fields = set(TaskReport.__dataclass_fields__)
    kept = {}
    for entry in payload["tasks"]:
        report = TaskReport(**{k: v for k, v in entry.items() if k in fields})
        report.failures = {int(k): v for k, v in report.failures.items()}
        complete = report.episodes == infos[report.task_id].num_init_states
        if report.unsupported is None and complete:
            kept[report.task_id] = report
    return kept


def planner_goals(tasks: Sequence[TaskInfo]) -> dict[int, tuple[Step, ...] | str]:
    """Each task's skill steps, or the reason its goal is unsupported."""
    goals: dict[int, tuple[Step, ...] | str] = {}
    for task in tasks:
        try:
            goals[task.task_id] = goal_steps(parse_goal(task.bddl_text))
        except UnsupportedGoalError as err:
            goals[task.task_id] = str(err)
    return goals


def _resolve(ids: Sequence[int] | None, count: int) -> list[int]:
    """``None`` (all) -> ``0..count-1``; otherwise the ids, deduplicated in order."""
    return list(range(count)) if ids is None else list(dict.fromkeys(int(i) for i in ids))


@COMMANDS.register("demos")
def demos_command(
    *,
    suite: str,
    tasks: Sequence[int] | None,
    init_states: Sequence[int] | None,
    out: str | Path,
    image_size: int = 128,
    report: bool = False,
    resume: bool = False,
    progress: bool = True,
    config: PlannerConfig | None = None,
    overwrite: bool = False,
    videos: bool = False,
) -> int:
    """Write scripted demos of ``tasks`` from ``init_states`` and optionally the report.

    Args:
        tasks: task ids (``None``: every task of the suite).
        init_states: official init-state ids to record (``None``: all; empty: no demos).
        out: directory for ``<task name>_demo.hdf5`` and ``report.{json,md}``.
        image_size: side of both cameras' frames in the demos.
        report: also run every init state of each task without cameras and write the
            success report.
        resume: with ``report``: tasks already complete in ``out/report.json`` are kept,
            not run again (see :func:`finished_reports`).
        overwrite: replace demo files that exist in ``out`` (otherwise they are refused
            before any episode runs).
        videos: also write an MP4 of every demo, ``out/videos/<task name>_init<k>.mp4``.

    Returns:
        The exit status (0).

    Raises:
        ConfigError: bad input (unknown suite, ids out of range, ``out`` is a file, no task
            with a goal the planner handles), naming the fix.
    """
    out = Path(out)
    if image_size < 1:
        raise ConfigError(f"--image-size {image_size} must be >= 1", "use e.g. 128 or 64")
    infos = suite_tasks(suite)
    task_ids = _resolve(tasks, len(infos))
    check_request(infos, task_ids, [] if init_states is None else list(init_states), out)
    selected = [infos[t] for t in task_ids]
    goals = planner_goals(selected)
    if all(isinstance(goal, str) for goal in goals.values()):
        raise ConfigError(
            f"no selected task of {suite} has a goal the planner handles "
            f"({next(iter(goals.values()))})",
            "choose tasks whose goals are In/On/Open/Turnon predicates, e.g. --suite libero_goal",
        )
    config = config or PlannerConfig()
    runnable = [t for t in selected if not isinstance(goals[t.task_id], str)]
    demo_ids = {t.task_id: _resolve(init_states, t.num_init_states) for t in runnable}
    if not overwrite:
        check_no_demo_files(out, [t for t in runnable if demo_ids[t.task_id]])
    if resume and not report:
        raise ConfigError("--resume continues a --report run", "add --report, or drop --resume")
    done = finished_reports(out, suite, infos) if resume else {}
    if done:
        tqdm.write(f"resuming: tasks {sorted(done)} are in {out / 'report.json'} already")
    total = sum(len(ids) for ids in demo_ids.values())
    total += sum(t.num_init_states for t in runnable if t.task_id not in done) if report else 0
    reports = []
    with tqdm(total=total, desc=f"{suite} episodes", disable=not progress) as bar:
        for task in selected:
            steps = goals[task.task_id]
            if isinstance(steps, str):
                tqdm.write(f"task {task.task_id} ({task.name}): skipped, {steps}")
                reports.append(_unsupported(task, steps))
                continue
            if demo_ids[task.task_id]:
                results, path = run_task(
                    suite,
                    task,
                    steps,
                    demo_ids[task.task_id],
                    image_size,
                    out,
                    bar,
                    config,
                    overwrite,
                    videos,
                )
                tqdm.write(_demo_line(task, results, path))
            if report and task.task_id in done:
                reports.append(done[task.task_id])
            elif report:
                ids = range(task.num_init_states)
                results, _ = run_task(suite, task, steps, ids, None, None, bar, config)
                reports.append(summarise(task, results))
                tqdm.write(_report_line(reports[-1]))
                write_report(out, suite, reports)  # so far: a long run shows its progress
    if report:
        json_path, md_path = write_report(out, suite, reports)
        print(report_markdown(suite, reports), end="")
        print(f"report: {json_path} and {md_path}")
    return 0


def _unsupported(task: TaskInfo, reason: str) -> TaskReport:
    return TaskReport(task.task_id, task.name, task.instruction, unsupported=reason)


def _report_line(report: TaskReport) -> str:
    steps = "-" if report.mean_steps is None else f"{report.mean_steps:.1f}"
    return (
        f"task {report.task_id} report: {report.successes}/{report.episodes} successes, "
        f"mean steps {steps}, failed init states {report.failed_init_states}"
    )


def _demo_line(task: TaskInfo, results: Sequence[EpisodeResult], path: Path | None) -> str:
    """One line per task: file, demo lengths, failed init states."""
    lengths = [r.steps for r in results if r.success]
    failed = {r.init_state_id: r.failure for r in results if not r.success}
    where = f"wrote {path}" if path is not None else "no file (no success)"
    text = f"task {task.task_id}: {where}: {len(lengths)}/{len(results)} demos, steps {lengths}"
    return text + (f"; failed {failed}" if failed else "")
