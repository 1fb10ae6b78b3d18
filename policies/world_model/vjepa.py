"""``world_model.vjepa2``: a V-JEPA 2 video world model to pretrain (``world_model.train``).

It holds a ``transformers.VJEPA2Model`` (the context encoder and the predictor, trained) and
a *target encoder*, an exponential moving average of the context encoder that gives the
prediction targets (no gradient). ``save_pretrained`` writes a ``VJEPA2Model`` whose encoder
is the target encoder (V-JEPA evaluates that one) and whose predictor is the trained one, in
the Hugging Face layout that ``video_encoder.vjepa2`` loads with ``path=`` exactly as it loads
the published V-JEPA 2 weights; ``embodied-rl export <run> --out DIR`` writes it.

Frames are preprocessed as ``video_encoder.vjepa2`` does for SRPO (``preprocess_clips`` of
``policies/encoders/clips.py``: resize of the short side, centre crop, ImageNet statistics),
so the model is trained on what it will later embed.

Why the encoder is called layer by layer for the context: ``VJEPA2Model.forward`` encodes the
whole clip and masks the encoder's *outputs*, so every output has attended to the masked
tokens and predicting them would be trivial. Here only the context tokens enter the encoder;
their positions go to the rotary attention as ``position_mask``, as V-JEPA does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodied_rl.checks import check_fields, check_range, options_dataclass
from embodied_rl.registry import POLICIES
from policies.encoders.clips import preprocess_clips

NAME = "world_model.vjepa2"


@dataclass
class VJepa2WorldModelOptions:
    """Options of ``world_model.vjepa2``.

    Attributes:
        config: ``VJEPA2Config`` keyword arguments of a randomly initialised model; its
            ``crop_size`` must equal ``crop_size`` and its ``frames_per_clip`` ``num_frames``.
        path: instead, a local ``VJEPA2Model`` directory to continue pretraining from.
        num_frames: frames per clip (a multiple of the tubelet size).
        resize_short / crop_size: preprocessing, as ``video_encoder.vjepa2``'s options.
        seed: initialisation seed of a ``config`` model.
    """

    config: dict[str, Any] | None = None
    path: str | None = None
    num_frames: int = 16
    resize_short: int = 64
    crop_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.path is None) == (self.config is None):
            raise ValueError(f"{NAME} needs exactly one of 'config' (a new model) or 'path'")
        check_fields(self, ("num_frames", "crop_size"), 1)
        check_range("resize_short", self.resize_short, self.crop_size)
        check_range("seed", self.seed, 0)


class VJepa2WorldModel(nn.Module):
    """Context encoder + predictor (trained) and their EMA target encoder.

    Shapes: clips ``(B, F, H, W, 3)`` uint8; pixels ``(B, F, 3, S, S)``; tokens ``(B, N, D)``
    with ``N = F / tubelet * (S / patch)**2`` and ``D`` the hidden size.
    """

    def __init__(self, model: nn.Module, options: VJepa2WorldModelOptions) -> None:
        super().__init__()
        config = model.config
        if (
            options.crop_size != config.crop_size
            or options.num_frames != config.frames_per_clip
            or options.num_frames % config.tubelet_size
        ):
            raise ValueError(
                f"{NAME}: crop_size {options.crop_size} must equal the model's crop_size "
                f"{config.crop_size} (the rotary positions use it) and num_frames "
                f"{options.num_frames} its frames_per_clip {config.frames_per_clip} (the "
                f"export says so to video_encoder.vjepa2), a multiple of its tubelet_size "
                f"{config.tubelet_size}; set the options to the model's"
            )
        if options.crop_size % config.patch_size:
            raise ValueError(
                f"{NAME}: crop_size {options.crop_size} must be a multiple of patch_size "
                f"{config.patch_size}"
            )
        self.options = options
        self.online = model
        self.target = copy.deepcopy(model.encoder).requires_grad_(False)

    @property
    def depth(self) -> int:
        """Token positions along time, ``F / tubelet``."""
        return self.options.num_frames // self.online.config.tubelet_size

    @property
    def grid(self) -> int:
        """Token positions along each image side, ``S / patch``."""
        return self.options.crop_size // self.online.config.patch_size

    def pixels(self, clips: torch.Tensor) -> torch.Tensor:
        """(B, F, H, W, 3) uint8 -> (B, F, 3, S, S) float32, as ``video_encoder.vjepa2``."""
        opts = self.options
        return preprocess_clips(clips.to(self.online.device), opts.resize_short, opts.crop_size)

    def context_tokens(self, pixels: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        """Encode only the context tokens: (B, F, 3, S, S), ids (N_c,) -> (B, N_c, D)."""
        encoder = self.online.encoder
        tokens = encoder.embeddings(pixels)  # (B, N, D)
        ids = context_ids.to(tokens.device).expand(len(tokens), -1)  # (B, N_c)
        hidden = torch.gather(tokens, 1, ids[..., None].expand(-1, -1, tokens.shape[-1]))
        for layer in encoder.layer:
            hidden = layer(hidden, ids)[0]
        return encoder.layernorm(hidden)

    def predict(
        self, context: torch.Tensor, context_ids: torch.Tensor, target_ids: torch.Tensor
    ) -> torch.Tensor:
        """Latents of the target tokens from the context: (B, N_c, D) -> (B, N_t, D)."""
        batch, _, width = context.shape
        total = self.depth * self.grid * self.grid
        # The predictor gathers the context from a full-length sequence itself.
        full = context.new_zeros(batch, total, width)
        c_ids = context_ids.to(context.device).expand(batch, -1)
        full = full.scatter(1, c_ids[..., None].expand(-1, -1, width), context)
        t_ids = target_ids.to(context.device).expand(batch, -1)
        return self.online.predictor(
            full, context_mask=[c_ids], target_mask=[t_ids]
        ).last_hidden_state

    @torch.no_grad()
    def target_tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """The EMA target encoder's outputs for whole clips: (B, F, 3, S, S) -> (B, N, D)."""
        return self.target(pixels).last_hidden_state

    @torch.no_grad()
    def update_target(self, momentum: float) -> None:
        """``target <- momentum * target + (1 - momentum) * online encoder``."""
        check_range("momentum", momentum, 0.0, 1.0)
        online = list(self.online.encoder.parameters())
        target = list(self.target.parameters())
        torch._foreach_mul_(target, momentum)
        torch._foreach_add_(
            target, [p.detach().to(t.dtype) for p, t in zip(online, target)], alpha=1.0 - momentum
        )

    def exported_model(self) -> nn.Module:
        """A ``VJEPA2Model``: the target encoder and the trained predictor (a copy)."""
        model = copy.deepcopy(self.online).cpu()
        model.encoder.load_state_dict(self.target.state_dict())
        return model

    def save_pretrained(self, folder: str | Path) -> None:
        """The Hugging Face layout ``video_encoder.vjepa2`` reads with ``path=folder``."""
        self.exported_model().save_pretrained(folder, safe_serialization=True)


@POLICIES.register(NAME)
def build_vjepa2_world_model(
    options: Mapping[str, Any] | None, device: torch.device | str
) -> VJepa2WorldModel:
    """Registry builder of ``world_model.vjepa2`` (imports transformers only when used)."""
    from transformers import VJEPA2Config, VJEPA2Model

    opts = options_dataclass(VJepa2WorldModelOptions, options, NAME)
    if opts.path is not None:
        model = VJEPA2Model.from_pretrained(opts.path, local_files_only=True, use_safetensors=True)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(opts.seed)
            model = VJEPA2Model(VJEPA2Config(**opts.config))
    return VJepa2WorldModel(model, opts).to(device)
