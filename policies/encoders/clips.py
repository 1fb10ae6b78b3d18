"""Episode videos -> model input clips: frame sampling and the V-JEPA 2 preprocessing.

The sampling rule (``embodied_rl.data.episode_videos.sample_frame_indices``, docs/ALGORITHMS.md
"SRPO") is the encoders'; :func:`preprocess_clips` is shared by the ``video_encoder.vjepa2``
encoder and the ``world_model.vjepa2`` pretraining model, so a world model is trained on the
pixels it will later embed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embodied_rl.data.episode_videos import sample_frame_indices

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
