"""``eval.report``: per-task table, metrics, the videos in the HTML/Markdown report, results.jsonl.

The single-process tests run the node on a hand-built batch (HAS_VIDEO marks the episodes
``rollout.videos`` wrote, ``tests/rollout/test_eval_videos.py``); the last test runs it on two
gloo ranks (``torch.multiprocessing`` spawn) and checks that rank 0's report covers both.
"""

from __future__ import annotations

import json
import re
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.layout import Layout
from embodied_rl.eval_episodes import Episode, select_videos, written_videos
from embodied_rl.metrics import reduce_records
from embodied_rl.nodes.eval import EvalReportConfig, eval_report_node
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.context import MetricSink, NodeContext

BOWL, DRAWER, CUPS = "put the bowl on the plate", "open the drawer", "stack <the> cups | now"
# (task, init state, success, finish step, instruction, has a video) per episode: the videos
# select_videos would choose with max_videos=4 (round 0 one per task, round 1 task 3's failure)
EPISODES = [
    (3, 0, True, 2, BOWL, True),
    (3, 0, False, 4, BOWL, True),
    (3, 1, True, 3, BOWL, False),
    (3, 0, True, 1, BOWL, False),
    (5, 2, False, 4, DRAWER, True),
    (5, 3, False, 4, DRAWER, False),
    (7, 0, True, 0, CUPS, True),
]


def _batch(rows=EPISODES, videos: bool = True):
    """Batch of ``rows`` (HAS_VIDEO from their last field unless ``videos`` is False)."""
    fields = {
        K.TASK_ID: torch.tensor([r[0] for r in rows]),
        K.INIT_STATE_ID: torch.tensor([r[1] for r in rows]),
        K.SUCCESS: torch.tensor([r[2] for r in rows]),
        K.FINISH_STEP: torch.tensor([r[3] for r in rows]),
        K.PROMPT_TEXT: [r[4] for r in rows],
    }
    if videos:
        fields[K.HAS_VIDEO] = torch.tensor([r[5] for r in rows])
    return make_batch(fields)


