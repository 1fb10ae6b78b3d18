"""The V-JEPA objective (docs/ALGORITHMS.md, "World-model pretraining"): masks and loss.

A clip is cut into ``D x G x G`` tokens (``D = frames / tubelet``, ``G = crop / patch``),
numbered ``d * G * G + h * G + w`` as ``VJEPA2Model`` numbers them. V-JEPA masks *tubes*: a
few spatial rectangles, each repeated over every time step, so the target cannot be copied
from the same place in a neighbouring frame. The context encoder sees the other tokens; the
predictor predicts the target tokens' latents from them; the targets are the EMA target
encoder's outputs for the whole clip; the loss is their L1 distance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embodied_rl.checks import check_range


@dataclass(frozen=True)
class TubeMaskConfig:
    """How the target tubes are drawn.

    Attributes:
        num_blocks: rectangles per mask (their union is masked).
        block_scale: each rectangle's area as a fraction of the frame (V-JEPA: 0.15 for its
            8 short-range blocks).
        aspect_ratio: the range of a rectangle's height / width, drawn log-uniformly.
    """

    num_blocks: int = 4
    block_scale: float = 0.15
    aspect_ratio: tuple[float, float] = (0.75, 1.5)

    def __post_init__(self) -> None:
        check_range("num_blocks", self.num_blocks, 1)
        check_range("block_scale", self.block_scale, 0.0, 1.0, low_open=True)
        low, high = self.aspect_ratio
        if not 0 < low <= high:
            raise ValueError(
                f"aspect_ratio must be (low, high) with 0 < low <= high, got {self.aspect_ratio}"
            )


def _rectangle(grid: int, config: TubeMaskConfig, generator: torch.Generator) -> torch.Tensor:
    """(grid, grid) bool, one rectangle of about ``block_scale`` of the frame."""
    u = torch.rand(3, generator=generator).tolist()
    low, high = (math.log(r) for r in config.aspect_ratio)
    ratio = math.exp(low + (high - low) * u[0])
    area = config.block_scale * grid * grid
    height = min(grid, max(1, round(math.sqrt(area * ratio))))
    width = min(grid, max(1, round(math.sqrt(area / ratio))))
    top = int(u[1] * (grid - height + 1))
    left = int(u[2] * (grid - width + 1))
    out = torch.zeros(grid, grid, dtype=torch.bool)
    out[top : top + height, left : left + width] = True
    return out


def tube_mask(
    depth: int, grid: int, config: TubeMaskConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context and target token ids of one clip.

    The spatial mask is the union of ``num_blocks`` rectangles, kept only if it leaves at least
    one spatial position visible (redrawn otherwise, then one cell is freed as a last resort),
    and repeated over all ``depth`` time steps.

    Returns:
        context ids ``(N_c,)`` and target ids ``(N_t,)``, int64, ascending, disjoint, together
        ``range(depth * grid * grid)``; ``N_c, N_t >= depth``.
    """
    check_range("depth", depth, 1)
    check_range("grid", grid, 1)
    if grid * grid < 2:
        raise ValueError(
            "a tube mask needs at least 2 spatial tokens (crop_size >= 2 * patch_size)"
        )
    for _ in range(10):
        masked = torch.zeros(grid, grid, dtype=torch.bool)
        for _ in range(config.num_blocks):
            masked |= _rectangle(grid, config, generator)
        if not masked.all():
            break
    else:
        masked[-1, -1] = False
    spatial = masked.flatten()
    per_frame = grid * grid
    ids = torch.arange(depth * per_frame)
    is_target = spatial[ids % per_frame]
    return ids[~is_target], ids[is_target]


def latent_l1(predicted: torch.Tensor, target: torch.Tensor, total_rows: float) -> torch.Tensor:
    """This micro-batch's share of the batch's mean L1 latent error.

    Args:
        predicted / target: ``(n, N_t, D)``, the predictor's and the target encoder's latents
            of the target tokens (the target without gradient).
        total_rows: clips in the whole batch over all ranks (every clip has the same ``N_t``
            and ``D``, so the batch mean is the sum of per-clip means over ``total_rows``).

    Returns:
        scalar: ``sum_i mean|predicted_i - target_i| / total_rows``.
    """
    per_clip = (predicted - target.detach()).abs().mean(dim=(1, 2))
    return per_clip.sum() / total_rows
