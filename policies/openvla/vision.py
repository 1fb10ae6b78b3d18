"""The fused DINOv2 + SigLIP vision backbone, the projector and image preprocessing.

OpenVLA's backbone (Prismatic ``dinosiglip-vit-so-224px``) runs two timm ViTs on the same
image, each normalised with its own mean/std, and concatenates their patch features
channel-wise: DINOv2 ViT-L/14 with 4 registers (1024-d) and SigLIP So400m/14 (1152-d), 256
patches each at 224 px, so (N, 256, 2176). Features are the output of the *second-to-last*
block, without the final norm and without prefix (class/register) tokens. The towers' last
block, final norm and SigLIP's attention-pool head therefore never affect the output; they
stay in the module (the published checkpoints contain them) but are frozen so that no
optimizer or DDP bucket waits for gradients that never come.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embodied_rl.checks import check_range

# timm is imported where a tower is built (about 1 s, and it imports wandb when installed):
# importing ``policies``, which every worker process and CLI call does, must not pay for it.
if TYPE_CHECKING:
    from timm.models.vision_transformer import VisionTransformer

    from policies.openvla.preprocessor import TowerNormalization

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
OFT_CROP_AREA = 0.9

# Tiny towers with the real ones' structure (DINOv2: class + 4 register tokens, LayerScale,
# no position embedding on prefix tokens; SigLIP: no class token, attention-pool head).
TINY_VITS: dict[str, dict[str, Any]] = {
    "tiny_dinov2_reg4": dict(
        patch_size=8, embed_dim=32, depth=3, num_heads=2, init_values=1e-5,
        reg_tokens=4, no_embed_class=True,
    ),
    "tiny_siglip": dict(
        patch_size=8, embed_dim=48, depth=3, num_heads=2, mlp_ratio=3.7362,
        class_token=False, global_pool="map",
    ),
}  # fmt: skip
_TINY_NORMALIZATION = {"tiny_dinov2_reg4": (IMAGENET_MEAN, IMAGENET_STD)}


def build_vit(model_id: str, img_size: int, act_layer: str | None = None) -> VisionTransformer:
    """A classifier-free ViT (``num_classes=0``) with random init, never downloading."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    if model_id in TINY_VITS:
        return VisionTransformer(
            img_size=img_size, num_classes=0, act_layer=act_layer, **TINY_VITS[model_id]
        )
    return timm.create_model(
        model_id, pretrained=False, num_classes=0, img_size=img_size, act_layer=act_layer
    )


def vit_normalization(model_id: str, vit: nn.Module) -> tuple[tuple[float, ...], ...]:
    """(mean, std) the tower was trained with: timm's pretrained config, SigLIP's 0.5 else."""
    if model_id in TINY_VITS:
        return _TINY_NORMALIZATION.get(model_id, (SIGLIP_MEAN, SIGLIP_STD))
    cfg: Mapping[str, Any] = getattr(vit, "pretrained_cfg", None) or {}
    if "mean" in cfg and "std" in cfg:
        return tuple(cfg["mean"]), tuple(cfg["std"])
    return (SIGLIP_MEAN, SIGLIP_STD) if "siglip" in model_id else (IMAGENET_MEAN, IMAGENET_STD)


