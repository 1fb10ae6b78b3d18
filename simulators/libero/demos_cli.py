"""``embodied-rl demos``: the command (argument checks, the run over tasks) and its report.

Its options are parsed by :mod:`simulators.libero.commands`, which registers the command and
calls :func:`demos_command`. The episodes and the demo files come from
:mod:`simulators.libero.demos`; this module picks the tasks and init states, runs them with a
progress bar, and with ``--report`` summarises the planner on every official init state of
each task (no cameras) in ``report.json`` and ``report.md``: successes, mean episode steps of
the successes, failed init states and why, and tasks whose goal the planner does not handle.

Every run that records demos also keeps ``demos.json`` / ``demos.md`` in the output folder: the
same summary of the recorded episodes (the planner's success on the init states asked for),
each task's file and the digest of its content (:func:`~embodied_rl.data.demos.content_digest`),
written after every task. ``--resume`` keeps the tasks it holds (asked the same init states,
their file present and unchanged) and runs the others: a stopped corpus build goes on where it
stopped, and a rebuild is checked equal by comparing two ``demos.json``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
from tqdm import tqdm

from embodied_rl.data.demos import content_digest
from embodied_rl.processes import descendants, end_processes
from embodied_rl.runtime.config import ConfigError
from embodied_rl.runtime.path_guard import check_apart
from simulators.libero.demo_reports import (
    DEMOS,
    TaskReport,
    finished_demos,
    finished_reports,
    report_markdown,
    summarise,
    write_report,
)
from simulators.libero.demos import EpisodeResult, TaskInfo, demo_path, run_task, suite_tasks
from simulators.libero.goals import Step, UnsupportedGoalError, goal_steps, parse_goal
from simulators.libero.planner_config import PlannerConfig


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
    processes: int = 1,
) -> int:
    """Write scripted demos of ``tasks`` from ``init_states`` and optionally the report.

    Args:
        tasks: task ids (``None``: every task of the suite).
        init_states: official init-state ids to record (``None``: all; empty: no demos).
        out: directory for ``<task name>_demo.hdf5`` and ``report.{json,md}``.
        image_size: side of both cameras' frames in the demos.
        report: also run every init state of each task without cameras and write the
            success report.
        resume: tasks whose demos ``out/demos.json`` records (the same init states, the
            file unchanged) are not run again (:func:`finished_demos`), nor, with ``report``,
            tasks complete in ``out/report.json`` (:func:`finished_reports`).
        overwrite: replace demo files that exist in ``out`` (otherwise they are refused
            before any episode runs).
        videos: also write an MP4 of every demo, ``out/videos/<task name>_init<k>.mp4``.
        processes: run the tasks in this many spawned processes at once (a task's episodes
            stay in one process, in order): the same files and report, one task per core.

    Returns:
        The exit status (0).

    Raises:
        ConfigError: bad input (unknown suite, ids out of range, ``out`` is a file, no task
            with a goal the planner handles), naming the fix.
    """
    out = Path(out)
    if image_size < 1:
        raise ConfigError(f"--image-size {image_size} must be >= 1", "use e.g. 128 or 64")
    if processes < 1:
        raise ConfigError(f"--processes {processes} must be >= 1", "use 1, or the cores to use")
    if init_states is not None and not init_states and not report:
        raise ConfigError(
            "--init-states is given no ids and --report is not set: nothing would run",
            "give init-state ids (e.g. --init-states 0 1 2) or 'all', or add --report",
        )
    infos = suite_tasks(suite)
    task_files = Path(infos[0].bddl_path).resolve().parents[1]  # LIBERO's bddl_files/
    check_apart("demos --out", out, {"LIBERO's task files": task_files}, "choose another --out")
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
    done = finished_reports(out, suite, infos) if resume and report else {}
    recorded = finished_demos(out, suite, demo_ids) if resume else {}
    if done or recorded:
        tqdm.write(f"resuming: tasks {sorted(set(done) | set(recorded))} are in {out} already")
    for task_id in recorded:
        demo_ids[task_id] = []  # their demos are written: not run again
    if not overwrite:
        check_no_demo_files(out, [t for t in runnable if demo_ids[t.task_id]])
    jobs = {
        t.task_id: TaskJob(
            suite,
            t,
            goals[t.task_id],
            demo_ids[t.task_id],
            image_size,
            out,
            config,
            overwrite,
            videos,
            report and t.task_id not in done,
        )
        for t in runnable
    }
    demo_reports = {task_id: recorded[task_id] for task_id in recorded}
    reports: dict[int, TaskReport] = {}
    previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        _run_all(suite, out, report, progress, selected, goals, done, jobs, processes,
                 init_states, task_ids, reports, demo_reports)  # fmt: skip
    except Stopped as stop:
        print(
            f"error: stopped by {stop}; the tasks finished so far are in {out} (demos.json); "
            "the same command with --resume goes on from there",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        # Now, not through the interpreter's exit: its hook would join the dead pool's
        # management thread, which can wait forever once the workers were terminated.
        os._exit(128 + stop.signum)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    reports = _in_order(reports, task_ids)
    if any(demo_ids.values()):
        json_path, _ = write_report(out, suite, _in_order(demo_reports, task_ids), DEMOS)
        ran = [r for r in demo_reports.values() if r.unsupported is None]
        wins, total = sum(r.successes for r in ran), sum(r.episodes for r in ran)
        print(f"demos: {wins}/{total} episodes succeeded, recorded in {json_path}")
    if report:
        json_path, md_path = write_report(out, suite, reports)
        print(report_markdown(suite, reports), end="")
        print(f"report: {json_path} and {md_path}")
    return 0


def _run_all(
    suite: str,
    out: Path,
    report: bool,
    progress: bool,
    selected: Sequence[TaskInfo],
    goals: dict[int, Any],
    done: dict[int, TaskReport],
    jobs: dict[int, TaskJob],
    processes: int,
    init_states: Sequence[int] | None,
    task_ids: Sequence[int],
    reports: dict[int, TaskReport],
    demo_reports: dict[int, TaskReport],
) -> None:
    """Run every job with a progress bar, recording the reports as each task ends."""
    total = sum(job.episodes for job in jobs.values())
    with tqdm(total=total, desc=f"{suite} episodes", disable=not progress) as bar:
        for task in selected:
            steps = goals[task.task_id]
            if isinstance(steps, str):
                tqdm.write(f"task {task.task_id} ({task.name}): skipped, {steps}")
                reports[task.task_id] = _unsupported(task, steps)
                if init_states is None or init_states:
                    demo_reports[task.task_id] = _unsupported(task, steps)
            elif report and task.task_id in done:
                reports[task.task_id] = done[task.task_id]
        for task_id, outcome in _run_jobs(jobs, processes, bar):
            task = jobs[task_id].task
            if jobs[task_id].demo_ids:
                tqdm.write(_demo_line(task, outcome.demos, outcome.demo_file))
                demo_reports[task_id] = demo_record(task, outcome)
                write_report(out, suite, _in_order(demo_reports, task_ids), DEMOS)
            if outcome.report is not None:
                reports[task_id] = summarise(task, outcome.report)
                tqdm.write(_report_line(reports[task_id]))
                write_report(out, suite, _in_order(reports, task_ids))  # so far: the progress


@dataclass(frozen=True)
class TaskJob:
    """What one task runs: its demos (``demo_ids``, may be empty), then, if ``report``, every
    official init state without cameras."""

    suite: str
    task: TaskInfo
    steps: tuple[Step, ...]
    demo_ids: list[int]
    image_size: int
    out: Path
    config: PlannerConfig
    overwrite: bool
    videos: bool
    report: bool

    @property
    def episodes(self) -> int:
        return len(self.demo_ids) + (self.task.num_init_states if self.report else 0)


@dataclass(frozen=True)
class TaskOutcome:
    """A finished :class:`TaskJob`: the demo episodes (recordings dropped: they are in the
    file), the file written, and the report's episodes (``None``: no report)."""

    demos: list[EpisodeResult]
    demo_file: Path | None
    report: list[EpisodeResult] | None


