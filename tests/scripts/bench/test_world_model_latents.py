"""``scripts/bench/world_model_latents.py`` and its ``latent_metrics.py``: the metrics against
hand-computed numbers, and one tiny end-to-end run of its ``main()`` on constructed videos
(successes brighten, failures stay dark) with the cheap encoder and a tiny random V-JEPA 2."""

from __future__ import annotations

import importlib
import json
import math
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from embodied_rl.data.episode_videos import EpisodeVideo, write_episode_videos
from tests.policies.test_encoders import TINY_OPTIONS  # the tiny V-JEPA 2 (well under 1 s on CPU)

BENCH = Path(__file__).resolve().parents[3] / "scripts" / "bench"


def _import_bench(name: str):
    """A bench module; the scripts import their siblings (``common``) by name, as when run."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))


lm = _import_bench("latent_metrics")
wml = _import_bench("world_model_latents")


def test_auc_hand_computed_with_ties():
    # pairs (pos, neg): (.9,.8) (.9,.2) (.7,.8) (.7,.2) -> 1 + 1 + 0 + 1 = 3 of 4
    assert lm.mann_whitney_auc([0.9, 0.8, 0.7, 0.2], [1, 0, 1, 0]) == 0.75
    # pos {.5, .5}, neg {.5, .3}: two ties (1/2 each) + two wins = 3 of 4
    assert lm.mann_whitney_auc([0.5, 0.5, 0.3, 0.5], [1, 0, 0, 1]) == 0.75
    assert lm.mann_whitney_auc([1.0, 1.0, 1.0], [1, 0, 1]) == 0.5  # all tied
    assert lm.mann_whitney_auc([0.1, 0.9], [1, 0]) == 0.0
    assert math.isnan(lm.mann_whitney_auc([0.1, 0.9], [1, 1]))  # no negative


def test_spearman_with_ties_hand_computed():
    assert lm.average_ranks([3, 1, 1, 2]).tolist() == [4.0, 1.5, 1.5, 3.0]
    # ranks y = [1.5, 1.5, 3, 4]: centred products 4.5, sums of squares 5 and 4.5
    assert lm.spearman([1, 2, 3, 4], [1, 1, 2, 3]) == pytest.approx(math.sqrt(0.9))
    assert lm.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(lm.spearman([1, 2, 3], [5, 5, 5]))  # constant


def test_leave_one_out_centroids_and_scores():
    z = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [9.0, 9.0]])
    success = np.array([True, True, True, False])
    centroids = lm.loo_centroids(z, success)
    # each success: the mean of the two others; the failure: the mean of all three
    expected = [[1, 2], [0, 2], [1, 0], [2 / 3, 4 / 3]]
    assert centroids.flatten().tolist() == pytest.approx(np.ravel(expected).tolist())
    with pytest.raises(ValueError, match=">= 2 successes"):
        lm.loo_centroids(z, np.array([True, False, False, False]))

    # 1-d: mean 4, population std sqrt(14); z = [-4, -2, 0, 6] / sqrt(14);
    # distances to the other successes' centroids [3, 0, 3, 8] / sqrt(14)
    scores = lm.task_scores(np.array([[0.0], [2.0], [4.0], [10.0]]), success)
    assert scores.tolist() == pytest.approx((-np.array([3, 0, 3, 8]) / math.sqrt(14)).tolist())
    # a constant dimension is z-scored with the std floor and adds nothing
    padded = lm.task_scores(np.array([[0.0, 7], [2, 7], [4, 7], [10, 7]]), success)
    assert padded.tolist() == pytest.approx(scores.tolist())


def test_separation_skips_and_pools():
    tasks = {
        "a": (np.array([[0.0], [2.0], [4.0], [10.0]]), np.array([1, 1, 1, 0], bool)),
        "one success": (np.array([[0.0], [1.0]]), np.array([1, 0], bool)),
        "no failure": (np.array([[0.0], [1.0]]), np.array([1, 1], bool)),
    }
    out = lm.separation(tasks)
    assert out["tasks_scored"] == 1
    assert out["tasks_skipped"] == {"fewer than 2 successes": 1, "no failure": 1}
    assert (out["episodes"], out["successes"], out["failures"]) == (4, 3, 1)
    assert out["pooled_auc"] == out["mean_task_auc"] == 1.0
    assert out["per_task"]["no failure"]["skipped"] == "no failure"


def test_failure_ranking_hand_computed():
    """Task a ranks its failures as progress does (rho 1), task b in reverse (rho -1; its NaN
    progress is not recorded, so left out); pooled by hand from average ranks: rewards
    [.1 .3 .5 .5 .3 .1] -> ranks [1.5 3.5 5.5 5.5 3.5 1.5], progress [.2 .4 .9 .1 .2 .3] ->
    [2.5 5 6 1 2.5 4]; centred products sum to 1, squares to 16 and 17: 1 / sqrt(272)."""
    nan = float("nan")
    tasks = {
        "a": ([1.0, 0.1, 0.3, 0.5], [True, False, False, False], [1.0, 0.2, 0.4, 0.9]),
        "b": ([1.0, 0.5, 0.3, 0.1, 0.2], [True] + [False] * 4, [1.0, 0.1, 0.2, 0.3, nan]),
        "c": ([0.0, 0.0, 0.0], [False] * 3, [0.1, 0.2, 0.3]),  # no success: SRPO shapes none
        "d": ([1.0, 0.2, 0.4], [True, False, False], [1.0, 0.3, 0.5]),  # 2 failures only
    }
    out = lm.failure_ranking({k: tuple(map(np.array, v)) for k, v in tasks.items()}, 200)
    assert out["per_task"]["a"]["spearman"] == pytest.approx(1.0)
    assert out["per_task"]["a"]["interval"] == pytest.approx([1.0, 1.0])  # any resample: 1
    assert out["per_task"]["b"]["spearman"] == pytest.approx(-1.0)
    assert out["per_task"]["b"]["failures"] == 3
    assert out["per_task"]["c"]["skipped"] == "no success"
    assert out["per_task"]["d"]["skipped"] == "fewer than 3 failures with progress"
    assert (out["tasks_ranked"], out["failures_ranked"]) == (2, 6)
    assert out["pooled_spearman"] == pytest.approx(1 / math.sqrt(272))
    assert out["mean_task_spearman"] == pytest.approx(0.0)
    low, high = out["pooled_interval"]
    assert -1.0 <= low <= out["pooled_spearman"] <= high <= 1.0


def test_prefix_lengths_under_the_frame_cap():
    read = wml.read_indices(100, 10)  # floor(linspace(0, 99, 10)) = 0, 11, 22, ..., 99
    assert read.tolist() == [0, 11, 22, 33, 44, 55, 66, 77, 88, 99]
    assert wml.prefix_length(read, 100, 0.5) == 5  # the first 50 frames hold 0, 11, ..., 44
    assert wml.prefix_length(read, 100, 1.0) == 10
    assert wml.prefix_length(read, 100, 0.001) == 1  # never empty
    assert wml.read_indices(6, 10).tolist() == list(range(6))
    assert wml.prefix_length(np.arange(12), 12, 0.1) == 1  # round(1.2)


def test_bad_encoder_specs_name_the_fix():
    with pytest.raises(wml.EncoderSpecError, match="LABEL=REGISTRY_NAME"):
        wml.parse_encoder_spec("video_encoder.cheap")
    with pytest.raises(wml.EncoderSpecError, match="not valid JSON"):
        wml.parse_encoder_spec("x=video_encoder.cheap:{grid: 2}")
    with pytest.raises(wml.EncoderSpecError, match="JSON object"):
        wml.parse_encoder_spec("x=video_encoder.cheap:[1]")
    spec = wml.parse_encoder_spec('x=video_encoder.cheap:{"grid": 2}')
    assert (spec.label, spec.name, spec.options) == ("x", "video_encoder.cheap", {"grid": 2})
    with pytest.raises(wml.EncoderSpecError, match="video_encoder.cheap"):
        wml.build_encoder(wml.EncoderSpec("x", "video_encoder.chep"), "cpu")
    with pytest.raises(wml.EncoderSpecError, match="unknown option"):
        wml.build_encoder(wml.EncoderSpec("x", "video_encoder.cheap", {"gird": 2}), "cpu")
    with pytest.raises(wml.EncoderSpecError, match="does not exist"):
        wml.build_encoder(wml.EncoderSpec("x", "video_encoder.vjepa2", {"path": "/no/such"}), "cpu")


def _episode(channel: int, start: int, step: int, length: int, **kw) -> EpisodeVideo:
    """Uniform 16x16 frames whose ``channel`` goes ``start, start + step, ...``."""
    frames = np.zeros((length, 16, 16, 3), np.uint8)
    frames[..., channel] = np.clip(start + step * np.arange(length), 0, 255)[:, None, None]
    progress = 1.0 if kw["success"] else start / 100  # privileged progress, as recorded
    return EpisodeVideo(frames=frames, progress=progress, **kw)


def _videos() -> list[EpisodeVideo]:
    """Two tasks of validation episodes (even init states with heldout_every=1): 3 successes
    that brighten over 12 frames, one 6-frame success (too short for the progress metric)
    and 2 failures that stay dark; plus a dark 'success' of the test split and one without
    an init state, which the validation split must leave out."""
    videos = []
    for task, channel in ((0, 0), (1, 1)):
        kw = {"instruction": f"task {task}", "task": task}
        for j in range(3):
            videos.append(
                _episode(channel, 20 + 3 * j, 15, 12, success=True, init_state=2 * j, **kw)
            )
        videos.append(_episode(channel, 20, 33, 6, success=True, init_state=6, **kw))
        for j in range(2):
            videos.append(
                _episode(channel, 10 + 3 * j, 0, 12, success=False, init_state=8 + 2 * j, **kw)
            )
        videos.append(_episode(channel, 5, 0, 12, success=True, init_state=1, **kw))  # test split
        videos.append(_episode(channel, 5, 0, 12, success=True, **kw))  # no init state
    return videos


@pytest.mark.timeout(120)
def test_main_end_to_end(tmp_path):
    path = write_episode_videos(tmp_path / "episodes.hdf5", _videos())
    out = tmp_path / "report" / "latents.json"
    argv = [
        "--videos", str(path),
        "--encoder", "pooled=video_encoder.cheap",
        "--encoder", f"vjepa_random=video_encoder.vjepa2:{json.dumps(TINY_OPTIONS)}",
        "--split", "validation", "--heldout-every", "1",
        "--max-frames", "10", "--batch-size", "5", "--device", "cpu", "--out", str(out),
    ]  # fmt: skip
    assert wml.main(argv) == 0
    body = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert {"command", "args", "videos", "rows", "encoders", "machine"} <= set(body)
    assert shlex.split(body["command"]) == ["scripts/bench/world_model_latents.py", *argv]
    assert body["videos"] == {
        "scanned": 16, "selected": 12, "without_init_state": 2, "tasks": 2, "successes": 8,
    }  # fmt: skip
    pooled, vjepa = body["encoders"]
    assert [pooled["label"], vjepa["label"]] == ["pooled", "vjepa_random"]
    assert vjepa["embedding_dim"] == 32 and pooled["embedding_dim"] == 9 * 64 + 1
    for result in (pooled, vjepa):
        assert result["tasks_scored"] == 2
        assert (result["episodes"], result["successes"], result["failures"]) == (12, 8, 4)
        assert set(result["per_task"]) == {"task 0", "task 1"}
        assert all(0 <= r["auc"] <= 1 for r in result["per_task"].values())
        prog = result["progress"]
        assert prog["episodes"] == 6 and len(prog["spearman"]) == 6
        assert prog["skipped"] == {"shorter than 8 frames": 2, "no other success in the task": 0}
        assert len(prog["curve_mean"]) == 10 and max(prog["curve_mean"]) <= 1.0
    assert pooled["pooled_auc"] == 1.0 and pooled["mean_task_auc"] == 1.0
    # brightening successes come closer to the others as more of them is seen
    assert pooled["progress"]["spearman_mean"] > 0.8
    assert pooled["progress"]["curve_mean"][-1] < pooled["progress"]["curve_mean"][0]
    assert [row["encoder"] for row in body["rows"]] == ["pooled", "vjepa_random"]
    # Failure ranking: 2 failures a task are too few to rank (the hand-computed test ranks).
    ranking = pooled["failure_ranking"]["per_task"]["task 0"]
    assert ranking == {
        "successes": 4,
        "failures": 2,
        "skipped": "fewer than 3 failures with progress",
    }
    assert body["rows"][0]["failure_spearman"] == "-"


def test_main_refuses_an_empty_split_and_a_bad_spec(tmp_path, capsys):
    path = write_episode_videos(tmp_path / "episodes.hdf5", _videos()[:2])
    with pytest.raises(SystemExit, match="use --split all"):
        wml.main(["--videos", str(path), "--split", "test", "--heldout-every", "1",
                  "--out", str(tmp_path / "x.json")])  # fmt: skip
    with pytest.raises(SystemExit):
        wml.main(["--videos", str(path), "--encoder", "nolabel"])
    assert "LABEL=REGISTRY_NAME" in capsys.readouterr().err