class FusedVisionBackbone(nn.Module):
    """Two ViTs on the same image; patch features concatenated channel-wise.

    Attributes:
        featurizer: the DINOv2-like tower (published name ``vision_backbone.featurizer``).
        fused_featurizer: the SigLIP-like tower (``vision_backbone.fused_featurizer``).
        embed_dim: D1 + D2, the fused feature width.
        num_patches: P, patch tokens per image.
        image_size: S, the input resolution of both towers.
    """

    def __init__(
        self,
        model_ids: tuple[str, str],
        image_size: int,
        act_layers: tuple[str | None, str | None] = (None, None),
    ) -> None:
        super().__init__()
        self.featurizer = build_vit(model_ids[0], image_size, act_layers[0])
        self.fused_featurizer = build_vit(model_ids[1], image_size, act_layers[1])
        self.image_size = image_size
        self.embed_dim = self.featurizer.embed_dim + self.fused_featurizer.embed_dim
        self.num_patches = self.featurizer.patch_embed.num_patches
        if self.fused_featurizer.patch_embed.num_patches != self.num_patches:
            raise ValueError(
                f"towers {model_ids} give {self.num_patches} and "
                f"{self.fused_featurizer.patch_embed.num_patches} patches at {image_size} px"
            )
        # Plain tuples, not buffers: a model built on the meta device (to load a checkpoint
        # without a random init) must not end up with buffers the checkpoint cannot fill.
        norms = [vit_normalization(m, v) for m, v in zip(model_ids, self.towers())]
        self.pixel_mean = tuple(c for mean, _ in norms for c in mean)
        self.pixel_std = tuple(c for _, std in norms for c in std)
        for vit in self.towers():
            for module in (vit.blocks[-1], vit.norm, vit.fc_norm, vit.head, vit.attn_pool):
                # attn_pool is None for towers without an attention-pool head.
                if module is not None:
                    module.requires_grad_(False)

    def towers(self) -> tuple[VisionTransformer, VisionTransformer]:
        return self.featurizer, self.fused_featurizer

    def set_normalization(self, towers: Sequence[TowerNormalization]) -> None:
        """Each tower's mean / std as a checkpoint's processor file gives them."""
        self.pixel_mean = tuple(c for tower in towers for c in tower.mean)
        self.pixel_std = tuple(c for tower in towers for c in tower.std)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, S, S) in [0, 1] -> (N, 6, S, S): each tower's normalisation, stacked."""
        mean = images.new_tensor(self.pixel_mean).view(1, 6, 1, 1)
        std = images.new_tensor(self.pixel_std).view(1, 6, 1, 1)
        return (images.repeat(1, 2, 1, 1) - mean) / std

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Fused patch features.

        Args:
            pixel_values: (N, 6, S, S): channels 0-2 for the featurizer, 3-5 for the fused one.

        Returns:
            (N, P, D1 + D2).
        """
        outputs = []
        for vit, pixels in zip(self.towers(), pixel_values.split(3, dim=1)):
            features = vit.forward_intermediates(
                pixels.to(vit.patch_embed.proj.weight.dtype),
                indices=[len(vit.blocks) - 2],
                stop_early=True,
                output_fmt="NLC",
                intermediates_only=True,
            )
            outputs.append(features[0])
        return torch.cat(outputs, dim=2)


class Projector(nn.Module):
    """Fused-feature projector ``fc1 -> GELU -> fc2 -> GELU -> fc3`` (Prismatic "fused-gelu-mlp").

    Maps (N, P, D_vision) to (N, P, D_llm), widening to 4 x D_vision first.
    """

    def __init__(self, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(features)))))


def images_to_float(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (N, H, W, 3) -> float (N, 3, size, size) in [0, 1].

    Resizing is bicubic with anti-aliasing, close to (not bit-identical with) the PIL resize
    of the OpenVLA processor; images already at ``size`` are left untouched.
    """
    x = images.permute(0, 3, 1, 2).float() / 255.0
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
        x = x.clamp(0.0, 1.0)
    return x


OFT_JPEG_QUALITY = 95  # tf.image.encode_jpeg's default, which OFT's evaluation uses


def oft_libero_frames(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (N, H, W, 3) -> uint8 (N, size, size, 3) as OpenVLA-OFT's LIBERO evaluation
    prepares camera frames: a JPEG round trip (its training frames were stored as JPEG), then
    Lanczos-3 with antialias. PIL's codec and resampler, not TensorFlow's: close, not
    bit-identical."""
    from PIL import Image

    out = np.empty((len(images), size, size, 3), dtype=np.uint8)
    for i, frame in enumerate(images):
        encoded = io.BytesIO()
        Image.fromarray(frame).save(encoded, format="JPEG", quality=OFT_JPEG_QUALITY)
        decoded = Image.open(encoded).convert("RGB")
        out[i] = np.asarray(decoded.resize((size, size), Image.LANCZOS))
    return out


def center_crop_resize(images: torch.Tensor, area: float = OFT_CROP_AREA) -> torch.Tensor:
    """Crop the centre ``area`` fraction of each image and resize it back (bilinear).

    Same geometry as ``tf.image.crop_and_resize`` with the normalised box
    ``[(1 - s) / 2, (1 - s) / 2, (1 + s) / 2, (1 + s) / 2]``, ``s = sqrt(area)``, which
    OpenVLA-OFT applies at test time: output pixel ``i`` of ``n`` samples the input at
    ``y = (y1 + i * (y2 - y1) / (n - 1)) * (H - 1)`` in pixel coordinates.

    Args:
        images: (N, C, H, W) float.
        area: kept fraction of the image area, in (0, 1].

    Returns:
        (N, C, H, W).
    """
    check_range("crop area", area, 0, 1, low_open=True)
    n, _, height, width = images.shape
    side = math.sqrt(area)
    lo = (1.0 - side) / 2.0

    def axis(size: int) -> torch.Tensor:
        # Normalised box coordinate of each output sample, mapped to grid_sample's [-1, 1]
        # (align_corners=True: -1 and 1 are the centres of the first and last pixel).
        steps = torch.linspace(0.0, 1.0, size, dtype=torch.float64, device=images.device)
        return (2.0 * (lo + side * steps) - 1.0).to(images.dtype)

    gy, gx = torch.meshgrid(axis(height), axis(width), indexing="ij")
    grid = torch.stack([gx, gy], dim=-1).expand(n, height, width, 2)
    return F.grid_sample(images, grid, mode="bilinear", align_corners=True)
