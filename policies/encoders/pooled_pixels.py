"""``video_encoder.cheap``: a weight-free, deterministic pooled-pixel encoder for CPU runs.

It needs no weights and no download, so SRPO runs on CPU get a trajectory embedding from the
frames alone; it is the ``video_encoder`` model of ``configs/srpo_reach.yaml`` and
``configs/srpo_libero.yaml`` (``srpo_pooled_pixels`` in scripts/bench/srpo_world_model.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embodied_rl.checks import check_fields, options_dataclass
from embodied_rl.data.episode_videos import sample_frame_indices
from embodied_rl.registry import VIDEO_ENCODERS
from policies.encoders.base import VideoEncoder


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
    opts = options_dataclass(CheapEncoderOptions, options, CheapVideoEncoder.name)
    return CheapVideoEncoder(opts, device)
