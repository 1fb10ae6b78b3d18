"""Video encoders for SRPO (``policies/encoders/``): frame sampling, preprocessing, the cheap
and V-JEPA 2 encoders, and the ``encode.video`` node that calls them through the registry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.episode_videos import sample_frame_indices
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.encode import EncodeVideoConfig, encode_video_node
from embodied_rl.registry import NODE_TYPES, VIDEO_ENCODERS
from embodied_rl.runtime.context import MetricSink, NodeContext
from policies.encoders import pool_tokens, preprocess_clips, sample_clips
from policies.encoders.vjepa2 import VJepa2EncoderOptions

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
TINY_VJEPA2 = {
    "patch_size": 8,
    "crop_size": 16,
    "frames_per_clip": 4,
    "tubelet_size": 2,
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "mlp_ratio": 2.0,
    "pred_hidden_size": 16,
    "pred_num_attention_heads": 2,
    "pred_num_hidden_layers": 1,
    "pred_num_mask_tokens": 1,
}
TINY_OPTIONS = {"config": TINY_VJEPA2, "num_frames": 4, "resize_short": 16, "crop_size": 16}


def video(*frames_rgb) -> torch.Tensor:
    """(1, T, 2, 2, 3) uint8 of uniformly coloured 2x2 frames."""
    return torch.tensor(frames_rgb, dtype=torch.uint8)[None, :, None, None, :].expand(
        1, len(frames_rgb), 2, 2, 3
    )


def test_frame_indices_linspace_and_cycling():
    assert sample_frame_indices(10, 4).tolist() == [0, 3, 6, 9]  # linspace(0, 9, 4)
    assert sample_frame_indices(8, 4).tolist() == [0, 2, 4, 7]  # floor(0, 2.33, 4.67, 7)
    assert sample_frame_indices(4, 4).tolist() == [0, 1, 2, 3]
    assert sample_frame_indices(2, 4).tolist() == [0, 1, 0, 1]  # shorter: cycled
    assert sample_frame_indices(3, 4).tolist() == [0, 1, 2, 0]
    assert sample_frame_indices(5, 1).tolist() == [0]
    with pytest.raises(ValueError):
        sample_frame_indices(0, 4)


def test_sample_clips_gathers_per_episode():
    frames = torch.arange(2 * 6, dtype=torch.uint8).reshape(2, 6, 1, 1, 1).expand(2, 6, 1, 1, 3)
    clips = sample_clips(frames, torch.tensor([6, 2]), 3)
    assert clips[..., 0, 0, 0].tolist() == [[0, 2, 5], [6, 7, 6]]  # row 1 starts at value 6


def test_cheap_encoder_exact_numbers():
    enc = VIDEO_ENCODERS.get("video_encoder.cheap")({"num_frames": 3, "grid": 1}, CPU)
    # f0 black, f1 R = 0.4, f2 (R, G) = (1, 0.2). grid 1 -> per-channel frame means.
    frames = video((0, 0, 0), (102, 0, 0), (255, 51, 0))
    out = enc.encode(frames, torch.tensor([3]))
    appearance = [(0 + 0.4 + 1) / 3, 0.2 / 3, 0.0]
    end_state = [1.0, 0.2, 0.0]
    motion = [(0.4 + 0.6) / 2, (0 + 0.2) / 2, 0.0]
    assert enc.embedding_dim == 10
    assert out.dtype == torch.float32 and out.shape == (1, 10)
    assert out[0].tolist() == pytest.approx(appearance + end_state + motion + [1.0], abs=1e-6)

    # Time-reversed: same appearance and motion magnitude, but it ends black.
    reverse = enc.encode(frames.flip(1), torch.tensor([3]))
    assert reverse[0].tolist() == pytest.approx(appearance + [0, 0, 0] + motion + [1.0], abs=1e-6)


def test_cheap_encoder_padding_cycling_and_invalid():
    enc = VIDEO_ENCODERS.get("video_encoder.cheap")({"num_frames": 4, "grid": 1}, CPU)
    # Two valid frames then garbage padding; sampled as f0, f1, f0, f1: the wrap-around pair
    # (f1 -> f0) is no motion, so motion = |f1 - f0| = 0.4 on R.
    frames = torch.cat([video((0, 0, 0), (102, 0, 0), (255, 255, 255)), video(*[(0, 0, 0)] * 3)])
    out = enc.encode(frames, torch.tensor([2, 0]))
    assert out[0].tolist() == pytest.approx(
        [0.2, 0, 0] + [0.4, 0, 0] + [0.4, 0, 0] + [1.0], abs=1e-6
    )
    assert out[1].tolist() == [0.0] * 10  # length 0: the invalid (all-zero) embedding
    # an all-black but valid video is not all zero
    assert enc.encode(video((0, 0, 0)), torch.tensor([1]))[0, -1] == 1.0
    # identical videos -> identical vectors; padding content does not matter
    again = enc.encode(video((0, 0, 0), (102, 0, 0), (9, 9, 9)), torch.tensor([2]))
    assert torch.equal(again[0], out[0])


def test_cheap_encoder_grid_pooling():
    enc = VIDEO_ENCODERS.get("video_encoder.cheap")({"num_frames": 2, "grid": 2}, CPU)
    frame = torch.zeros(1, 1, 4, 4, 3, dtype=torch.uint8)
    frame[0, 0, 0, 0, 0] = 255  # one red pixel in the top-left 2x2 cell
    out = enc.encode(frame, torch.tensor([1]))[0]
    red_cells = [0.25, 0, 0, 0]  # channel-major: R cells (tl, tr, bl, br), then G, then B
    assert out[:12].tolist() == pytest.approx(red_cells + [0] * 8)  # appearance
    assert out[12:24].tolist() == pytest.approx(red_cells + [0] * 8)  # end state
    assert out[24:36].tolist() == [0.0] * 12  # one frame: no motion
    assert len(out) == 9 * 4 + 1


def test_preprocess_resize_crop_normalise():
    # 2 x 4 frame, resize_short 2 (no resize), crop 2: columns 1 and 2 are kept.
    clip = torch.zeros(1, 1, 2, 4, 3, dtype=torch.uint8)
    clip[0, 0, :, 1:3] = 255
    out = preprocess_clips(clip, resize_short=2, crop_size=2)
    assert out.shape == (1, 1, 3, 2, 2)
    white = [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225]
    assert out[0, 0, :, 0, 0].tolist() == pytest.approx(white, abs=1e-6)
    assert (out[0, 0] == out[0, 0, :, :1, :1]).all()  # every kept pixel is white
    # a uniform 6 x 9 frame resized (short side 4 -> 4 x 6) and cropped to 4 x 4
    grey = torch.full((1, 2, 6, 9, 3), 128, dtype=torch.uint8)
    out = preprocess_clips(grey, resize_short=4, crop_size=4)
    assert out.shape == (1, 2, 3, 4, 4)
    assert out[0, 1, 0].flatten().tolist() == pytest.approx(
        [(128 / 255 - 0.485) / 0.229] * 16, abs=1e-6
    )


@pytest.fixture(scope="module")
def tiny_vjepa2():
    return VIDEO_ENCODERS.get("video_encoder.vjepa2")(TINY_OPTIONS, CPU)


def _random_frames(b: int, t: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, t, 20, 24, 3), generator=gen, dtype=torch.uint8)


def test_vjepa2_encoder_shapes_invalid_rows_and_pipeline(tiny_vjepa2):
    frames = _random_frames(3, 10)
    lengths = torch.tensor([10, 0, 2])
    out = tiny_vjepa2.encode(frames, lengths)
    assert out.shape == (3, 32) and out.dtype == torch.float32
    assert out[1].tolist() == [0.0] * 32
    assert (out[0] != 0).any() and (out[2] != 0).any()
    # the same as sampling (0, 3, 6, 9) / (0, 1, 0, 1) and preprocessing by hand
    clips = torch.stack([frames[0, [0, 3, 6, 9]], frames[2, [0, 1, 0, 1]]])
    pixels = preprocess_clips(clips, 16, 16)
    with torch.no_grad():
        tokens = tiny_vjepa2.model(pixel_values_videos=pixels, skip_predictor=True)
    expected = tokens.last_hidden_state.mean(dim=1)
    assert tokens.last_hidden_state.shape == (2, 2 * 2 * 2, 32)  # (4/2) x (16/8)^2 tokens
    torch.testing.assert_close(out[[0, 2]], expected)
    # padding frames do not matter
    padded = frames.clone()
    padded[2, 2:] = 0
    torch.testing.assert_close(tiny_vjepa2.encode(padded, lengths), out)
    assert not any(p.requires_grad for p in tiny_vjepa2.parameters())


def test_pool_tokens_by_hand():
    """2 tubelets of (16 / 8)^2 = 4 tokens each, time outermost: the last 4 tokens are the end."""
    tokens = torch.arange(16, dtype=torch.float32).reshape(1, 8, 2)  # token i = (2i, 2i + 1)
    cfg = type("Cfg", (), {"crop_size": 16, "patch_size": 8})
    assert pool_tokens(tokens, cfg, "mean").tolist() == [[7.0, 8.0]]  # mean of 0, 2, ..., 14
    assert pool_tokens(tokens, cfg, "end").tolist() == [[11.0, 12.0]]  # tokens 4..7
    assert pool_tokens(tokens, cfg, "mean_and_end").tolist() == [[7.0, 8.0, 11.0, 12.0]]


def test_vjepa2_pooling_options(tiny_vjepa2):
    build = VIDEO_ENCODERS.get("video_encoder.vjepa2")
    both = build({**TINY_OPTIONS, "pooling": "mean_and_end"}, CPU)
    end = build({**TINY_OPTIONS, "pooling": "end"}, CPU)  # same seed: the same weights
    assert (both.embedding_dim, end.embedding_dim) == (64, 32)
    frames, lengths = _random_frames(2, 6, seed=2), torch.tensor([6, 0])
    out = both.encode(frames, lengths)
    assert out.shape == (2, 64) and out[1].tolist() == [0.0] * 64
    torch.testing.assert_close(out[:, :32], tiny_vjepa2.encode(frames, lengths))
    torch.testing.assert_close(out[:, 32:], end.encode(frames, lengths))
    assert not torch.allclose(out[0, :32], out[0, 32:])
    with pytest.raises(ValueError, match="pooling must be one of mean, end, mean_and_end"):
        build({**TINY_OPTIONS, "pooling": "max"}, CPU)


def test_vjepa2_loads_local_safetensors(tiny_vjepa2, tmp_path: Path):
    tiny_vjepa2.model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "model.safetensors").exists()
    options = {"path": str(tmp_path), "num_frames": 4, "resize_short": 16, "crop_size": 16}
    loaded = VIDEO_ENCODERS.get("video_encoder.vjepa2")(options, CPU)
    frames, lengths = _random_frames(2, 5, seed=1), torch.tensor([5, 3])
    torch.testing.assert_close(loaded.encode(frames, lengths), tiny_vjepa2.encode(frames, lengths))


def test_vjepa2_options_are_checked():
    build = VIDEO_ENCODERS.get("video_encoder.vjepa2")
    with pytest.raises(ValueError, match="exactly one"):
        build({"num_frames": 4}, CPU)
    with pytest.raises(ValueError, match="unknown option"):
        build({**TINY_OPTIONS, "frames": 4}, CPU)
    with pytest.raises(ValueError, match="tubelet_size"):
        build({**TINY_OPTIONS, "num_frames": 3}, CPU)
    with pytest.raises(ValueError, match="options.crop_size is 8 but the model's crop_size is 16"):
        build({**TINY_OPTIONS, "crop_size": 8, "resize_short": 8}, CPU)
    with pytest.raises(ValueError, match=r"num_frames must be >= 1 or null"):
        build({**TINY_OPTIONS, "num_frames": 0}, CPU)


def test_vjepa2_clip_defaults_to_the_models_own():
    """Frames, crop and resize come from the model's config (frames_per_clip, crop_size,
    crop * 256 / 224); only the crop must match it, the frame count may differ."""
    build = VIDEO_ENCODERS.get("video_encoder.vjepa2")
    default = build({"config": TINY_VJEPA2}, CPU).options
    assert (default.num_frames, default.crop_size, default.resize_short) == (4, 16, 18)
    published = {**TINY_VJEPA2, "crop_size": 384, "patch_size": 16, "frames_per_clip": 64}
    cfg = type("Cfg", (), published)  # the resize of the SRPO paper's ViT-g/384 input
    resolved = VJepa2EncoderOptions(config=TINY_VJEPA2).for_model(cfg)
    assert (resolved.num_frames, resolved.crop_size, resolved.resize_short) == (64, 384, 438)
    longer = build({"config": TINY_VJEPA2, "num_frames": 8}, CPU)
    frames, lengths = _random_frames(2, 9, seed=2), torch.tensor([9, 6])
    assert longer.options.num_frames == 8 and longer.encode(frames, lengths).shape == (2, 32)


def test_vjepa2_model_folders_are_checked(tiny_vjepa2, tmp_path: Path):
    """A missing folder, config or weights, and a clip the saved model was not built for, are
    refused naming the file and the fix before anything loads."""
    build = VIDEO_ENCODERS.get("video_encoder.vjepa2")
    options = {"num_frames": 4, "resize_short": 16, "crop_size": 16}
    with pytest.raises(ValueError, match=r"is not a directory. Fix: point options.path"):
        build({**options, "path": str(tmp_path / "nothing")}, CPU)
    with pytest.raises(ValueError, match=r"config.json is missing"):
        build({**options, "path": str(tmp_path)}, CPU)
    tiny_vjepa2.model.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"holds no \*.safetensors weights"):
        build({**options, "path": str(tmp_path)}, CPU)
    tiny_vjepa2.model.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(ValueError, match=rf"crop_size is 16 \({tmp_path}/config.json\)"):
        build({**options, "crop_size": 8, "resize_short": 8, "path": str(tmp_path)}, CPU)


def test_encode_video_node_micro_batches():
    enc = VIDEO_ENCODERS.get("video_encoder.cheap")({"num_frames": 3, "grid": 2}, CPU)
    frames = _random_frames(3, 4, seed=2)
    batch = TensorDict({K.FRAMES: frames, K.FINISH_STEP: torch.tensor([3, -1, 1])}, batch_size=[3])
    node_type = NODE_TYPES.get("encode.video")
    config = node_type.build_config({"micro_batch_size": 2})
    assert node_type.read_keys(config) == (K.FRAMES, K.FINISH_STEP)
    ctx = NodeContext(
        cfg=None,
        node_id="encode",
        node_config=config,
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models={"video_encoder": enc},
        state={},
        step=0,
        metrics=MetricSink(),
        device=CPU,
        run_dir=Path("."),
    )
    out = encode_video_node(ctx, batch)[K.TRAJ_EMBEDDING]
    assert out.shape == (3, 37)
    # lengths = FINISH_STEP + 1 = 4, 0, 2
    torch.testing.assert_close(out, enc.encode(frames, torch.tensor([4, 0, 2])))
    assert out[1].tolist() == [0.0] * 37
    with pytest.raises(ValueError):
        EncodeVideoConfig(micro_batch_size=0)


def test_the_policies_plugin_registers_the_encoders():
    """In a fresh process (as a worker loads its plugins by name), ``rollout`` registers no
    encoder and ``policies`` registers both, so configs naming them keep working."""
    code = textwrap.dedent(
        """
        from embodied_rl.registry import VIDEO_ENCODERS, load_plugins

        load_plugins(["rollout"])
        print("rollout", VIDEO_ENCODERS.names())
        load_plugins(["policies"])
        print("policies", VIDEO_ENCODERS.names())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines() == [
        "rollout []",
        "policies ['video_encoder.cheap', 'video_encoder.efficientnet_lite0', 'video_encoder.vjepa2']",
    ], result.stdout


def test_inspect_describes_a_vjepa2_folder_and_a_run_folder(tiny_vjepa2, tmp_path, capsys):
    from embodied_rl.cli import main

    tiny_vjepa2.model.save_pretrained(tmp_path / "vjepa", safe_serialization=True)
    assert main(["inspect", str(tmp_path / "vjepa")]) == 0
    out = capsys.readouterr().out
    parameters = sum(p.numel() for p in tiny_vjepa2.model.parameters())
    assert "V-JEPA 2 video model" in out and "1 layers, width 32" in out
    assert "4 frames, crop 16, patch 8" in out and f"parameters  {parameters / 1e3:.2f} k" in out
    assert f"models.video_encoder.options.path={tmp_path / 'vjepa'}" in out
    shipped = ROOT / "assets" / "checkpoints" / "openvla_oft_libero_object_task0"
    assert main(["inspect", str(shipped)]) == 0
    out = capsys.readouterr().out
    assert "a run of embodied-rl train (sft_libero)" in out and "step_000600" in out
    assert out.strip().endswith(f"models.actor.init_from={shipped}")
