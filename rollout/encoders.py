"""Video encoders for SRPO trajectory embeddings (their node, ``encode.video``, is in
``embodied_rl/nodes/encode.py``).

An encoder maps a batch of padded episode videos to one vector per episode:
``encode(frames (B, T, H, W, 3) uint8, lengths (B,) int64) -> (B, D) float32``, where frames
at and after ``lengths[b]`` are padding. A length-0 episode (nothing recorded) gets the
all-zero vector, which the SRPO reward treats as an invalid trajectory; every valid episode
gets a non-zero vector.

Encoders are registered in ``embodied_rl.registry.VIDEO_ENCODERS`` (builders ``(options,
device) -> nn.Module``) and built by the worker's model store like any other frozen model; the
``encode.video`` node (``embodied_rl/nodes/encode.py``) calls them. Configure one as::

    models:
      video_encoder: {policy: video_encoder.vjepa2, trainable: false,
                      options: {path: /models/vjepa2-vitg-fpc64-384}}

- ``video_encoder.vjepa2``: V-JEPA 2 (``transformers.VJEPA2Model``), the SRPO paper's encoder;
  local weights only, or a tiny random model for tests.
- ``video_encoder.cheap``: a weight-free, deterministic encoder for CPU runs and tests.

Frame sampling for both follows docs/ALGORITHMS.md ("SRPO"): ``num_frames`` indices spread with
linspace over the valid length, or the valid frames cycled when the episode is shorter.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from embodied_rl.checks import check_fields, options_dataclass
from embodied_rl.data.episode_videos import sample_frame_indices
from embodied_rl.registry import VIDEO_ENCODERS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def sample_clips(frames: torch.Tensor, lengths: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Gather each episode's sampled frames.

    Args:
        frames: (B, T, H, W, 3) uint8.
        lengths: (B,) int64, each in ``[1, T]``.

    Returns:
        (B, num_frames, H, W, 3) uint8.
    """
    index = torch.stack([sample_frame_indices(int(n), num_frames) for n in lengths.tolist()])
    rows = torch.arange(len(frames))[:, None]
    return frames[rows, index.to(frames.device)]


