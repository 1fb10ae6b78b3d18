"""Labelled episode videos: our episode files and LIBERO demo files read alike; refusals."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_writer import DemoEpisode, write_demo_file
from embodied_rl.data.demos import scan_demo_file
from embodied_rl.data.episode_videos import (
    EpisodeVideo,
    EpisodeVideoError,
    read_clip,
    scan_videos,
    write_episode_videos,
)


def frames(length: int, seed: int, size: int = 6) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (length, size, size, 3), dtype=np.uint8)


def test_round_trip_keeps_frames_labels_and_order(tmp_path):
    videos = [
        EpisodeVideo(
            frames(5, 0), "pick up the milk", True, task=3, init_state=7, origin="o1", progress=1.0
        ),
        EpisodeVideo(
            frames(1, 1), "open the drawer", False, task=0, init_state=0, origin="o2", progress=0.25
        ),
        EpisodeVideo(frames(3, 2), "no ids", False),  # task/init state/progress unknown
    ]
    path = write_episode_videos(tmp_path / "step_000003" / "rank_0.hdf5", videos, "libero_x")
    with h5py.File(path, "r") as f:
        assert f["episodes"].attrs["suite"] == "libero_x"
    infos = scan_videos([tmp_path])  # folders are searched with their subfolders
    assert [
        (i.length, i.instruction, i.success, i.task, i.init_state, i.origin, i.progress)
        for i in infos
    ] == [
        (5, "pick up the milk", True, 3, 7, "o1", 1.0),
        (1, "open the drawer", False, 0, 0, "o2", 0.25),
        (3, "no ids", False, None, None, "rollout", None),
    ]
    assert all(i.image_shape == (6, 6, 3) and i.convention == "observation" for i in infos)
    np.testing.assert_array_equal(read_clip(infos[0]), videos[0].frames)
    clip = read_clip(infos[0], [4, 0, 4, 2])  # unordered, repeated
    np.testing.assert_array_equal(clip, videos[0].frames[[4, 0, 4, 2]])
    assert clip.dtype == np.uint8 and clip.flags.c_contiguous
    np.testing.assert_array_equal(read_clip(infos[2], np.array([2, 2])), videos[2].frames[[2, 2]])
    with pytest.raises(IndexError, match=r"in \[0, 1\)"):
        read_clip(infos[1], [1])


def test_a_demo_file_reads_as_successes_in_observation_convention(tmp_path):
    rng = np.random.default_rng(5)
    episodes = [
        DemoEpisode(
            actions=rng.uniform(-1, 1, (length, 7)),
            agentview_rgb=frames(length, 10 + length),  # not symmetric: orientation shows
            eye_in_hand_rgb=frames(length, 20 + length),
            ee_states=rng.normal(size=(length, 6)),
            gripper_states=rng.normal(size=(length, 2)),
            joint_states=rng.normal(size=(length, 7)),
            attrs={"embodied_rl_init_state_id": init},
        )
        for length, init in ((4, 2), (3, 6))
    ]
    path = write_demo_file(
        tmp_path / "task_demo.hdf5",
        episodes,
        problem_info={"problem_name": "p", "domain_name": "d", "language_instruction": "do it"},
        bddl_file_name="task.bddl",
        bddl_file_content="(define)",
        env_name="Libero_Tabletop_Manipulation",
        env_args={"type": 1},
        attrs={"embodied_rl_task_id": 4},
    )
    infos = scan_videos([path])
    assert [(i.length, i.success, i.task, i.init_state, i.origin) for i in infos] == [
        (4, True, 4, 2, "demo"),
        (3, True, 4, 6, "demo"),
    ]
    assert infos[0].instruction == "do it" and infos[0].convention == "opengl"
    for info, demo_info, episode in zip(infos, scan_demo_file(path), episodes):
        expected = load_demo(demo_info).images["agentview"]
        np.testing.assert_array_equal(read_clip(info), expected)
        np.testing.assert_array_equal(read_clip(info), episode.agentview_rgb)  # as given
        np.testing.assert_array_equal(read_clip(info, [2, 0, 2]), expected[[2, 0, 2]])


def test_refusals(tmp_path):
    path = write_episode_videos(tmp_path / "a.hdf5", [EpisodeVideo(frames(2, 0), "x", True)])
    with pytest.raises(FileExistsError, match="a.hdf5 exists"):
        write_episode_videos(path, [EpisodeVideo(frames(2, 1), "y", False)])
    assert read_clip(scan_videos([path])[0]).tobytes() == frames(2, 0).tobytes()  # untouched

    text = tmp_path / "b.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(EpisodeVideoError, match="cannot be read as HDF5"):
        scan_videos([text])
    empty = tmp_path / "c.hdf5"
    with h5py.File(empty, "w") as f:
        f.create_group("other")
    with pytest.raises(EpisodeVideoError, match="neither an 'episodes' group"):
        scan_videos([empty])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_videos([tmp_path / "missing"])
    (tmp_path / "empty_folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*.hdf5 video files"):
        scan_videos([tmp_path / "empty_folder"])


@pytest.mark.parametrize(
    "bad",
    [
        frames(2, 0).astype(np.float32),  # dtype
        np.zeros((0, 6, 6, 3), np.uint8),  # no frame
        np.zeros((2, 6, 6), np.uint8),  # no channel axis
    ],
)
def test_a_failed_write_leaves_no_file(tmp_path, bad):
    good = EpisodeVideo(frames(2, 0), "ok", True)
    target = tmp_path / "rec" / "rank_0.hdf5"
    with pytest.raises(ValueError, match="frames must be"):
        write_episode_videos(target, [good, EpisodeVideo(bad, "bad", False)])
    assert not target.exists()
    assert not list(tmp_path.rglob("*partial*"))
