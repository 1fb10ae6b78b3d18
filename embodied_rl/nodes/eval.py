"""The ``eval.report`` node: per-task success table and an HTML/Markdown report with the videos.

Every worker of the node all-gathers the small per-episode metadata (task id, init state,
success, instruction, where the episode lives, whether it has a video) over its data-parallel
group, so the table is exact over all ranks; dp rank 0 writes the report. The videos are
written before, by ``rollout.videos`` (``rollout/videos.py``), which chooses them with
:func:`select_videos` and marks them in HAS_VIDEO. Outputs, under ``<run_dir>/<name>/``::

    step_000010/task3_init0_success_r1.mp4   videos (rollout.videos, by the rank that holds them)
    step_000010/report.html                  title, overall success, table, videos inline
    step_000010/report.md                    the table in Markdown, links to the videos
    step_000010/success_by_task.png          bar chart of per-task success
    results.jsonl                            one line per (step, task)

Videos of other ranks are written to their own ``run_dir``: the report's relative links work
where the run directory is shared (one machine, or a shared file system).
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.eval_episodes import (
    CHART_FILE,
    REPORT_HTML,
    REPORT_MD,
    RESULTS_FILE,
    Episode,
    check_folder_name,
    gather_episodes,
    local_episodes,
    padded_rows,
    step_folder,
    written_videos,
)
from embodied_rl.metrics import read_metrics
from embodied_rl.runtime.context import NodeContext


@dataclass
class EvalReportConfig:
    """Options of ``eval.report``.

    Attributes:
        suite_name: shown in the report title (e.g. ``libero_spatial``).
        name: metric prefix (``<name>/success_rate``) and output folder under the run dir
            (the one ``rollout.videos`` writes to).
        write_html: also write ``report.html`` (the Markdown, JSONL and chart always are).
    """

    suite_name: str = ""
    name: str = "eval"
    write_html: bool = True

    def __post_init__(self) -> None:
        check_folder_name(self.name)


@dataclass
class TaskRow:
    """One row of the per-task table (over all ranks)."""

    task: int
    instructions: list[str] = field(default_factory=list)
    episodes: int = 0
    successes: int = 0
    init_states: set[int] = field(default_factory=set)
    failed_inits: set[int] = field(default_factory=set)
    progress: list[float] = field(default_factory=list)  # privileged, of measured episodes

    @property
    def instruction(self) -> str:
        return " | ".join(self.instructions)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def mean_progress(self) -> float | None:
        """Mean privileged progress of the task's episodes; None where none was measured."""
        return sum(self.progress) / len(self.progress) if self.progress else None


def task_table(episodes: Sequence[Episode]) -> list[TaskRow]:
    """Per-task counts over ``episodes``, sorted by task id."""
    rows: dict[int, TaskRow] = {}
    for e in episodes:
        row = rows.setdefault(e.task, TaskRow(e.task))
        if e.instruction not in row.instructions:
            row.instructions.append(e.instruction)
        row.episodes += 1
        row.successes += int(e.success)
        row.init_states.add(e.init_state)
        if not math.isnan(e.progress):
            row.progress.append(e.progress)
        if not e.success:
            row.failed_inits.add(e.init_state)
    return [rows[task] for task in sorted(rows)]


