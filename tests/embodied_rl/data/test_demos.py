"""LIBERO demonstration files: round trip, image orientation, refusals, statistics."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_writer import DemoEpisode, write_demo_file
from embodied_rl.data.demos import (
    DemoFormatError,
    content_digest,
    dataset_statistics,
    find_demo_files,
    scan_demo_file,
)


def episode(length: int, seed: int, size: int = 8) -> DemoEpisode:
    rng = np.random.default_rng(seed)
    return DemoEpisode(
        actions=rng.uniform(-1, 1, (length, 7)),
        agentview_rgb=rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8),
        eye_in_hand_rgb=rng.integers(0, 256, (length, size, size, 3), dtype=np.uint8),
        ee_states=rng.normal(size=(length, 6)),
        gripper_states=rng.normal(size=(length, 2)),
        joint_states=rng.normal(size=(length, 7)),
        attrs={"embodied_rl_init_state_id": seed},
    )


def write(path, episodes):
    return write_demo_file(
        path,
        episodes,
        problem_info={"problem_name": "p", "domain_name": "d", "language_instruction": "do it"},
        bddl_file_name="task.bddl",
        bddl_file_content="(define)",
        env_name="Libero_Tabletop_Manipulation",
        env_args={"type": 1},
    )


def test_round_trip_keeps_values_and_observation_orientation(tmp_path):
    episodes = [episode(5, 3), episode(4, 7)]
    path = write(tmp_path / "task_demo.hdf5", episodes)
    infos = scan_demo_file(path)
    assert [(i.name, i.length, i.init_state_id) for i in infos] == [
        ("demo_0", 5, 3),
        ("demo_1", 4, 7),
    ]
    assert infos[0].instruction == "do it" and infos[0].image_shape == (8, 8, 3)
    demo = load_demo(infos[1], cameras=("agentview", "wrist"))
    np.testing.assert_allclose(demo.actions, episodes[1].actions.astype(np.float32))
    expected_proprio = np.concatenate([episodes[1].ee_states, episodes[1].gripper_states], 1)
    np.testing.assert_allclose(demo.proprio, expected_proprio.astype(np.float32))
    # Frames come back exactly as given (the simulator's convention) ...
    np.testing.assert_array_equal(demo.images["agentview"], episodes[1].agentview_rgb)
    np.testing.assert_array_equal(demo.images["wrist"], episodes[1].eye_in_hand_rgb)
    # ... and are stored as LIBERO stores them: un-rotated ("opengl").
    with h5py.File(path) as f:
        stored = f["data/demo_1/obs/agentview_rgb"][()]
        assert f["data"].attrs["macros_image_convention"] == "opengl"
        assert f["data"].attrs["num_demos"] == 2 and f["data"].attrs["total"] == 9
        assert json.loads(f["data"].attrs["problem_info"])["language_instruction"] == "do it"
        assert list(f["data/demo_1/dones"][()]) == [0, 0, 0, 1]
    np.testing.assert_array_equal(stored[2, 0, 0], episodes[1].agentview_rgb[2, -1, -1])


def test_content_digest_follows_the_demos_not_the_file(tmp_path):
    first = write(tmp_path / "a_demo.hdf5", [episode(5, 3), episode(4, 7)])
    same = write(tmp_path / "b_demo.hdf5", [episode(5, 3), episode(4, 7)])
    with h5py.File(same, "a") as f:  # attributes (model XML, paths) are not content
        f["data"].attrs["bddl_file_name"] = "/elsewhere/task.bddl"
    assert first.read_bytes() != same.read_bytes()
    assert content_digest(first) == content_digest(same)
    with h5py.File(same, "a") as f:  # one action changed by one ulp
        actions = f["data/demo_1/actions"]
        actions[2, 0] = np.nextafter(actions[2, 0], 2.0)
    assert content_digest(first) != content_digest(same)
    reordered = write(tmp_path / "c_demo.hdf5", [episode(4, 7), episode(5, 3)])
    assert content_digest(first) != content_digest(reordered)


def test_opencv_files_are_flipped_horizontally_only(tmp_path):
    path = write(tmp_path / "t.hdf5", [episode(2, 0)])
    with h5py.File(path, "r+") as f:
        raw = f["data/demo_0/obs/agentview_rgb"][()]
        f["data"].attrs["macros_image_convention"] = "opencv"
    demo = load_demo(scan_demo_file(path)[0])
    np.testing.assert_array_equal(demo.images["agentview"], raw[:, :, ::-1])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda f: f["data/demo_1/obs"].pop("ee_states"),
            "demo demo_1: missing key 'obs/ee_states'",
        ),
        (
            lambda f: (
                f["data/demo_0"].pop("actions"),
                f["data/demo_0"].create_dataset("actions", data=np.zeros((5, 6))),
            ),
            "demo demo_0: key 'actions' has shape (5, 6), expected (T, 7)",
        ),
        (
            lambda f: (
                f["data/demo_0"].pop("actions"),
                f["data/demo_0"].create_dataset("actions", data=np.zeros((3, 7))),
            ),
            "demo demo_0: key 'obs/agentview_rgb' has 5 steps, 'actions' has 3",
        ),
        (lambda f: f["data"].attrs.__delitem__("problem_info"), "'problem_info'"),
    ],
)
def test_bad_files_are_refused_naming_file_demo_and_key(tmp_path, edit, message):
    path = write(tmp_path / "bad.hdf5", [episode(5, 0), episode(5, 1)])
    with h5py.File(path, "r+") as f:
        edit(f)
    with pytest.raises(DemoFormatError) as err:
        scan_demo_file(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_find_demo_files_lists_folders_and_refuses_empty(tmp_path):
    write(tmp_path / "b_demo.hdf5", [episode(2, 0)])
    write(tmp_path / "a_demo.hdf5", [episode(2, 0)])
    assert [p.name for p in find_demo_files([tmp_path])] == ["a_demo.hdf5", "b_demo.hdf5"]
    with pytest.raises(FileNotFoundError, match="embodied-rl demos"):
        find_demo_files([])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.hdf5"):
        find_demo_files([tmp_path / "empty"])


def test_statistics_by_hand():
    actions = [np.array([[0.0] * 6 + [-1.0], [1.0] * 6 + [1.0]]), np.array([[0.5] * 6 + [1.0]])]
    proprio = [np.zeros((2, 8)), np.ones((1, 8))]
    stats = dataset_statistics(actions, proprio)
    assert stats["num_transitions"] == 3 and stats["num_trajectories"] == 2
    assert stats["action"]["mask"] == [True] * 6 + [False]
    assert stats["action"]["mean"][0] == pytest.approx(0.5)
    # numpy's linear quantile of (0, 0.5, 1): q01 = 0.01, q99 = 0.99
    assert stats["action"]["q01"][0] == pytest.approx(0.01)
    assert stats["action"]["q99"][0] == pytest.approx(0.99)
    assert stats["proprio"]["max"] == [1.0] * 8 and stats["proprio"]["mask"] == [True] * 8
