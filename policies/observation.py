"""The observation features of the small CPU policies (``mlp``, ``flow_vla``).

A 3-conv image encoder on the agentview image, the normalised proprio and a hashed
bag-of-words instruction embedding, concatenated and passed through a trunk. The functions
read these as attributes of the policy (``image_encoder``, ``instruction``, ``trunk``,
``normalizer``, ``bucket_cache``: a dict, ``NAME``, and ``config.state_dim``,
``config.image_size``, ``config.instruction_buckets``), so each policy keeps its own parameter
names and its checkpoints load as before.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from embodied_rl import keys as K
from embodied_rl.data.batch import strings

_WORD = re.compile(r"[a-z0-9]+")


def image_encoder(size: int) -> tuple[nn.Module, int]:
    """Three stride-2 convolutions: (N, 3, size, size) -> (N, 32 * (size/8)^2)."""
    layers = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    return layers, 32 * (size // 8) ** 2


def instruction_buckets(instruction: str, buckets: int) -> list[int]:
    """Bucket ids of an instruction's words: ``crc32(word) % buckets`` of each lower-cased
    alphanumeric word (deterministic across processes, unlike Python's ``hash``)."""
    return [zlib.crc32(word.encode()) % buckets for word in _WORD.findall(instruction.lower())]


def instruction_features(policy: Any, instructions: Sequence[str]) -> torch.Tensor:
    """(N, instruction_dim) mean embedding of each instruction's word buckets."""
    cache: dict[str, list[int]] = policy.bucket_cache
    ids, offsets = [], []
    for text in instructions:
        if text not in cache:
            cache[text] = instruction_buckets(text, policy.config.instruction_buckets)
        offsets.append(len(ids))
        ids += cache[text]
    device = policy.device
    return policy.instruction(
        torch.tensor(ids, dtype=torch.long, device=device),
        torch.tensor(offsets, dtype=torch.long, device=device),
    )


def observation_features(
    policy: Any,
    images: torch.Tensor | None,
    states: torch.Tensor | None,
    instructions: Sequence[str],
) -> torch.Tensor:
    """Trunk output (N, F) from images (N, H, W, 3) uint8, states (N, S), N instructions."""
    config, parts = policy.config, []
    if config.state_dim > 0:
        parts.append(policy.normalizer.normalize_proprio(states.float().to(policy.device)))
    if policy.image_encoder is not None:
        size = config.image_size
        if images is None or tuple(images.shape[1:]) != (size, size, 3):
            got = None if images is None else tuple(images.shape[1:])
            raise ValueError(
                f"the {policy.NAME} policy has image_size {size} and needs ({size}, {size}, 3) "
                f"images, got {got}; set the simulator's / demos' image_size to {size}"
            )
        pixels = images.to(policy.device).permute(0, 3, 1, 2).float() / 255.0
        parts.append(policy.image_encoder(pixels))
    if policy.instruction is not None:
        parts.append(instruction_features(policy, instructions))
    return policy.trunk(torch.cat(parts, dim=-1))


def step_features(policy: Any, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Trunk features (B*T, F) of every step of trajectories and the step mask (B, T)."""
    mask = batch[K.STEP_MASK].float()
    b, t = mask.shape
    images = states = None
    if policy.config.state_dim > 0:
        states = batch[K.OBS_STATE].reshape(b * t, -1)
    if policy.image_encoder is not None:
        images = batch[K.OBS_IMAGE].reshape(b * t, *batch[K.OBS_IMAGE].shape[2:])
    instructions: list[str] = []
    if policy.instruction is not None:  # step row r belongs to trajectory r // T
        instructions = [text for text in strings(batch, K.PROMPT_TEXT) for _ in range(t)]
    return observation_features(policy, images, states, instructions), mask


def as_tensor(array: np.ndarray | torch.Tensor | None) -> torch.Tensor | None:
    """A numpy array as a tensor (no copy when contiguous); tensors and ``None`` as they are."""
    if array is None or isinstance(array, torch.Tensor):
        return array
    return torch.from_numpy(np.ascontiguousarray(array))
