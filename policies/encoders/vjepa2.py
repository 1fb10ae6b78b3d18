"""``video_encoder.vjepa2``: V-JEPA 2 (``transformers.VJEPA2Model``), the SRPO paper's encoder.

Weights load from a local directory only (published V-JEPA 2 weights downloaded beforehand,
or ``embodied-rl export`` of a ``world_model.vjepa2`` pretraining run); a ``config`` instead
builds a tiny random model for tests. transformers is imported only when one is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodied_rl.checks import check_range, options_dataclass
from embodied_rl.registry import VIDEO_ENCODERS
from policies.encoders.base import VideoEncoder
from policies.encoders.clips import preprocess_clips, sample_clips

POOLINGS = ("mean", "end", "mean_and_end")


@dataclass
class VJepa2EncoderOptions:
    """Options of ``video_encoder.vjepa2``; the clip's shape defaults to the model's own.

    The published models (``facebook/vjepa2-*``, ``config.json`` values): ``vitl-fpc64-256``
    (hidden 1024, 24 layers), ``vith-fpc64-256`` (1280, 32), ``vitg-fpc64-256`` and
    ``vitg-fpc64-384`` (1408, 40; the SRPO paper's is the 384 one), all with patch 16, tubelet
    2 and 64 frames per clip; the defaults give 64 frames, the model's crop and its resize.

    Attributes:
        path: local directory of a ``VJEPA2Model`` checkpoint (``config.json`` and safetensors,
            e.g. ``facebook/vjepa2-vitg-fpc64-384`` downloaded beforehand); nothing downloads.
        config: instead of ``path``, ``VJEPA2Config`` keyword arguments of a randomly
            initialised model (tiny presets for tests).
        num_frames: frames sampled per episode, a multiple of the tubelet size; ``None``: the
            model's ``frames_per_clip`` (64 for every published V-JEPA 2). Another count is
            allowed: the temporal positions are rotary, and SRPO samples whole episodes.
        resize_short: the short image side is resized to this; ``None``: ``crop_size * 256 /
            224`` rounded down (V-JEPA 2's evaluation resize: 438 for a 384 crop, 292 for 256).
        crop_size: side of the centre crop; ``None``: the model's ``crop_size`` (256 or 384
            for the published models), which is also the only value allowed: the spatial
            positions and the patch grid were trained at it.
        seed: initialisation seed of a random ``config`` model.
        dtype: weights and input dtype (``float32``, ``bfloat16``, ``float16``).
        pooling: how the encoder's tokens become one vector: ``mean`` (all tokens, the SRPO
            paper's choice; ``D`` = hidden size), ``end`` (the tokens of the last tubelet:
            where the episode ended up) or ``mean_and_end`` (both, concatenated; ``2 D``).
    """

    path: str | None = None
    config: dict[str, Any] | None = None
    num_frames: int | None = None
    resize_short: int | None = None
    crop_size: int | None = None
    seed: int = 0
    dtype: str = "float32"
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"video_encoder.vjepa2: pooling must be one of {', '.join(POOLINGS)}, "
                f"got {self.pooling!r}. Fix: set options.pooling to one of them"
            )
        if (self.path is None) == (self.config is None):
            raise ValueError("video_encoder.vjepa2 needs exactly one of 'path' or 'config'")
        check_range("seed", self.seed, 0)
        for name in ("num_frames", "crop_size", "resize_short"):
            check_range(name, getattr(self, name), 1, note=" or null (the model's own)")
        if None not in (self.resize_short, self.crop_size) and self.resize_short < self.crop_size:
            raise ValueError(
                f"resize_short ({self.resize_short}) must be >= crop_size ({self.crop_size})"
            )

    def for_model(self, cfg: Any) -> VJepa2EncoderOptions:
        """These options with the ``None`` ones taken from the model's config (see above)."""
        crop = cfg.crop_size if self.crop_size is None else self.crop_size
        return replace(
            self,
            num_frames=cfg.frames_per_clip if self.num_frames is None else self.num_frames,
            crop_size=crop,
            resize_short=crop * 256 // 224 if self.resize_short is None else self.resize_short,
        )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


