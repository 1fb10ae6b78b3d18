"""LeRobot datasets (v2.1 and v3.0 layouts) read as demonstrations.

The datasets come from ``lerobot_writer`` (the format's specification; LeRobot's own writer
needs an older torch). Frames go through real H.264 encoding and decoding, so pixel checks
allow the codec's small error; every frame is a distinct grey, so an off-by-one frame or an
episode read from the wrong offset is a difference of 20 grey levels, not 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_loader import DemoLoader, select_demos
from embodied_rl.data.demos import DemoFormatError
from embodied_rl.data.lerobot import LeRobotFeatures, scan_lerobot_dataset
from embodied_rl.nodes.data import DemoDataConfig
from tests.embodied_rl.data.lerobot_writer import (
    IMAGE,
    SIZE,
    WRIST,
    Episode,
    make_episode,
    write_mp4,
    write_v21,
    write_v30,
)
from tests.simulators.libero_common import requires_libero

TASK_A = "put the bowl on the plate"
TASK_B = "open the drawer"


def _episodes():
    return [make_episode(5, 0, TASK_A), make_episode(7, 1, TASK_B), make_episode(6, 2, TASK_A)]


def _close(decoded: np.ndarray, original: np.ndarray) -> None:
    assert decoded.shape == original.shape
    error = np.abs(decoded.astype(int) - original.astype(int))
    assert error.mean() < 2.0 and error.max() <= 12, (error.mean(), error.max())


@pytest.mark.parametrize("layout", ["v2.1", "v3.0"])
def test_episodes_read_back_in_the_simulator_conventions(tmp_path, layout):
    episodes = _episodes()
    root = (write_v21 if layout == "v2.1" else write_v30)(tmp_path / "ds", episodes)
    infos = scan_lerobot_dataset(root, LeRobotFeatures())
    assert [i.name for i in infos] == ["episode_000000", "episode_000001", "episode_000002"]
    assert [i.length for i in infos] == [5, 7, 6]
    assert [i.instruction for i in infos] == [TASK_A, TASK_B, TASK_A]
    assert all(i.image_shape == (SIZE, SIZE, 3) and i.init_state_id is None for i in infos)
    for info, episode in zip(infos, episodes):
        demo = load_demo(info, cameras=("agentview", "wrist"))
        np.testing.assert_array_equal(demo.actions, episode.actions)
        np.testing.assert_array_equal(demo.proprio, episode.state)
        # "rotated" (the default): stored as the simulator observes, so unchanged.
        _close(demo.images["agentview"], episode.frames[IMAGE])
        _close(demo.images["wrist"], episode.frames[WRIST])


def test_image_features_stored_in_parquet_read_exactly(tmp_path):
    episodes = _episodes()[:2]
    root = write_v21(tmp_path / "ds", episodes, image_dtype="image")
    infos = scan_lerobot_dataset(root, LeRobotFeatures())
    for info, episode in zip(infos, episodes):
        demo = load_demo(info, cameras=("agentview",))
        np.testing.assert_array_equal(demo.images["agentview"], episode.frames[IMAGE])


def test_opengl_frames_are_rotated_and_openvla_gripper_becomes_env_actions(tmp_path):
    episode = make_episode(4, 0, TASK_A)
    unit = episode.actions.copy()
    unit[:, -1] = [0.9, 0.1, 1.0, 0.0]  # OpenVLA: 1 = open
    episode.actions = unit
    root = write_v21(tmp_path / "ds", [episode], image_dtype="image")
    features = LeRobotFeatures(image_convention="opengl", gripper="openvla")
    (info,) = scan_lerobot_dataset(root, features)
    demo = load_demo(info, cameras=("agentview",))
    assert demo.actions[:, -1].tolist() == [-1.0, 1.0, -1.0, 1.0]  # env: -1 open, +1 close
    np.testing.assert_array_equal(demo.actions[:, :-1], unit[:, :-1])
    # The bright quadrant was top-left as stored; rotated by 180 degrees it is bottom-right.
    np.testing.assert_array_equal(demo.images["agentview"], episode.frames[IMAGE][:, ::-1, ::-1])
    assert (demo.images["agentview"][:, SIZE // 2 :, SIZE // 2 :] == 250).all()


def test_select_demos_and_the_loader_take_lerobot_episodes_like_hdf5_demos(tmp_path):
    episodes = _episodes()
    root = write_v30(tmp_path / "ds", episodes)
    infos = select_demos([str(root)], max_demos_per_task=1, heldout_every=5)
    assert [i.name for i in infos] == ["episode_000000", "episode_000001"]  # first per task
    loader = DemoLoader(
        infos, chunk=2, cameras=["agentview"], image_size=16, global_batch_size=12,
        dp_rank=0, dp_size=1, seed=0, shuffle=False,
    )  # fmt: skip
    batch = loader.next_batch()  # rows in order: episode 0's 5 steps, then episode 1's 7
    torch.testing.assert_close(batch[K.OBS_STATE][:5, 0], torch.from_numpy(episodes[0].state))
    torch.testing.assert_close(batch[K.ACTIONS][5], torch.from_numpy(episodes[1].actions[:2]))
    assert batch[K.OBS_IMAGE].shape == (12, 1, 16, 16, 3)
    assert batch[K.PROMPT_TEXT][:6] == [TASK_A] * 5 + [TASK_B]
    assert batch[K.INIT_STATE_ID].tolist() == [-1] * 12
    actions = np.concatenate([episodes[0].actions, episodes[1].actions])
    assert loader.statistics["num_transitions"] == 12
    np.testing.assert_allclose(loader.statistics["action"]["mean"], actions.mean(0), rtol=1e-5)


def test_demo_node_config_reads_the_mapping_and_refuses_unknown_keys(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    config = DemoDataConfig(paths=[str(root)], lerobot={"wrist_image": None}, heldout_every=5)
    config.check_inputs()
    assert config.lerobot_features.wrist_image is None
    with pytest.raises(ValueError, match=r"data.lerobot: unknown option\(s\) \['camera'\]"):
        DemoDataConfig(paths=[str(root)], lerobot={"camera": "x"})
    with pytest.raises(ValueError, match="data.lerobot.gripper='open'"):
        DemoDataConfig(paths=[str(root)], lerobot={"gripper": "open"})


# ----------------------------------------------------------------------------- bad input
def test_a_missing_feature_names_the_mapping_key_and_the_datasets_features(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    with pytest.raises(DemoFormatError, match=r"no feature 'state' \(data.lerobot.state\).*"
                       r"Fix: set data.lerobot.state"):  # fmt: skip
        scan_lerobot_dataset(root, LeRobotFeatures(state="state"))


def test_a_misshapen_action_is_refused(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    info_file = root / "meta/info.json"
    info = json.loads(info_file.read_text())
    info["features"]["action"]["shape"] = [6]
    info_file.write_text(json.dumps(info))
    with pytest.raises(DemoFormatError, match=r"'action' \(data.lerobot.action\) has shape \[6\]"):
        scan_lerobot_dataset(root, LeRobotFeatures())


def test_an_unsupported_version_names_the_supported_ones(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    info_file = root / "meta/info.json"
    info_file.write_text(info_file.read_text().replace('"v2.1"', '"v1.6"'))
    with pytest.raises(DemoFormatError, match=r"'v1.6' is not supported.*v3.0"):
        scan_lerobot_dataset(root, LeRobotFeatures())


def test_a_video_shorter_than_its_episode_is_refused(tmp_path):
    episodes = _episodes()[:1]
    root = write_v21(tmp_path / "ds", episodes)
    write_mp4(root / f"videos/chunk-000/{IMAGE}/episode_000000.mp4", episodes[0].frames[IMAGE][:3])
    (info,) = scan_lerobot_dataset(root, LeRobotFeatures())
    load_demo(info, cameras=())  # the rows are fine
    with pytest.raises(DemoFormatError, match=r"episode_000000.mp4 has 3 frames .* has 5 rows"):
        load_demo(info, cameras=("agentview",))


def test_metadata_and_rows_that_disagree_are_refused(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    episodes_file = root / "meta/episodes.jsonl"
    episodes_file.write_text(episodes_file.read_text().replace('"length": 5', '"length": 6'))
    (info,) = scan_lerobot_dataset(root, LeRobotFeatures())
    with pytest.raises(DemoFormatError, match=r"5 rows in episode_000000.parquet .* says 6 frames"):
        load_demo(info, cameras=())


def test_a_missing_data_file_names_the_fix(tmp_path):
    root = write_v21(tmp_path / "ds", _episodes()[:2], image_dtype="image")
    (root / "data/chunk-000/episode_000001.parquet").unlink()
    with pytest.raises(DemoFormatError, match=r"episode 1's file data/chunk-000/episode_000001"
                       r".parquet does not exist. Fix: copy the whole dataset"):  # fmt: skip
        scan_lerobot_dataset(root, LeRobotFeatures())


@requires_libero
def test_data_tasks_places_lerobot_episodes_by_their_instruction_in_the_suite(tmp_path):
    from embodied_rl.data.demo_loader import suite_instructions

    instructions = suite_instructions("libero_object")
    assert len(instructions) == 10 and len(set(instructions)) == 10
    other_suite = "put the black bowl on the plate"  # no task of libero_object
    assert other_suite not in instructions
    episodes = [
        make_episode(4, 0, instructions[5]),
        make_episode(4, 1, other_suite),
        make_episode(4, 2, "  " + instructions[3].upper()),  # case and spacing aside
        make_episode(4, 3, instructions[5]),
    ]
    root = write_v21(tmp_path / "ds", episodes, image_dtype="image")

    def selected(tasks):
        infos = select_demos([str(root)], None, 5, tasks=tasks, suite="libero_object")
        return [(info.name, info.task_id) for info in infos]

    assert selected([5]) == [("episode_000000", 5), ("episode_000003", 5)]
    assert selected([3, 5]) == [("episode_000000", 5), ("episode_000002", 3), ("episode_000003", 5)]
    with pytest.raises(ValueError, match=r"hold tasks \[3, 5\] and instructions of no task"):
        selected([0])
    with pytest.raises(ValueError, match="Fix: set data.suite"):
        select_demos([str(root)], None, 5, tasks=[5], suite=None)


def test_the_same_demos_as_hdf5_and_as_lerobot_give_the_same_batches(tmp_path, demo_writer):
    """Statistics, actions, proprio, frames and instructions match row for row; only the
    init state is unknown (-1) in a LeRobot dataset."""
    folder = demo_writer(tmp_path / "hdf5", tasks=2, demos=2, length=6, size=16)
    hdf5 = select_demos([str(folder)], None, heldout_every=5)
    episodes = []
    for info in hdf5:
        demo = load_demo(info, cameras=("agentview", "wrist"))
        frames = {IMAGE: demo.images["agentview"], WRIST: demo.images["wrist"]}
        episodes.append(Episode(demo.actions, demo.proprio, frames, info.instruction))
    root = write_v21(tmp_path / "lerobot", episodes, image_dtype="image")
    lerobot = select_demos([str(root)], None, heldout_every=5)
    assert [i.instruction for i in lerobot] == [i.instruction for i in hdf5]

    def first_batch(infos):
        loader = DemoLoader(
            infos, chunk=3, cameras=["agentview"], image_size=8, global_batch_size=24,
            dp_rank=0, dp_size=1, seed=0, shuffle=True,
        )  # fmt: skip
        return loader.statistics, loader.next_batch()

    (stats_h, batch_h), (stats_l, batch_l) = first_batch(hdf5), first_batch(lerobot)
    assert stats_l == stats_h
    for key in (K.OBS_STATE, K.ACTIONS, K.RESPONSE_MASK, K.OBS_IMAGE, K.SAMPLE_ID):
        assert torch.equal(batch_l[key], batch_h[key]), key
    assert batch_l[K.PROMPT_TEXT] == batch_h[K.PROMPT_TEXT]
    assert (batch_h[K.INIT_STATE_ID] >= 0).all() and (batch_l[K.INIT_STATE_ID] == -1).all()


def test_a_dataset_copied_without_its_metadata_is_named_as_such(tmp_path):
    """It was reported as a folder with no *.hdf5 demonstration files."""
    from embodied_rl.data.demo_formats import scan_demos

    root = write_v21(tmp_path / "ds", _episodes()[:1], image_dtype="image")
    (root / "meta/info.json").unlink()
    with pytest.raises(DemoFormatError, match=r"looks like a LeRobot dataset .* no meta/info.json"):
        scan_demos([str(root)])
    import shutil

    shutil.rmtree(root / "meta")  # data/*.parquet alone says it too
    with pytest.raises(DemoFormatError, match=r"it has data/\*.parquet\) but has no meta/info"):
        scan_demos([str(root)])