def demo_record(task: TaskInfo, outcome: TaskOutcome) -> TaskReport:
    """The ``demos.json`` entry of a task's demo episodes: their summary, file and digest."""
    record = summarise(task, outcome.demos)
    if outcome.demo_file is not None:
        record.demo_file = outcome.demo_file.name
        record.digest = content_digest(outcome.demo_file)
    return record


def run_job(job: TaskJob, bar: tqdm | None = None) -> TaskOutcome:
    """Run ``job`` in this process, advancing ``bar`` (if any) once per episode."""
    bar = bar if bar is not None else tqdm(disable=True)
    demos, path = [], None
    if job.demo_ids:
        demos, path = run_task(
            job.suite,
            job.task,
            job.steps,
            job.demo_ids,
            job.image_size,
            job.out,
            bar,
            job.config,
            job.overwrite,
            job.videos,
        )
    report = None
    if job.report:
        ids = range(job.task.num_init_states)
        report, _ = run_task(job.suite, job.task, job.steps, ids, None, None, bar, job.config)
    light = [replace(r, episode=None) for r in demos]  # the recordings are in the file
    return TaskOutcome(light, path, report)


def _run_jobs(
    jobs: dict[int, TaskJob], processes: int, bar: tqdm
) -> Iterator[tuple[int, TaskOutcome]]:
    """``(task id, outcome)`` of every job: in task order in this process, or in the order
    they finish in ``processes`` spawned ones (fork would copy GL and MuJoCo state)."""
    work = {task_id: job for task_id, job in jobs.items() if job.episodes}
    if processes == 1 or len(work) < 2:
        for task_id, job in work.items():
            yield task_id, run_job(job, bar)
        return
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(processes, len(work)), mp_context=context)
    try:
        futures = {pool.submit(run_job, job): task_id for task_id, job in work.items()}
        for future in as_completed(futures):
            task_id = futures[future]
            bar.update(work[task_id].episodes)
            yield task_id, future.result()
    except BaseException:  # a signal (Stopped, KeyboardInterrupt) or a task's error
        end_children()  # the pool would wait for the running tasks, its workers outlive us
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


class Stopped(BaseException):
    """SIGTERM (or Ctrl-C) reached ``embodied-rl demos``; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def end_children(timeout_s: float = 5.0) -> None:
    """Terminate the processes this one started (the pool's workers), killing those still
    alive after ``timeout_s``. multiprocessing's resource tracker is left to end by itself:
    it does when the last process holding its pipe (this one) exits, and ended early it is
    relaunched with warnings."""
    end_processes([c for c in descendants() if not _is_resource_tracker(c)], timeout_s)


def _is_resource_tracker(process: psutil.Process) -> bool:
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:  # ended meanwhile
        return False


def _in_order(reports: dict[int, TaskReport], order: Sequence[int]) -> list[TaskReport]:
    """The reports there are, in the order the tasks were asked for."""
    return [reports[task_id] for task_id in order if task_id in reports]


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
