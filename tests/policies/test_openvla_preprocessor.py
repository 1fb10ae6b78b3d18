"""OpenVLA's released ``preprocessor_config.json``: a checkpoint that has one is normalised with
its values (the DINOv2 mean / std rounded to bfloat16, as the published models were trained),
pixel for pixel as the released processor computes them (PIL bicubic resize, centre crop,
/255, per-tower normalisation); settings the policy would not follow are refused on the driver."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import policies  # noqa: F401  (registers the policies)
from embodied_rl.runtime.config import ConfigError, compose, validate_config
from policies.openvla import build_openvla
from policies.openvla.loading import save_checkpoint
from policies.openvla.preprocessor import PREPROCESSOR_FILE, check_processor_file

CPU = torch.device("cpu")
# The released file's values: DINOv2's are ImageNet's (0.485, 0.456, 0.406) / (0.229, 0.224,
# 0.225) rounded to bfloat16; SigLIP's 0.5.
DINO = {"mean": [0.484375, 0.455078125, 0.40625], "std": [0.228515625, 0.2236328125, 0.224609375]}
SIGLIP = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}


def released_processor_file(size: int, interpolation: int = 3, crop: int | None = None) -> dict:
    """``preprocessor_config.json`` in the released layout, for towers of ``size`` px."""
    crop = size if crop is None else crop
    resize = {"antialias": True, "interpolation": interpolation, "max_size": None}
    return {
        "image_processor_type": "PrismaticImageProcessor",
        "image_resize_strategy": "resize-naive",
        "input_sizes": [[3, size, size], [3, size, size]],
        "interpolations": ["bicubic", "bicubic"],
        "means": [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]],
        "stds": [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]],
        "tvf_crop_params": [{"output_size": [crop, crop]}] * 2,
        "tvf_do_letterbox": False,
        "tvf_letterbox_fill": None,
        "tvf_normalize_params": [{"inplace": False, **DINO}, {"inplace": False, **SIGLIP}],
        "tvf_resize_params": [{**resize, "size": [size, size]}] * 2,
        "use_fused_vision_backbone": True,
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The tiny OpenVLA in the published layout, with the released processor file."""
    out = tmp_path_factory.mktemp("openvla_published")
    policy = build_openvla({"seed": 0}, CPU)
    save_checkpoint(policy, out, policy.vla.arch, None, policy.tokenizer)
    size = policy.vla.arch.image_size
    (out / PREPROCESSOR_FILE).write_text(json.dumps(released_processor_file(size)))
    return out


def released_pixels(images: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, 6, S, S) as the released processor makes them: PIL bicubic
    resize, centre crop (none: crop = resize), /255, each tower's mean / std from the file."""
    out = []
    for image in images:
        resized = np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC))
        x = resized.astype(np.float64).transpose(2, 0, 1) / 255.0
        towers = [(x - np.array(n["mean"])[:, None, None]) / np.array(n["std"])[:, None, None]
                  for n in (DINO, SIGLIP)]  # fmt: skip
        out.append(np.concatenate(towers))
    return np.stack(out)


def test_pixels_are_the_released_processors_for_images_at_the_towers_size(folder):
    policy = build_openvla({"preset": None, "path": str(folder)}, CPU)
    size = policy.vla.arch.image_size
    images = np.random.default_rng(0).integers(0, 256, (3, size, size, 3), dtype=np.uint8)
    ours = policy.pixel_values(images).double().numpy()
    np.testing.assert_allclose(ours, released_pixels(images, size), atol=1e-5)
    # the file's values were used: the towers' own (unrounded ImageNet) give other pixels
    preset = build_openvla({"seed": 0}, CPU)
    builtin = preset.pixel_values(images).double().numpy()
    assert np.abs(builtin[:, :3] - ours[:, :3]).max() > 1e-3
    np.testing.assert_allclose(builtin[:, 3:], ours[:, 3:], atol=1e-6)  # SigLIP's: 0.5 both