def _ctx(run_dir, cfg: EvalReportConfig, step: int = 0, rank: int = 0, world: int = 1, group=None):
    return NodeContext(
        cfg=None,
        node_id="eval",
        node_config=cfg,
        rank=rank,
        world_size=world,
        layout=Layout(tuple(range(world))),
        dp_group=group,
        models={},
        state={},
        step=step,
        metrics=MetricSink(),
        device=torch.device("cpu"),
        run_dir=Path(run_dir),
    )


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One node call at step 4: (ctx, output batch, step folder)."""
    run_dir = tmp_path_factory.mktemp("eval_run")
    ctx = _ctx(run_dir, EvalReportConfig(suite_name="libero_goal"), step=4)
    batch = _batch()
    out = eval_report_node(ctx, batch)
    return ctx, batch, out, run_dir / "eval" / "step_000004"


def test_registered_with_its_reads_and_no_writes():
    node = NODE_TYPES.get("eval.report")
    assert node.fn is eval_report_node
    cfg = node.build_config({"name": "heldout"})
    assert (cfg.name, cfg.write_html) == ("heldout", True)
    assert set(node.read_keys(cfg)) == {
        K.SUCCESS, K.TASK_ID, K.INIT_STATE_ID, K.PROMPT_TEXT, K.FINISH_STEP,
    }  # fmt: skip
    assert node.write_keys(cfg) == ()
    with pytest.raises(Exception, match="max_videos"):  # rollout.videos chooses them now
        node.build_config({"max_videos": 2})
    with pytest.raises(ValueError, match="folder name"):
        EvalReportConfig(name="a/b")


def test_batch_is_returned_unchanged(report):
    _, batch, out, _ = report
    assert out is batch
    assert set(out.keys()) == {
        K.TASK_ID, K.INIT_STATE_ID, K.SUCCESS, K.FINISH_STEP, K.PROMPT_TEXT, K.HAS_VIDEO,
    }  # fmt: skip


def test_metrics_by_hand(report):
    records = report[0].metrics.pop()
    assert records["eval/success_rate"] == pytest.approx((4 / 7, 7.0, "mean"))
    assert records["eval/success/task_3"] == pytest.approx((0.75, 4.0, "mean"))
    assert records["eval/success/task_5"] == pytest.approx((0.0, 2.0, "mean"))
    assert records["eval/success/task_7"] == pytest.approx((1.0, 1.0, "mean"))


def test_markdown_table_by_hand(report):
    text = (report[3] / "report.md").read_text()
    assert text.startswith("# libero_goal evaluation, step 4\n")
    assert "Overall success: **4/7 (57.1%)**" in text
    assert "| 3 | put the bowl on the plate | 4 | 3 | 75.0% | 0 |" in text
    assert "| 5 | open the drawer | 2 | 0 | 0.0% | 2, 3 |" in text
    assert "| 7 | stack <the> cups \\| now | 1 | 1 | 100.0% |  |" in text


# The flagged videos in the order rollout.videos chose them: round 0 one per task, round 1
# task 3's failure.
VIDEOS = [
    "task3_init0_success_r0.mp4",
    "task5_init2_failure_r0.mp4",
    "task7_init0_success_r0.mp4",
    "task3_init0_failure_r0.mp4",
]


def test_flagged_videos_in_choice_order_linked_not_written(report):
    folder = report[3]
    assert not list(folder.glob("*.mp4"))  # rollout.videos writes them, not the report
    markdown = (folder / "report.md").read_text()
    assert re.findall(r"\]\(([^)]+)\) \(rank 0\)", markdown) == VIDEOS
    assert "- [task 5, init 2: FAILURE](task5_init2_failure_r0.mp4) (rank 0)" in markdown


def test_html_has_table_rows_and_the_videos_inline(report):
    folder = report[3]
    page = (folder / "report.html").read_text()
    assert "<title>libero_goal evaluation, step 4</title>" in page
    assert "4/7 (57.1%)" in page
    row = re.search(r"<tr><td class=\"n\">3</td>(.*?)</tr>", page).group(1)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row) == [
        "put the bowl on the plate", "4", "3", "75.0%", "0",
    ]  # fmt: skip
    assert "stack &lt;the&gt; cups | now" in page and "<the>" not in page
    assert re.findall(r'<video controls[^>]* src="([^"]+)"', page) == VIDEOS
    assert page.count("<figcaption>") == 4 and ">FAILURE</b>" in page
    assert '<img src="success_by_task.png"' in page


def test_chart_and_results_jsonl(report):
    folder = report[3]
    with Image.open(folder / "success_by_task.png") as chart:
        assert chart.format == "PNG" and chart.size[0] > 100
    lines = _jsonl(folder.parent / "results.jsonl")
    assert [(r["step"], r["task"], r["episodes"], r["successes"]) for r in lines] == [
        (4, 3, 4, 3),
        (4, 5, 2, 0),
        (4, 7, 1, 1),
    ]
    assert lines[2]["instruction"] == CUPS and lines[0]["suite"] == "libero_goal"
    assert lines[0]["success_rate"] == 0.75


def test_results_jsonl_appends_steps_and_drops_stale_lines_on_rerun(tmp_path):
    cfg = EvalReportConfig(write_html=False, name="heldout")
    rows = EPISODES[:2]
    for step in (0, 1, 2, 1):  # the last call re-runs step 1 (a resume): step 1, 2 dropped
        eval_report_node(_ctx(tmp_path, cfg, step=step), _batch(rows))
    lines = _jsonl(tmp_path / "heldout" / "results.jsonl")
    assert [(r["step"], r["task"], r["episodes"], r["successes"]) for r in lines] == [
        (0, 3, 2, 1),
        (1, 3, 2, 1),
    ]
    step_dir = tmp_path / "heldout" / "step_000001"
    assert not (step_dir / "report.html").exists()  # write_html: false
    assert (step_dir / "report.md").is_file()


def test_without_videos_the_full_table(tmp_path):
    ctx = _ctx(tmp_path, EvalReportConfig())
    eval_report_node(ctx, _batch(videos=False))
    folder = tmp_path / "eval" / "step_000000"
    page = (folder / "report.html").read_text()
    assert "<video" not in page and "No videos" in page
    markdown = (folder / "report.md").read_text()
    assert "| 3 | put the bowl on the plate | 4 | 3 | 75.0% | 0 |" in markdown
    assert ".mp4" not in markdown


def test_select_videos_order_dedup_and_limits():
    def ep(task, init, success, index, video=False):
        return Episode(task, init, success, "x", 0, index, 0, video)

    episodes = [
        ep(1, 0, False, 0, video=True),
        ep(1, 1, False, 1),
        ep(1, 0, False, 2),  # duplicate key of index 0
        ep(1, 2, True, 3, video=True),
        ep(0, 0, True, 4),
        ep(0, 1, True, 5, video=True),
    ]
    chosen = select_videos(episodes, 8)
    # task 0 first (task order); task 1 alternates success, failure, then the rest.
    assert [e.index for e in chosen] == [4, 3, 5, 0, 1]
    assert [e.index for e in select_videos(episodes, 3)] == [4, 3, 5]
    assert select_videos(episodes, 0) == []
    assert [e.index for e in written_videos(episodes)] == [5, 3, 0]  # flagged, in that order


def test_select_videos_spreads_the_replays_over_the_writers():
    """The main job's start: 10 held-out states of one task over 2 ranks, successes 14 (rank
    0) and 29 (rank 1). The failure comes from the rank without a video yet, not the first
    gathered (rank 0's init 4), so each rank replays one video instead of rank 0 both."""

    def ep(init, success, index, writer):
        return Episode(0, init, success, "x", writer, index, writer, False)

    episodes = [ep(4, False, 0, 0), ep(14, True, 1, 0), ep(9, False, 2, 0)]
    episodes += [ep(29, True, 3, 1), ep(34, False, 4, 1)]
    assert [e.index for e in select_videos(episodes, 2)] == [1, 4]
    assert [e.index for e in select_videos(episodes, 4)] == [1, 4, 3, 0]
    one_rank = [e for e in episodes if e.writer == 0]
    assert [e.index for e in select_videos(one_rank, 2)] == [1, 0]  # gathered order


# --- two gloo ranks -----------------------------------------------------------------------
WORLD = 2
SHARDS = {
    0: [
        (3, 0, False, 2, BOWL, False),
        (3, 1, False, 3, BOWL, False),
        (5, 0, True, 1, DRAWER, True),
    ],
    1: [(3, 2, True, 4, BOWL, True), (9, 0, False, 2, CUPS, False), (9, 1, True, 0, CUPS, True)],
}


def _run_rank(rank: int, port: int, run_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        ctx = _ctx(
            run_dir, EvalReportConfig(), step=2, rank=rank, world=WORLD, group=dist.group.WORLD
        )
        eval_report_node(ctx, _batch(SHARDS[rank]))
        torch.save(ctx.metrics.pop(), Path(run_dir) / f"metrics{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_table_and_videos_cover_both(tmp_path):
    mp.spawn(_run_rank, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    folder = tmp_path / "eval" / "step_000002"
    md = (folder / "report.md").read_text()
    assert "Overall success: **3/6 (50.0%)**" in md
    assert "| 3 | put the bowl on the plate | 3 | 1 | 33.3% | 0, 1 |" in md  # both ranks
    assert "| 5 | open the drawer | 1 | 1 | 100.0% |  |" in md  # rank 0 only
    assert "| 9 | stack <the> cups \\| now | 2 | 1 | 50.0% | 0 |" in md  # rank 1 only
    # The flagged videos of both ranks, in task order: named by the rank that wrote them.
    names = [
        "task3_init2_success_r1.mp4",
        "task5_init0_success_r0.mp4",
        "task9_init1_success_r1.mp4",
    ]
    page = (folder / "report.html").read_text()
    assert re.findall(r'<video controls[^>]* src="([^"]+)"', page) == names
    assert re.findall(r"\]\(([^)]+)\)", md) == names
    lines = _jsonl(tmp_path / "eval" / "results.jsonl")
    assert [(r["task"], r["episodes"], r["successes"]) for r in lines] == [
        (3, 3, 1),
        (5, 1, 1),
        (9, 2, 1),
    ]
    per_rank = [torch.load(tmp_path / f"metrics{r}.pt") for r in range(WORLD)]
    reduced = reduce_records(per_rank)
    assert reduced["eval/success_rate"] == pytest.approx(0.5)
    assert reduced["eval/success/task_3"] == pytest.approx(1 / 3)
    assert per_rank[0]["eval/success/task_3"] == pytest.approx((0.0, 2.0, "mean"))
