"""Demonstration loader: sharding, resume, chunks, resizing, augmentation, held-out refusal."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_loader import DemoLoader, random_shift, resize_frames, select_demos
from embodied_rl.data.demos import dataset_statistics

LENGTH = 12


def loader(infos, rank=0, size=1, batch=8, **options) -> DemoLoader:
    defaults = {"chunk": 3, "cameras": ["agentview"], "image_size": None, "seed": 7}
    return DemoLoader(
        infos, global_batch_size=batch, dp_rank=rank, dp_size=size, **{**defaults, **options}
    )


def identities(batch) -> list[tuple[str, int, int]]:
    """(instruction, init state, step) of each row: the synthetic proprio holds t / T."""
    steps = (batch[K.OBS_STATE][:, 0, 0] * LENGTH).round().long().tolist()
    return list(zip(batch[K.PROMPT_TEXT], batch[K.INIT_STATE_ID].tolist(), steps))


@pytest.fixture
def infos(tmp_path, demo_writer):
    return select_demos([str(demo_writer(tmp_path, length=LENGTH))], None, heldout_every=5)


def test_two_ranks_cover_every_step_once_per_epoch(infos):
    assert len(infos) == 4  # 2 tasks x 2 demos x 12 steps = 48 rows, 6 steps of 8
    ranks = [loader(infos, rank=r, size=2, shift=2) for r in range(2)]
    seen: Counter = Counter()
    for _ in range(6):
        for rank in ranks:
            batch = rank.next_batch()
            assert batch.batch_size[0] == 4
            seen.update(identities(batch))
    assert len(seen) == 48 and set(seen.values()) == {1}
    assert all(rank.epoch == 1 for rank in ranks)
    # Each rank read the frames of the demos its rows touched, and only those.
    assert all(0 < len(rank._frames) <= 4 for rank in ranks)


def test_resume_gives_the_same_batches(infos):
    first = loader(infos, rank=1, size=2, shift=2)
    for _ in range(3):
        first.next_batch()
    state = first.state_dict()
    expected = [first.next_batch() for _ in range(5)]  # crosses into epoch 1
    resumed = loader(infos, rank=1, size=2, shift=2)
    resumed.load_state_dict(state)
    for want in expected:
        got = resumed.next_batch()
        assert identities(got) == identities(want)
        for key in (K.OBS_IMAGE, K.ACTIONS, K.RESPONSE_MASK, K.SAMPLE_ID):
            assert torch.equal(got[key], want[key]), key
    with pytest.raises(ValueError, match="same data.paths"):
        loader(infos[:2], rank=1, size=2).load_state_dict(state)


def test_rows_hold_the_action_chunk_padded_and_masked_at_the_end(infos):
    data = loader(infos, chunk=3)
    demo = load_demo(infos[1], cameras=("agentview",))
    first = LENGTH  # rows are demo-major: demo 1 of 4 -> rows 12..23
    batch = data.rows_batch([first + 4, first + LENGTH - 2, first + LENGTH - 1], [0, 1, 2], None)
    actions, mask = batch[K.ACTIONS], batch[K.RESPONSE_MASK]
    assert actions.shape == (3, 3, 7) and mask.shape == (3, 21)
    expected = torch.from_numpy(demo.actions)
    assert torch.equal(actions[0], expected[4:7])
    assert torch.equal(actions[1], torch.stack([expected[10], expected[11], expected[11]]))
    assert torch.equal(actions[2], expected[11].expand(3, 7))  # padded with the last action
    assert mask.view(3, 3, 7)[:, :, 0].tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]
    assert torch.equal(batch[K.OBS_STATE][1, 0], torch.from_numpy(demo.proprio[10]))
    assert torch.equal(batch[K.OBS_IMAGE][0, 0], torch.from_numpy(demo.images["agentview"][4]))
    assert batch[K.PROMPT_TEXT][0] == demo.info.instruction and batch[K.STEP_MASK].sum() == 3


def test_statistics_come_from_every_selected_demo(tmp_path, demo_writer):
    folder = demo_writer(tmp_path, demos=3, length=LENGTH)
    one = select_demos([str(folder)], 1, heldout_every=5)
    assert [info.name for info in one] == ["demo_0", "demo_0"]  # one per task (instruction)
    demos = [load_demo(info, cameras=()) for info in one]
    expected = dataset_statistics([d.actions for d in demos], [d.proprio for d in demos])
    assert loader(one, batch=4).statistics == expected
    assert expected["action"]["mask"] == [True] * 6 + [False]


def test_frames_are_resized_to_the_rollout_size(infos):
    data = loader(infos, image_size=8)
    image = data.next_batch()[K.OBS_IMAGE]
    assert image.shape[1:] == (1, 8, 8, 3) and image.dtype == torch.uint8
    ramp = np.tile(np.arange(16, dtype=np.uint8)[None, :, None] * 16, (16, 1, 3))[None]
    half = resize_frames(ramp, 8)[0, 0, :, 0]
    # 2x downsampling averages each 2 x 2 block: columns 2j, 2j + 1 hold 32 j and 32 j + 16.
    assert half.tolist() == [(32 * j + 32 * j + 16) // 2 for j in range(8)]


def test_random_shift_moves_each_image_by_at_most_pad_pixels():
    ramp = torch.arange(64, dtype=torch.uint8).view(8, 8)[None, :, :, None].expand(5, 8, 8, 3)
    out = random_shift(ramp.contiguous(), 2, torch.Generator().manual_seed(0))
    shifts = set()
    for image in out:
        # Find the shift (dy, dx) whose edge-replicated crop reproduces the image.
        padded = np.pad(ramp[0, :, :, 0].numpy(), 2, mode="edge")
        found = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if np.array_equal(padded[dy : dy + 8, dx : dx + 8], image[:, :, 0].numpy())
        ]
        assert found, "not a shifted crop of the input"
        shifts.add(found[0])
    assert len(shifts) > 1  # the offsets are random per image
    assert torch.equal(random_shift(ramp, 0, torch.Generator()), ramp)


def test_demos_from_held_out_init_states_are_refused(tmp_path, demo_writer):
    folder = demo_writer(tmp_path, tasks=1, init_states=(0, 9))
    with pytest.raises(ValueError) as info:
        select_demos([str(folder)], None, heldout_every=5)
    message = str(info.value)
    assert f"{folder / 'task_0_demo.hdf5'}:demo_1 started from init state 9" in message
    assert "held out" in message and "Fix:" in message
    assert len(select_demos([str(folder)], 1, heldout_every=5)) == 1  # demo_1 not selected
    assert len(select_demos([str(folder)], None, heldout_every=0)) == 2  # nothing held out


def test_data_tasks_keeps_only_the_demos_of_those_tasks(tmp_path, demo_writer):
    folder = demo_writer(tmp_path, tasks=3, init_states=(0, 1))
    assert len(select_demos([str(folder)], None, heldout_every=5)) == 6
    kept = select_demos([str(folder)], 1, heldout_every=5, tasks=[2, 0])
    assert [(info.task_id, info.path.name, info.name) for info in kept] == [
        (0, "task_0_demo.hdf5", "demo_0"),
        (2, "task_2_demo.hdf5", "demo_0"),
    ]
    with pytest.raises(ValueError, match=r"the demos hold tasks \[0, 1, 2\]"):
        select_demos([str(folder)], None, heldout_every=5, tasks=[7])


def test_data_tasks_refuses_files_that_do_not_record_their_task(tmp_path, demo_writer):
    import h5py

    folder = demo_writer(tmp_path, tasks=2, demos=1, init_states=(0,))
    with h5py.File(folder / "task_1_demo.hdf5", "a") as f:
        del f["data"].attrs["embodied_rl_task_id"]  # as LIBERO's published files
    assert len(select_demos([str(folder)], None, heldout_every=5)) == 2  # no filter: kept
    with pytest.raises(ValueError) as info:
        select_demos([str(folder)], None, heldout_every=5, tasks=[0])
    message = str(info.value)
    assert str(folder / "task_1_demo.hdf5") in message and "Fix:" in message