class VideoEncoder(nn.Module, abc.ABC):
    """Frozen video encoder: padded episode videos -> one embedding per episode.

    Subclasses set ``name`` (their registry name) and ``embedding_dim`` and implement
    :meth:`encode_valid` for episodes with at least one frame.
    """

    name: ClassVar[str] = ""
    embedding_dim: int

    def __init__(self) -> None:
        super().__init__()
        # an empty buffer that follows ``.to(device)``, also for encoders without weights
        self.register_buffer("_anchor", torch.empty(0), persistent=False)

    @property
    def device(self) -> torch.device:
        return self._anchor.device

    @abc.abstractmethod
    def encode_valid(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8 with every length in ``[1, T]`` -> (B, D) float32."""

    @torch.no_grad()
    def encode(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Embed padded episode videos.

        Args:
            frames: (B, T, H, W, 3) uint8; frames at and after ``lengths[b]`` are ignored.
            lengths: (B,) int64 valid frames per episode; clipped to ``[0, T]``.

        Returns:
            (B, D) float32 on CPU; all zero exactly for the length-0 episodes.
        """
        if frames.ndim != 5 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise ValueError(
                f"frames must be (B, T, H, W, 3) uint8, got {tuple(frames.shape)} {frames.dtype}"
            )
        lengths = lengths.detach().cpu().long().clamp(0, frames.shape[1])
        out = torch.zeros(len(frames), self.embedding_dim, dtype=torch.float32)
        valid = lengths > 0
        if valid.any():
            rows = valid.nonzero().flatten()
            chunk = frames[rows.to(frames.device)].to(self.device)
            out[rows] = self.encode_valid(chunk, lengths[rows]).float().cpu()
        return out

    def forward(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.encode(frames, lengths)


def _options(cls: type, raw: Mapping[str, Any] | None, name: str) -> Any:
    """Build an options dataclass, naming the unknown keys if there are any."""
    return options_dataclass(cls, raw, name)


# --- cheap built-in encoder ---------------------------------------------------------------


@dataclass
class CheapEncoderOptions:
    """Options of ``video_encoder.cheap``.

    Attributes:
        num_frames: frames sampled per episode.
        grid: frames are average-pooled to ``grid x grid`` cells.
    """

    num_frames: int = 16
    grid: int = 8

    def __post_init__(self) -> None:
        check_fields(self, ("num_frames", "grid"), 1)


class CheapVideoEncoder(VideoEncoder):
    """A weight-free, deterministic encoder for CPU runs.

    Each sampled frame (pixels scaled to [0, 1]) is average-pooled to ``grid x grid`` cells per
    colour channel (a coarse picture of where things are). The embedding concatenates, each
    ``3 * grid * grid`` long, channel-major:

    - *appearance*: the pooled frames averaged over the sampled frames (what the scene looks
      like over the episode);
    - *end state*: the pooled last valid frame (where the objects ended up; it tells a video
      from its time-reversed copy);
    - *motion*: the mean absolute difference of consecutive pooled sampled frames (where and
      how much things moved); pairs that wrap around when a short episode is cycled are
      skipped, and a one-frame episode has motion 0;

    and a constant 1, so no valid episode maps to the all-zero (invalid) vector. The size is
    ``D = 9 * grid**2 + 1``.
    """

    name = "video_encoder.cheap"

    def __init__(self, options: CheapEncoderOptions, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.options = options
        self.embedding_dim = 9 * options.grid**2 + 1
        self.to(device)

    def _pool(self, frames: torch.Tensor) -> torch.Tensor:
        """(..., H, W, 3) uint8 -> (..., 3, grid, grid) float32 cell means in [0, 1]."""
        lead = frames.shape[:-3]
        x = frames.reshape(-1, *frames.shape[-3:]).permute(0, 3, 1, 2).float() / 255.0
        x = F.adaptive_avg_pool2d(x, self.options.grid)
        return x.reshape(*lead, *x.shape[1:])

    def encode_valid(self, frames: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, H, W, 3) uint8, lengths (B,) in [1, T] -> (B, 9 * grid**2 + 1) float32."""
        n = self.options.num_frames
        index = torch.stack([sample_frame_indices(int(x), n) for x in lengths.tolist()])
        rows = torch.arange(len(frames))
        pooled = self._pool(frames[rows[:, None], index.to(frames.device)])  # (B, n, 3, g, g)
        appearance = pooled.mean(dim=1)
        end_state = self._pool(frames[rows, (lengths - 1).to(frames.device)])
        forward_pair = (index[:, 1:] > index[:, :-1]).to(pooled)  # (B, n - 1)
        step = (pooled[:, 1:] - pooled[:, :-1]).abs() * forward_pair[..., None, None, None]
        motion = step.sum(dim=1) / forward_pair.sum(dim=1).clamp(min=1)[:, None, None, None]
        ones = torch.ones(len(frames), 1, device=pooled.device)
        parts = [appearance.flatten(1), end_state.flatten(1), motion.flatten(1), ones]
        return torch.cat(parts, dim=1)


@VIDEO_ENCODERS.register(CheapVideoEncoder.name)
def build_cheap_encoder(options: Mapping[str, Any] | None, device: torch.device | str) -> nn.Module:
    """Registry builder of ``video_encoder.cheap``."""
    return CheapVideoEncoder(_options(CheapEncoderOptions, options, "video_encoder.cheap"), device)


# --- V-JEPA 2 -------------------------------------------------------------------------------


POOLINGS = ("mean", "end", "mean_and_end")


@dataclass
class VJepa2EncoderOptions:
    """Options of ``video_encoder.vjepa2`` (defaults: the SRPO paper's ViT-g/384 setting).

    Attributes:
        path: local directory of a ``VJEPA2Model`` checkpoint (``config.json`` and safetensors,
            e.g. ``facebook/vjepa2-vitg-fpc64-384`` downloaded beforehand); nothing downloads.
        config: instead of ``path``, ``VJEPA2Config`` keyword arguments of a randomly
            initialised model (tiny presets for tests).
        num_frames: frames sampled per episode (64); a multiple of the tubelet size.
        resize_short: the short image side is resized to this (438 for a 384 crop).
        crop_size: side of the centre crop (384); a multiple of the patch size.
        seed: initialisation seed of a random ``config`` model.
        dtype: weights and input dtype (``float32``, ``bfloat16``, ``float16``).
        pooling: how the encoder's tokens become one vector: ``mean`` (all tokens, the SRPO
            paper's choice; ``D`` = hidden size), ``end`` (the tokens of the last tubelet:
            where the episode ended up) or ``mean_and_end`` (both, concatenated; ``2 D``).
    """

    path: str | None = None
    config: dict[str, Any] | None = None
    num_frames: int = 64
    resize_short: int = 438
    crop_size: int = 384
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
        check_fields(self, ("num_frames", "crop_size"), 1)
        if self.resize_short < self.crop_size:
            raise ValueError(
                f"resize_short ({self.resize_short}) must be >= crop_size ({self.crop_size})"
            )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


def preprocess_clips(clips: torch.Tensor, resize_short: int, crop_size: int) -> torch.Tensor:
    """V-JEPA 2 evaluation preprocessing of sampled frames.

    Pixels to [0, 1]; bilinear (antialiased) resize of the short side to ``resize_short``
    (the long side keeps the aspect ratio, rounded); centre crop ``crop_size`` (offset
    ``(size - crop) // 2``); ImageNet mean/std normalisation.

    Args:
        clips: (B, F, H, W, 3) uint8.

    Returns:
        (B, F, 3, crop_size, crop_size) float32, the layout ``VJEPA2Model`` expects.
    """
    b, f, h, w, _ = clips.shape
    x = clips.reshape(b * f, h, w, 3).permute(0, 3, 1, 2).float() / 255.0
    scale = resize_short / min(h, w)
    size = (round(h * scale), round(w * scale))
    if size != (h, w):
        x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    top, left = (size[0] - crop_size) // 2, (size[1] - crop_size) // 2
    x = x[:, :, top : top + crop_size, left : left + crop_size]
    mean = torch.tensor(IMAGENET_MEAN, device=x.device)[:, None, None]
    std = torch.tensor(IMAGENET_STD, device=x.device)[:, None, None]
    x = (x - mean) / std
    return x.reshape(b, f, 3, crop_size, crop_size)


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
    """The clip the encoder is fed must be the one the model was built for: its rotary
    positions assume ``crop_size / patch_size`` patches a side, and a model pretrained on
    ``frames_per_clip`` frames has never seen other clip lengths."""
    where = f"{opts.path}/config.json" if opts.path is not None else "options.config"
    if opts.num_frames % cfg.tubelet_size or opts.crop_size % cfg.patch_size:
        raise ValueError(
            f"num_frames ({opts.num_frames}) must be a multiple of tubelet_size "
            f"({cfg.tubelet_size}) and crop_size ({opts.crop_size}) of patch_size "
            f"({cfg.patch_size})"
        )
    for option, key in (("num_frames", "frames_per_clip"), ("crop_size", "crop_size")):
        if getattr(opts, option) != getattr(cfg, key):
            raise ValueError(
                f"video_encoder.vjepa2: options.{option} is {getattr(opts, option)} but the "
                f"model's {key} is {getattr(cfg, key)} ({where}). Fix: set options.{option}: "
                f"{getattr(cfg, key)}"
            )


@VIDEO_ENCODERS.register(VJepa2VideoEncoder.name)
def build_vjepa2_encoder(
    options: Mapping[str, Any] | None, device: torch.device | str
) -> nn.Module:
    """Registry builder of ``video_encoder.vjepa2`` (imports transformers only when used)."""
    from transformers import VJEPA2Config, VJEPA2Model

    opts: VJepa2EncoderOptions = _options(VJepa2EncoderOptions, options, "video_encoder.vjepa2")
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
    _check_options_fit(opts, model.config)
    encoder = VJepa2VideoEncoder(model, opts).to(device)
    encoder.eval().requires_grad_(False)
    return encoder


# --- node -------------------------------------------------------------------------------------
