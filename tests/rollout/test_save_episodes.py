"""``rollout.save_episodes``: a rollout's episodes as labelled videos (node on hand-made batches),
and ``configs/record_libero.yaml`` end to end on LIBERO."""

from __future__ import annotations

import json
from collections import Counter

import h5py
import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.episode_videos import read_clip, scan_videos
from embodied_rl.data.layout import Layout
from embodied_rl.data.tasks import split_of
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.context import MetricSink, NodeContext
from rollout.save_episodes import SaveEpisodesConfig, save_episodes
from tests.simulators.libero_common import requires_libero


def rollout_batch(seed: int = 0) -> tuple:
    """3 episodes of up to 4 frames; FRAME_COUNT 4, 1, 2."""
    frames = torch.from_numpy(
        np.random.default_rng(seed).integers(0, 256, (3, 4, 5, 5, 3), dtype=np.uint8)
    )
    counts = [4, 1, 2]
    batch = make_batch(
        {
            K.FRAMES: frames,
            K.FRAME_COUNT: torch.tensor(counts),
            K.TASK_ID: torch.tensor([2, 0, 2]),
            K.INIT_STATE_ID: torch.tensor([7, 1, 8]),
            K.SUCCESS: torch.tensor([True, False, True]),
            K.PRIVILEGED_PROGRESS: torch.tensor([1.0, 0.5, float("nan")]),
            K.PROMPT_TEXT: ["put it", "open it", "put it"],
        }
    )
    return batch, frames.numpy(), counts


ONE_RANK = Layout((0,))


def run_node(tmp_path, batch, step=3, rank=0, layout=ONE_RANK, name="episodes"):
    ctx = NodeContext.single_process(
        "save",
        SaveEpisodesConfig(name=name, suite="libero_object"),
        run_dir=tmp_path,
        step=step,
        rank=rank,
        layout=layout,
        metrics=MetricSink(),
    )
    out = save_episodes(ctx, batch)
    return out, {k: v[0] for k, v in ctx.metrics.pop().items()}


def test_writes_the_episodes_cut_to_their_frames_and_labelled(tmp_path):
    batch, frames, counts = rollout_batch()
    keys_before = set(batch.keys())
    out, metrics = run_node(tmp_path, batch, name="rec")
    assert out is batch and set(out.keys()) == keys_before  # passes through, writes nothing
    path = tmp_path / "rec" / "step_000003" / "rank_0.hdf5"
    infos = scan_videos([path])
    assert [(i.length, i.task, i.init_state, i.success, i.instruction) for i in infos] == [
        (4, 2, 7, True, "put it"),
        (1, 0, 1, False, "open it"),
        (2, 2, 8, True, "put it"),
    ]
    assert {i.origin for i in infos} == {"rollout step 3 rank 0"}
    assert [i.progress for i in infos] == [1.0, 0.5, None]  # NaN: not recorded
    with h5py.File(path, "r") as f:
        assert f["episodes"].attrs["suite"] == "libero_object"
    for i, info in enumerate(infos):
        np.testing.assert_array_equal(read_clip(info), frames[i, : counts[i]])
    assert metrics == {"rec/episodes": 3.0, "rec/successes": 2.0}


def test_a_stale_file_of_the_step_is_replaced_and_empty_or_tp_peer_ranks_write_none(tmp_path):
    first, _, _ = rollout_batch(0)
    run_node(tmp_path, first, step=5)  # an interrupted run recorded step 5 ...
    second, frames, counts = rollout_batch(1)
    run_node(tmp_path, second, step=5)  # ... and its resumption records it again
    infos = scan_videos([tmp_path / "episodes"])
    assert len(infos) == 3  # the resumed run's episodes only
    np.testing.assert_array_equal(read_clip(infos[0]), frames[0, : counts[0]])

    _, metrics = run_node(tmp_path, make_batch({}, batch_size=0), step=6)
    assert not (tmp_path / "episodes" / "step_000006").exists()
    assert metrics == {"episodes/episodes": 0.0, "episodes/successes": 0.0}
    # Ranks 0 and 1 hold one shard (tp 2): rank 0 writes it, rank 1 neither writes nor counts.
    _, metrics = run_node(tmp_path, second, step=7, rank=1, layout=Layout((0, 1), tp_size=2))
    assert not (tmp_path / "episodes" / "step_000007").exists()
    assert metrics["episodes/episodes"] == 0.0


def test_the_folder_name_is_checked():
    with pytest.raises(ValueError, match="plain folder name"):
        SaveEpisodesConfig(name="a/b")


@pytest.mark.ray
@pytest.mark.libero
@requires_libero
def test_record_libero_writes_every_episode_of_a_step(tmp_path):
    from embodied_rl.launch.launcher import launch

    overrides = [
        "trainer.total_steps=1",
        "trainer.checkpoint_every=0",
        "trainer.log_to_console=false",
        "workers.num_workers=1",
        "data.batch_size=2",
        "rollout.group_size=2",
        "rollout.num_envs=2",
        "simulator.options.max_steps=16",  # 2 policy steps of 8 env actions
        f"run_dir={tmp_path}",
    ]
    result = launch(compose("record_libero", overrides), show_progress=False)
    (metrics,) = [
        json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    infos = scan_videos([result.run_dir / "episodes"])
    assert len(infos) == 2 * 2 == metrics["episodes/episodes"]
    assert {i.path.relative_to(result.run_dir).as_posix() for i in infos} == {
        "episodes/step_000000/rank_0.hdf5"
    }
    # One frame per policy step of each episode (FRAME_COUNT at frame_stride 1): their sum is
    # the rollout's valid steps.
    assert all(1 <= i.length <= 2 for i in infos)
    assert sum(i.length for i in infos) == pytest.approx(4 * metrics["rollout/episode_steps"])
    assert all(i.image_shape == (64, 64, 3) for i in infos)
    # Groups of 2 episodes per (task, init state) of the train split, labelled alike.
    pairs = Counter((i.task, i.init_state) for i in infos)
    assert set(pairs.values()) == {2}
    assert all(0 <= t < 10 and split_of(s, 5) == "train" for t, s in pairs)
    assert all(isinstance(i.success, bool) for i in infos)
    assert sum(i.success for i in infos) == metrics["episodes/successes"]
    # Each episode's privileged progress at its end: 1 exactly for the successes.
    assert all((i.progress == 1.0) == i.success and 0.0 <= i.progress <= 1.0 for i in infos)
    by_task = {}
    for i in infos:
        assert by_task.setdefault(i.task, i.instruction) == i.instruction and i.instruction
    assert {i.origin for i in infos} == {"rollout step 0 rank 0"}
    with h5py.File(infos[0].path, "r") as f:
        assert f["episodes"].attrs["suite"] == "libero_object"
    assert all(read_clip(i).std() > 0 for i in infos)  # a rendered scene, not blank frames
