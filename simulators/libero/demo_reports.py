"""The planner's records of ``embodied-rl demos``: per task, the successes over the init states
it ran on (``report.json`` / ``.md`` of ``--report``; ``demos.json`` / ``.md`` of the recorded
demos, with each task's file and content digest), and what ``--resume`` keeps of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from embodied_rl.data.demos import content_digest
from embodied_rl.runtime.config import ConfigError
from simulators.libero.demos import EpisodeResult, TaskInfo

REPORT, DEMOS = "report", "demos"  # the stems of --report's summary and of the demos record


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
    init_states: list[int] = field(default_factory=list)  # the init states it ran on
    demo_file: str | None = None  # demos.json: the file written (name in --out), if any
    digest: str | None = None  # demos.json: content_digest of that file

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


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
        init_states=[r.init_state_id for r in results],
    )


def report_markdown(suite: str, reports: Sequence[TaskReport], stem: str = REPORT) -> str:
    """A Markdown table: task, instruction, successes/episodes, rate, mean steps, failures."""
    what = "" if stem == REPORT else ", the recorded demo episodes"
    lines = [
        f"# Scripted planner on {suite}{what}",
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


def write_report(
    out: Path, suite: str, reports: Sequence[TaskReport], stem: str = REPORT
) -> tuple[Path, Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` into ``out`` (``report``: the ``--report``
    summary; ``demos``: the record of the demo episodes)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": suite,
        "tasks": [{**asdict(r), "rate": r.rate} for r in reports],
    }
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(report_markdown(suite, reports, stem), encoding="utf-8")
    return json_path, md_path


def read_reports(out: Path, suite: str, stem: str = REPORT) -> list[TaskReport]:
    """The task entries of ``out/<stem>.json`` (none if it is missing); a file of another
    suite is refused rather than mixed in."""
    path = out / f"{stem}.json"
    if not path.exists():
        return []
    payload = json.loads(path.read_text(encoding="utf-8"))
    if payload.get("suite") != suite:
        raise ConfigError(
            f"--resume: {path} is a report of {payload.get('suite')!r}, not {suite!r}",
            "give the --out folder of the same suite's report, or drop --resume",
        )
    fields = set(TaskReport.__dataclass_fields__)
    reports = []
    for entry in payload["tasks"]:
        report = TaskReport(**{k: v for k, v in entry.items() if k in fields})
        report.failures = {int(k): v for k, v in report.failures.items()}
        reports.append(report)
    return reports


def finished_reports(out: Path, suite: str, infos: Sequence[TaskInfo]) -> dict[int, TaskReport]:
    """The task reports a stopped ``--report`` run left in ``out/report.json`` (``--resume``).

    Only tasks that ran on every official init state are kept.
    """
    return {
        r.task_id: r
        for r in read_reports(out, suite)
        if r.unsupported is None and r.episodes == infos[r.task_id].num_init_states
    }


def finished_demos(out: Path, suite: str, demo_ids: dict[int, list[int]]) -> dict[int, TaskReport]:
    """The tasks whose demos a stopped run recorded in ``out/demos.json`` (``--resume``).

    Kept: tasks asked the same init states (``demo_ids``: task id -> init state ids) whose
    demo file, if they had a success, is still there with the digest recorded.
    """
    kept = {}
    for report in read_reports(out, suite, DEMOS):
        if report.init_states != demo_ids.get(report.task_id):
            continue
        if report.demo_file is not None:
            path = out / report.demo_file
            if not path.exists() or content_digest(path) != report.digest:
                continue
        kept[report.task_id] = report
    return kept
