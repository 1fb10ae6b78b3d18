"""The interface of a frozen video encoder: padded episode videos -> one vector per episode.

Subclasses embed only episodes with at least one frame (:meth:`VideoEncoder.encode_valid`);
:meth:`VideoEncoder.encode` checks the input, clips the lengths and gives the length-0 rows
the all-zero vector that the SRPO reward reads as an invalid trajectory.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch
from torch import nn


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
