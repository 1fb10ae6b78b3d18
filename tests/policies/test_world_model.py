"""World-model pretraining pieces: tube masks, the latent L1, the V-JEPA 2 world model (masked
context encoding, EMA target, export read back by the SRPO encoder), the video clip loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import policies  # noqa: F401  (registers world_model.vjepa2 and the exporters)
from embodied_rl import keys as K
from embodied_rl.algorithms.jepa import TubeMaskConfig, latent_l1, tube_mask
from embodied_rl.data.episode_videos import EpisodeVideo, write_episode_videos
from embodied_rl.data.video_loader import VideoClipLoader, select_videos
from embodied_rl.registry import EXPORTERS, model_builder
from policies.encoders import build_vjepa2_encoder

CPU = torch.device("cpu")
TINY = {  # 2 x 4 x 4 tokens of 16 wide
    "patch_size": 8,
    "crop_size": 32,
    "frames_per_clip": 4,
    "tubelet_size": 2,
    "hidden_size": 24,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "mlp_ratio": 2.0,
    "pred_hidden_size": 12,
    "pred_num_attention_heads": 2,
    "pred_num_hidden_layers": 1,
    "pred_num_mask_tokens": 2,
}
FRAMES = {"num_frames": 4, "resize_short": 32, "crop_size": 32}


@pytest.fixture
def world_model():
    return model_builder("world_model.vjepa2")({"config": TINY, **FRAMES}, CPU)


def clips(batch: int = 2, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 4, 32, 32, 3), dtype=torch.uint8, generator=generator)


# --------------------------------------------------------------------------------- masks, loss
@pytest.mark.parametrize(
    "depth,grid,blocks,scale", [(2, 4, 1, 0.2), (8, 8, 4, 0.15), (3, 2, 8, 0.9)]
)
def test_tube_mask_partitions_the_tokens_into_tubes(depth, grid, blocks, scale):
    generator = torch.Generator().manual_seed(3)
    for _ in range(20):
        context, target = tube_mask(depth, grid, TubeMaskConfig(blocks, scale), generator)
        both = torch.cat([context, target]).sort().values
        assert torch.equal(both, torch.arange(depth * grid * grid))  # disjoint, complete
        assert torch.equal(context, context.sort().values) and len(target) >= depth
        assert len(context) >= depth  # at least one visible spatial cell per time step
        spatial = target % (grid * grid)
        per_step = spatial.reshape(depth, -1)  # the same cells masked at every time step
        assert (per_step == per_step[0]).all()


def test_tube_mask_rectangle_area_and_determinism():
    config = TubeMaskConfig(num_blocks=1, block_scale=0.25, aspect_ratio=(1.0, 1.0))
    _, target = tube_mask(1, 8, config, torch.Generator().manual_seed(0))
    assert len(target) == 16  # a 4 x 4 square: 0.25 of 8 x 8
    rows, cols = target // 8, target % 8
    assert rows.max() - rows.min() == 3 and cols.max() - cols.min() == 3
    again = tube_mask(1, 8, config, torch.Generator().manual_seed(0))[1]
    assert torch.equal(target, again)


def test_tube_mask_options_are_checked():
    with pytest.raises(ValueError, match="block_scale"):
        TubeMaskConfig(block_scale=0.0)
    with pytest.raises(ValueError, match="num_blocks"):
        TubeMaskConfig(num_blocks=0)
    with pytest.raises(ValueError, match="crop_size >= 2"):
        tube_mask(2, 1, TubeMaskConfig(), torch.Generator())


def test_latent_l1_is_the_batch_mean_share():
    predicted = torch.tensor([[[1.0, 2.0]], [[0.0, 0.0]]])  # (2 clips, 1 token, 2 dims)
    target = torch.tensor([[[0.0, 0.0]], [[3.0, -1.0]]])
    # clip means 1.5 and 2.0; a batch of 4 clips over all ranks -> (1.5 + 2.0) / 4
    assert latent_l1(predicted, target, total_rows=4).item() == pytest.approx(0.875)


# --------------------------------------------------------------------------------- the model
def test_context_encoding_is_the_encoder_on_the_visible_tokens_only(world_model):
    pixels = world_model.pixels(clips())
    everything = torch.arange(world_model.depth * world_model.grid**2)
    full = world_model.online.encoder(pixels).last_hidden_state
    # all tokens visible: the same as the library's encoder
    torch.testing.assert_close(world_model.context_tokens(pixels, everything), full)
    context, target = tube_mask(
        world_model.depth,
        world_model.grid,
        TubeMaskConfig(1, 0.25),
        torch.Generator().manual_seed(1),
    )
    encoded = world_model.context_tokens(pixels, context)
    # changing the pixels of the masked tubes changes nothing the context encoder outputs
    rows, cols = (target % world_model.grid**2) // world_model.grid, target % world_model.grid
    changed = pixels.clone()
    for r, c in {(int(r), int(c)) for r, c in zip(rows, cols)}:
        changed[..., r * 8 : (r + 1) * 8, c * 8 : (c + 1) * 8] += 5.0
    torch.testing.assert_close(world_model.context_tokens(changed, context), encoded)
    assert not torch.allclose(
        world_model.online.encoder(changed).last_hidden_state[:, context], full[:, context]
    )
    predicted = world_model.predict(encoded, context, target)
    assert predicted.shape == (2, len(target), TINY["hidden_size"])


def test_ema_target_update(world_model):
    online = [p.detach().clone() for p in world_model.online.encoder.parameters()]
    start = [p.detach().clone() for p in world_model.target.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(online, start))  # a copy at the start
    assert not any(p.requires_grad for p in world_model.target.parameters())
    with torch.no_grad():
        for p in world_model.online.encoder.parameters():
            p.add_(1.0)
    world_model.update_target(1.0)
    assert all(torch.equal(p, s) for p, s in zip(world_model.target.parameters(), start))
    world_model.update_target(0.75)  # 0.75 * start + 0.25 * (start + 1)
    for p, s in zip(world_model.target.parameters(), start):
        torch.testing.assert_close(p, s + 0.25)
    world_model.update_target(0.0)
    for p, o in zip(world_model.target.parameters(), world_model.online.encoder.parameters()):
        torch.testing.assert_close(p, o)


def test_export_is_read_by_the_srpo_encoder_as_the_target_encoder(world_model, tmp_path):
    with torch.no_grad():  # make the target differ from the online encoder
        for p in world_model.online.encoder.parameters():
            p.mul_(1.5)
    exported = EXPORTERS.get("world_model.vjepa2")(
        world_model, {"config": TINY, **FRAMES}, tmp_path
    )
    name, policy, options = exported.also["As SRPO's trajectory encoder (encode.video)"]
    assert (name, policy) == ("video_encoder", "video_encoder.vjepa2")
    assert options == {"path": str(tmp_path), **FRAMES}
    encoder = build_vjepa2_encoder(options, CPU)
    videos, lengths = clips(3, seed=2), torch.tensor([4, 4, 4])
    expected = world_model.target(world_model.pixels(videos)).last_hidden_state.mean(dim=1)
    torch.testing.assert_close(encoder.encode(videos, lengths), expected)
    online = world_model.online.encoder(world_model.pixels(videos)).last_hidden_state.mean(dim=1)
    assert not torch.allclose(encoder.encode(videos, lengths), online)
    again = model_builder("world_model.vjepa2")(exported.options, CPU)  # pretrain further
    for (key, a), b in zip(
        again.online.state_dict().items(), world_model.exported_model().state_dict().values()
    ):
        torch.testing.assert_close(a, b, msg=key)


def test_world_model_options_are_checked():
    build = model_builder("world_model.vjepa2")
    with pytest.raises(ValueError, match="exactly one of 'config'"):
        build({**FRAMES}, CPU)
    with pytest.raises(ValueError, match="crop_size 16 must equal the model's crop_size 32"):
        build({"config": TINY, "num_frames": 4, "resize_short": 16, "crop_size": 16}, CPU)
    with pytest.raises(ValueError, match="num_frames 2 its frames_per_clip 4"):
        build({"config": TINY, **FRAMES, "num_frames": 2}, CPU)
    with pytest.raises(ValueError, match="multiple of its tubelet_size 2"):
        build({"config": {**TINY, "frames_per_clip": 3}, **FRAMES, "num_frames": 3}, CPU)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['frames'\]"):
        build({"config": TINY, **FRAMES, "frames": 4}, CPU)


# --------------------------------------------------------------------------------- clip loader
def write_videos(folder, inits=(0, 1, 4, 9, 2), length=10):
    """One file; video i brightens to i * 20 and started from ``inits[i]``."""
    ramp = np.linspace(0, 1, length)[:, None, None, None]
    videos = [
        EpisodeVideo(
            (ramp * 20 * i * np.ones((length, 8, 8, 3))).astype(np.uint8),
            "pick",
            i % 2 == 0,
            0,
            init,
        )
        for i, init in enumerate(inits)
    ]
    return write_episode_videos(folder / "episodes.hdf5", videos)


def test_held_out_init_states_are_left_out(tmp_path):
    write_videos(tmp_path)
    infos, dropped = select_videos([str(tmp_path)], heldout_every=5)
    assert [i.init_state for i in infos] == [0, 1, 2]  # 4 (validation) and 9 (test) left out
    assert dropped == {"heldout_init_state": 2}
    assert len(select_videos([str(tmp_path)], heldout_every=0)[0]) == 5
    with pytest.raises(ValueError, match=r"no videos to pretrain on.*Fix"):
        select_videos([str(tmp_path)], heldout_every=5, tasks=[3])


def make_loader(infos, rank=0, size=1, prefix_prob=0.0):
    return VideoClipLoader(
        infos,
        num_frames=4,
        image_size=4,
        global_batch_size=4,
        dp_rank=rank,
        dp_size=size,
        seed=7,
        prefix_prob=prefix_prob,
    )


def test_clip_loader_batches_shards_and_resumes(tmp_path):
    write_videos(tmp_path)
    infos, _ = select_videos([str(tmp_path)], heldout_every=0)
    batch = make_loader(infos).next_batch()
    assert batch[K.FRAMES].shape == (4, 4, 4, 4, 3) and batch[K.FRAMES].dtype == torch.uint8
    # whole-episode clips: frames 0, 3, 6, 9 of 10 (the encoders' linspace rule)
    for row, init in enumerate(batch[K.INIT_STATE_ID].tolist()):
        video = [i.init_state for i in infos].index(init)
        expected = (np.linspace(0, 1, 10)[[0, 3, 6, 9]] * 20 * video).astype(np.uint8)
        assert batch[K.FRAMES][row, :, 0, 0, 0].tolist() == expected.tolist()
        assert bool(batch[K.SUCCESS][row]) == (video % 2 == 0)
    assert batch[K.FRAME_COUNT].tolist() == [4] * 4
    # two ranks draw disjoint halves of the same global batch
    halves = [make_loader(infos, rank, 2).next_batch()[K.SAMPLE_ID].tolist() for rank in (0, 1)]
    assert sorted(halves[0] + halves[1]) == sorted(batch[K.SAMPLE_ID].tolist())
    # a loader restored from a state draws what the original draws next
    first = make_loader(infos, prefix_prob=0.5)
    first.next_batch()
    restored = make_loader(infos, prefix_prob=0.5)
    restored.load_state_dict(first.state_dict())
    assert torch.equal(first.next_batch()[K.FRAMES], restored.next_batch()[K.FRAMES])
    with pytest.raises(ValueError, match="resume with the same video paths"):
        make_loader(infos[:3]).load_state_dict(first.state_dict())


def test_prefix_clips_stay_inside_a_prefix(tmp_path):
    write_videos(tmp_path, inits=(0, 1), length=40)
    infos, _ = select_videos([str(tmp_path)], heldout_every=0)
    loader = VideoClipLoader(
        infos[1:],
        num_frames=4,
        image_size=8,
        global_batch_size=8,
        dp_rank=0,
        dp_size=1,
        seed=0,
        prefix_prob=1.0,
    )
    reached = set()
    for _ in range(5):
        frames = loader.next_batch()[K.FRAMES][:, :, 0, 0, 0]
        assert (frames[:, 0] == 0).all()  # every clip starts at the episode's start
        reached |= set(frames.max(dim=1).values.tolist())  # how far its prefix went
    assert len(reached) > 3 and min(reached) < 10  # prefixes of different lengths, some short