def _log_metrics(ctx: NodeContext, batch: TensorDict, name: str) -> None:
    """``<name>/success_rate`` and ``<name>/success/task_<k>``, weighted by episodes (rows
    marked PADDED are not episodes)."""
    kept = ~padded_rows(batch)
    n = int(kept.sum())
    if n == 0:
        return
    success = batch[K.SUCCESS][kept].float()
    tasks = batch[K.TASK_ID][kept]
    ctx.metrics.log(f"{name}/success_rate", success.mean().item(), weight=n)
    for task in sorted(set(tasks.tolist())):
        picked = success[tasks == task]
        ctx.metrics.log(
            f"{name}/success/task_{task}", picked.mean().item(), weight=float(len(picked))
        )


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` via a temporary file and a rename (readers never see half a file)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _format_inits(inits: set[int], limit: int = 12) -> str:
    values = sorted(inits)
    text = ", ".join(str(v) for v in values[:limit])
    return text + (f", ... (+{len(values) - limit})" if len(values) > limit else "")


def _overall(rows: Sequence[TaskRow]) -> tuple[int, int]:
    return sum(r.successes for r in rows), sum(r.episodes for r in rows)


def _percent(successes: int, episodes: int) -> str:
    return f"{100.0 * successes / episodes:.1f}%" if episodes else "n/a"


def _video_label(e: Episode) -> str:
    return f"task {e.task}, init {e.init_state}: {e.outcome.upper()}"


def render_markdown(title: str, rows: Sequence[TaskRow], videos: Sequence[Episode] = ()) -> str:
    """The report as Markdown: title, overall success, the per-task table, video links."""
    successes, episodes = _overall(rows)
    lines = [
        f"# {title}",
        "",
        f"Overall success: **{successes}/{episodes} ({_percent(successes, episodes)})**",
        "",
        "| task | instruction | episodes | successes | success rate | failed init states |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        instruction = r.instruction.replace("|", "\\|")
        lines.append(
            f"| {r.task} | {instruction} | {r.episodes} | {r.successes} "
            f"| {_percent(r.successes, r.episodes)} | {_format_inits(r.failed_inits)} |"
        )
    if videos:
        lines += ["", "## Videos", ""]
        lines += [f"- [{_video_label(e)}]({e.video_name}) (rank {e.writer})" for e in videos]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px}"
    "td.n{text-align:right}.videos{display:flex;flex-wrap:wrap;gap:16px}"
    "figure{margin:0;max-width:320px}figcaption{font-size:13px}"
    ".success{color:#080}.failure{color:#c00}"
)


def _html_table(rows: Sequence[TaskRow]) -> list[str]:
    out = [
        "<table>",
        "<tr><th>task</th><th>instruction</th><th>episodes</th><th>successes</th>"
        "<th>success rate</th><th>failed init states</th></tr>",
    ]
    for r in rows:
        out.append(
            f'<tr><td class="n">{r.task}</td><td>{html.escape(r.instruction)}</td>'
            f'<td class="n">{r.episodes}</td><td class="n">{r.successes}</td>'
            f'<td class="n">{_percent(r.successes, r.episodes)}</td>'
            f"<td>{_format_inits(r.failed_inits)}</td></tr>"
        )
    out.append("</table>")
    return out


def _html_videos(videos: Sequence[Episode]) -> list[str]:
    if not videos:
        return ["<p>No videos (eval.max_videos is 0, or the DAG has no rollout.videos node).</p>"]
    out = ['<div class="videos">']
    for e in videos:
        src = html.escape(e.video_name, quote=True)
        out.append(
            f'<figure><video controls muted preload="metadata" width="320" src="{src}"></video>'
            f"<figcaption>task {e.task} &middot; init {e.init_state} &middot; "
            f'<b class="{e.outcome}">{e.outcome.upper()}</b> &middot; rank {e.writer}<br>'
            f"{html.escape(e.instruction)}</figcaption></figure>"
        )
    out.append("</div>")
    return out


def render_html(
    title: str, rows: Sequence[TaskRow], videos: Sequence[Episode], chart: str | None
) -> str:
    """A self-contained page (inline CSS, no scripts); videos and chart by relative path."""
    successes, episodes = _overall(rows)
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Overall success: <b>{successes}/{episodes} ({_percent(successes, episodes)})</b>"
        f" over {len(rows)} task(s).</p>",
        *_html_table(rows),
    ]
    if chart is not None:
        body.append(f'<p><img src="{html.escape(chart, quote=True)}" alt="success by task"></p>')
    body += ["<h2>Episodes</h2>", *_html_videos(videos)]
    head = f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
    page = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">', head, "</head><body>"]
    return "\n".join(page + body + ["</body></html>"]) + "\n"


def plot_task_success(rows: Sequence[TaskRow], path: Path, title: str) -> Path | None:
    """Bar chart of per-task success rate (``successes/episodes`` above each bar)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not rows:
        return None
    fig = Figure(figsize=(min(20.0, 2.0 + 0.45 * len(rows)), 3.2))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    x = list(range(len(rows)))
    ax.bar(x, [r.success_rate for r in rows], color="#3a7")
    for i, r in enumerate(rows):
        ax.text(i, r.success_rate + 0.02, f"{r.successes}/{r.episodes}", ha="center", fontsize=7)
    ax.set_xticks(x, [str(r.task) for r in rows], fontsize=8)
    ax.set_xlabel("task")
    ax.set_ylabel("success rate")
    ax.set_ylim(0.0, 1.12)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    partial = path.with_name(f".{path.name}.partial")
    fig.savefig(partial, format="png", dpi=100)
    os.replace(partial, path)
    return path


def append_results(path: Path, step: int, rows: Sequence[TaskRow], suite: str) -> None:
    """Add one JSON line per task for ``step``; lines of steps >= ``step`` are dropped first.

    Those can only come from an interrupted run that went past its last checkpoint, so after
    a resume the file holds each (step, task) once, in step order.
    """
    kept = [r for r in read_metrics(path) if r["step"] < step]
    new = [
        {
            "step": int(step),
            "suite": suite,
            "task": r.task,
            "instruction": r.instruction,
            "episodes": r.episodes,
            "successes": r.successes,
            "success_rate": r.success_rate,
            "privileged_progress": r.mean_progress,
        }
        for r in rows
    ]
    _write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept + new))


def write_report(
    folder: Path, cfg: EvalReportConfig, step: int, rows: Sequence[TaskRow], videos: list[Episode]
) -> None:
    """Rank 0's outputs: report.md, success_by_task.png, report.html, results.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    title = f"{cfg.suite_name or cfg.name} evaluation, step {step}"
    _write_text(folder / REPORT_MD, render_markdown(title, rows, videos))
    chart = plot_task_success(rows, folder / CHART_FILE, title)
    if cfg.write_html:
        html_text = render_html(title, rows, videos, None if chart is None else chart.name)
        _write_text(folder / REPORT_HTML, html_text)
    append_results(folder.parent / RESULTS_FILE, step, rows, cfg.suite_name)


@register_node(
    "eval.report",
    reads=(K.SUCCESS, K.TASK_ID, K.INIT_STATE_ID, K.PROMPT_TEXT, K.FINISH_STEP),
    config=EvalReportConfig,
)
def eval_report_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Log success metrics and (dp rank 0) write the report; batch unchanged.

    Reads SUCCESS (B,) bool, TASK_ID (B,) int64, INIT_STATE_ID (B,) int64, PROMPT_TEXT (B
    strings), FINISH_STEP (B,) int64 and, when present, HAS_VIDEO (B,) bool.
    """
    cfg: EvalReportConfig = ctx.node_config
    episodes = gather_episodes(ctx, local_episodes(ctx, batch))
    _log_metrics(ctx, batch, cfg.name)
    if ctx.dp_rank == 0 and ctx.tp_rank == 0:
        folder = step_folder(ctx.run_dir, cfg.name, ctx.step)
        write_report(folder, cfg, ctx.step, task_table(episodes), written_videos(episodes))
    return batch