class VJepa2VideoEncoder(VideoEncoder):
    """V-JEPA 2 encoder: sampled, preprocessed frames -> token outputs pooled to one vector.

    Only the encoder runs (``skip_predictor=True``). ``options.pooling`` picks the tokens that
    are averaged (see :class:`VJepa2EncoderOptions`); the vector has the model's hidden size
    (1408 for ViT-g), twice that for ``mean_and_end``.
    """

    name = "video_encoder.vjepa2"

    def __init__(self, model: nn.Module, options: VJepa2EncoderOptions) -> None:
        super().__init__()
        self.model = model
        self.options = options
        width = 2 if options.pooling == "mean_and_end" else 1
        self.embedding_dim = width * int(model.config.hidden_size)

    def encode_valid(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8, lengths (B,) in [1, T] -> (B, embedding_dim) float32."""
        opts = self.options
        clips = sample_clips(frames, lengths, opts.num_frames)
        pixels = preprocess_clips(clips, opts.resize_short, opts.crop_size)
        dtype = next(self.model.parameters()).dtype
        out = self.model(pixel_values_videos=pixels.to(dtype), skip_predictor=True)
        return pool_tokens(out.last_hidden_state.float(), self.model.config, opts.pooling)


def pool_tokens(tokens: torch.Tensor, cfg: Any, pooling: str) -> torch.Tensor:
    """(B, N, D) encoder tokens -> (B, D) (``mean``, ``end``) or (B, 2 D) (``mean_and_end``).

    The patch embedding flattens (time, height, width) with time outermost, so the last
    tubelet's tokens are the last ``(crop_size // patch_size) ** 2``.
    """
    everything = tokens.mean(dim=1)
    if pooling == "mean":
        return everything
    per_tubelet = (cfg.crop_size // cfg.patch_size) ** 2
    end = tokens[:, -per_tubelet:].mean(dim=1)
    return end if pooling == "end" else torch.cat([everything, end], dim=1)


def _check_model_folder(folder: Path) -> None:
    """A V-JEPA 2 directory must exist and hold ``config.json`` and safetensors weights."""
    fix = (
        "point options.path at a VJEPA2Model directory (published V-JEPA 2 weights downloaded "
        "beforehand, or `embodied-rl export` of a pretrain_vjepa_libero run)"
    )
    if not folder.is_dir():
        raise ValueError(f"video_encoder.vjepa2: {folder} is not a directory. Fix: {fix}")
    if not (folder / "config.json").is_file():
        raise ValueError(f"video_encoder.vjepa2: {folder / 'config.json'} is missing. Fix: {fix}")
    if not any(folder.glob("*.safetensors")):
        raise ValueError(
            f"video_encoder.vjepa2: {folder} holds no *.safetensors weights. Fix: {fix}"
        )


def _check_options_fit(opts: VJepa2EncoderOptions, cfg: Any) -> None:
    """The frames the encoder is fed must fit the model: whole tubelets, and the crop it was
    trained at (its spatial positions assume ``crop_size / patch_size`` patches a side)."""
    where = f"{opts.path}/config.json" if opts.path is not None else "options.config"
    if opts.num_frames % cfg.tubelet_size:
        raise ValueError(
            f"video_encoder.vjepa2: num_frames ({opts.num_frames}) must be a multiple of the "
            f"model's tubelet_size ({cfg.tubelet_size}). Fix: set options.num_frames to one, "
            f"or null ({cfg.frames_per_clip}, its frames_per_clip)"
        )
    if opts.crop_size != cfg.crop_size:
        raise ValueError(
            f"video_encoder.vjepa2: options.crop_size is {opts.crop_size} but the model's "
            f"crop_size is {cfg.crop_size} ({where}). Fix: set options.crop_size: "
            f"{cfg.crop_size}, or null"
        )


@VIDEO_ENCODERS.register(VJepa2VideoEncoder.name)
def build_vjepa2_encoder(
    options: Mapping[str, Any] | None, device: torch.device | str
) -> nn.Module:
    """Registry builder of ``video_encoder.vjepa2`` (imports transformers only when used)."""
    from transformers import VJEPA2Config, VJEPA2Model

    opts = options_dataclass(VJepa2EncoderOptions, options, VJepa2VideoEncoder.name)
    dtype = getattr(torch, opts.dtype)
    if opts.path is not None:
        _check_model_folder(Path(opts.path).expanduser())
        model = VJEPA2Model.from_pretrained(
            opts.path, local_files_only=True, use_safetensors=True, dtype=dtype
        )
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(opts.seed)
            model = VJEPA2Model(VJEPA2Config(**opts.config)).to(dtype)
    opts = opts.for_model(model.config)
    _check_options_fit(opts, model.config)
    encoder = VJepa2VideoEncoder(model, opts).to(device)
    encoder.eval().requires_grad_(False)
    return encoder