def test_a_resized_image_is_close_to_the_released_processors(folder):
    """Larger camera frames: our antialiased bicubic is close to PIL's, not bit-identical."""
    policy = build_openvla({"preset": None, "path": str(folder)}, CPU)
    size = policy.vla.arch.image_size
    ramp = np.linspace(0, 255, 4 * size)
    smooth = np.stack([np.add.outer(ramp, ramp) / 2, np.add.outer(ramp, -ramp) / 2 + 128,
                       np.add.outer(0 * ramp, ramp)], axis=-1)  # fmt: skip
    images = np.clip(smooth, 0, 255).astype(np.uint8)[None]
    ours = policy.pixel_values(images).double().numpy()
    reference = released_pixels(images, size)
    # within 2 grey levels of 255 in every tower's units (std >= 0.22: 2/255/0.22 = 0.036)
    assert np.abs(ours - reference).max() < 0.036


@pytest.mark.parametrize(
    "change, message",
    [
        ({"interpolation": 2}, "resize interpolation 2 is not bicubic"),
        ({"crop": 8}, "tvf_crop_params output_size is [8, 8]"),
    ],
)
def test_settings_the_policy_would_not_follow_are_refused_before_workers(
    folder, tmp_path, change, message
):
    import shutil

    copy = shutil.copytree(folder, tmp_path / "changed")
    size = build_openvla({"seed": 0}, CPU).vla.arch.image_size
    (copy / PREPROCESSOR_FILE).write_text(json.dumps(released_processor_file(size, **change)))
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_processor_file({"path": str(copy)})
    overrides = ["models.actor.policy=openvla", "++models.actor.options.preset=null",
                 f"++models.actor.options.path={copy}"]  # fmt: skip
    with pytest.raises(ConfigError, match="Fix: remove the file"):
        validate_config(compose("srpo_libero", overrides))  # on the driver: no Ray


def test_inspect_names_the_processor_file(folder, capsys):
    from embodied_rl.cli import main

    assert main(["inspect", str(folder)]) == 0
    assert f"image processor  {PREPROCESSOR_FILE} (its mean / std)" in capsys.readouterr().out


def test_oft_libero_frame_resize_round_trips_through_jpeg_then_lanczos():
    """frame_resize=oft_libero: a noise frame at the towers' size loses detail to the JPEG round
    trip (bicubic leaves it as it is); a smooth frame four times larger comes out within a few
    grey levels of the bicubic resize (both antialiased), and every value is a whole grey level
    (the frames stay uint8, as OFT's evaluation gives them to the processor)."""
    bicubic = build_openvla({"seed": 0}, CPU)
    oft = build_openvla({"seed": 0, "frame_resize": "oft_libero"}, CPU)
    size = bicubic.vla.arch.image_size
    noise = np.random.default_rng(1).integers(0, 256, (2, size, size, 3), dtype=np.uint8)
    exact = bicubic.pixel_values(noise)[:, 3:] * 0.5 + 0.5  # SigLIP's tower: back to [0, 1]
    jpeg = oft.pixel_values(noise)[:, 3:] * 0.5 + 0.5
    np.testing.assert_allclose(exact.numpy(), noise.transpose(0, 3, 1, 2) / 255.0, atol=1e-6)
    assert 0.01 < (jpeg - exact).abs().mean() < 0.3  # noise is JPEG's worst case (4:2:0 chroma)
    levels = (jpeg * 255).numpy()
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)

    ramp = np.linspace(0, 255, 4 * size)
    smooth = np.clip(np.stack([np.add.outer(ramp, ramp) / 2] * 3, axis=-1), 0, 255)
    frames = smooth.astype(np.uint8)[None]
    gap = oft.pixel_values(frames)[:, 3:] - bicubic.pixel_values(frames)[:, 3:]
    assert gap.abs().max() * 0.5 < 4 / 255


def test_an_unknown_frame_resize_is_refused():
    with pytest.raises(ValueError, match=r"frame_resize 'nearest' is not one of \['bicubic'"):
        build_openvla({"seed": 0, "frame_resize": "nearest"}, CPU)
