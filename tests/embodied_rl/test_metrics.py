"""Tests of metric reduction, the run logger (JSONL, TensorBoard, plot) and the progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from embodied_rl.metrics import MetricsTail, ProgressBar, RunLogger, reduce_records
from embodied_rl.runtime.context import MetricSink

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_reduce_records_by_hand() -> None:
    rank0, rank1, rank2 = MetricSink(), MetricSink(), MetricSink()
    rank0.log("reward/mean", 1.0, weight=3)  # 3 samples with mean reward 1.0
    rank1.log("reward/mean", 0.0, weight=1)
    rank0.log("count", 2, reduce="sum")
    rank1.log("count", 5, reduce="sum")
    rank0.log("time/step", 0.5, reduce="max")
    rank1.log("time/step", 1.5, reduce="max")
    rank0.log("len/min", 4, reduce="min")
    rank1.log("len/min", 2, reduce="min")
    rank2.log("loss/critic", 0.25)  # only rank 2 runs the critic node
    rank2.log("loss/critic", 0.75, weight=3)  # the sink already averaged: 0.625 with weight 4
    reduced = reduce_records([rank0.pop(), rank1.pop(), rank2.pop()])
    assert reduced == {
        "count": 7.0,
        "len/min": 2.0,
        "loss/critic": 0.625,
        "reward/mean": 0.75,  # (1.0 * 3 + 0.0 * 1) / 4
        "time/step": 1.5,
    }
    assert list(reduced) == sorted(reduced)


def test_reduce_records_zero_weights_and_conflicts() -> None:
    records = [{"x": (2.0, 0.0, "mean")}, {"x": (4.0, 0.0, "mean")}, None]
    assert reduce_records(records) == {"x": 3.0}
    with pytest.raises(ValueError, match=r"'x'.*\['max', 'mean'\]"):
        reduce_records([{"x": (1.0, 1.0, "mean")}, {"x": (1.0, 1.0, "max")}])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_log_writes_sorted_jsonl_tensorboard_and_console(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with RunLogger(tmp_path, total_steps=3) as run_logger:
        run_logger.log(0, {"reward/mean": 0.5, "loss/actor": 1.25, "time/step": 0.1})
        # Flushed per line: readable before close.
        assert _lines(tmp_path / "metrics.jsonl")[0]["loss/actor"] == 1.25
        run_logger.log(1, {"reward/mean": 0.75, "loss/actor": 1.0, "time/step": 0.2})
        with pytest.raises(ValueError, match="reserved"):
            run_logger.log(2, {"step": 1.0})
    text = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert text[0] == '{"loss/actor": 1.25, "reward/mean": 0.5, "step": 0, "time/step": 0.1}'
    assert _lines(tmp_path / "metrics.jsonl")[1] == {
        "loss/actor": 1.0,
        "reward/mean": 0.75,
        "step": 1,
        "time/step": 0.2,
    }
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    out = capsys.readouterr().out
    assert "step 2/3" in out and "reward/mean 0.75" in out and "loss/actor 1" in out


def test_plot_writes_a_png_with_reward_and_loss_panels(tmp_path: Path) -> None:
    with RunLogger(tmp_path, total_steps=4, tensorboard=False, console=False) as run_logger:
        assert run_logger.plot() is None  # nothing logged yet
        for step in range(4):
            run_logger.log(step, {"reward/mean": step / 4, "loss/actor": 1 - step / 4, "lr": 1.0})
        png = run_logger.plot()
    assert png == tmp_path / "metrics.png"
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    # Two panels (reward/mean, loss/actor; "lr" is not plotted) make the image taller than one.
    height = int.from_bytes(data[20:24], "big")
    with RunLogger(tmp_path / "one", total_steps=1, tensorboard=False, console=False) as single:
        single.log(0, {"reward/mean": 1.0})
        one_panel = single.plot().read_bytes()
    assert height > int.from_bytes(one_panel[20:24], "big")


def test_resume_drops_steps_logged_after_the_checkpoint(tmp_path: Path) -> None:
    with RunLogger(tmp_path, total_steps=6, tensorboard=False, console=False) as first:
        for step in range(5):  # the checkpoint was at 3 completed steps; 3 and 4 are lost
            first.log(step, {"reward/mean": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "reward/me')  # torn last line of the crash
    with RunLogger(
        tmp_path, total_steps=6, start_step=3, tensorboard=False, console=False
    ) as resumed:
        for step in range(3, 6):
            resumed.log(step, {"reward/mean": 10.0 + step})
        assert resumed.plot() is not None
    records = _lines(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert [r["reward/mean"] for r in records] == [0.0, 1.0, 2.0, 13.0, 14.0, 15.0]


def test_progress_bar_shows_steps_and_headline_metrics() -> None:
    out = io.StringIO()
    bar = ProgressBar(total=10, start=2, file=out, disable=False)
    bar.update(3, {"reward/mean": 0.5, "loss/actor": 0.25, "time/step": 9.0})
    bar.update(5, {"reward/mean": 0.625})
    assert bar.n == 5
    bar.close()
    text = out.getvalue()
    assert "3/10" in text and "5/10" in text
    assert "reward/mean=0.5" in text and "loss/actor=0.25" in text and "time/step" not in text


def test_progress_bar_is_safe_when_output_is_not_a_terminal() -> None:
    out = io.StringIO()  # not a TTY: tqdm disables itself
    bar = ProgressBar(total=4, file=out)
    bar.update(1, {"reward/mean": 1.0})
    bar.update(4, {})
    bar.close()
    assert bar.n == 4 and out.getvalue() == ""


def test_metrics_tail_reads_each_complete_line_once(tmp_path: Path) -> None:
    """What the driver's tracker feed follows: a line still being written waits, whole."""
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # no file yet
    path.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a"')
    assert tail.read() == [{"step": 0, "a": 1.0}]
    with open(path, "a", encoding="utf-8") as f:
        f.write(': 2.5}\nnot json\n{"step": 2}\n')
    assert tail.read() == [{"step": 1, "a": 2.5}, {"step": 2}]
    assert tail.read() == []
