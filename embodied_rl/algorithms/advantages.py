"""Advantage estimators (ALGORITHMS.md, "Advantage estimators").

Group statistics are computed over whole groups even when a group's samples sit on several
data-parallel ranks: callers pass every rank's (group id, reward) pairs, which are small.
"""

from __future__ import annotations

import torch


def group_mean_std(
    rewards: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample mean, std (unbiased) and size of the sample's group.

    Args:
        rewards: (N,) float.
        group_ids: (N,) int64.

    Returns:
        mean, std, count: each (N,). A group of size 1 gets mean 0 and std 1 (so its
        advantage is its raw reward, as in the GRPO reference implementations).
    """
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    count = torch.zeros(len(unique), dtype=rewards.dtype).index_add_(
        0, inverse, torch.ones_like(rewards)
    )
    total = torch.zeros(len(unique), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    mean = total / count
    sq_dev = (rewards - mean[inverse]) ** 2
    var = torch.zeros(len(unique), dtype=rewards.dtype).index_add_(0, inverse, sq_dev)
    std = torch.sqrt(var / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[inverse], std[inverse], count[inverse]


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO: ``A_i = (R_i - mean_G R) / (std_G R + eps)``; Dr. GRPO drops the std division.

    Args:
        rewards: (N,) scalar reward per sample.
        group_ids: (N,) group of each sample (same prompt / same task and init state).

    Returns:
        (N,) advantage per sample (broadcast over tokens by the caller).
    """
    mean, std, _ = group_mean_std(rewards.float(), group_ids)
    centred = rewards.float() - mean
    if not norm_by_std:
        return centred
    # A group with equal rewards has centred == 0 and std == 0: its advantage is 0, not 0/0.
    return torch.where(centred == 0, torch.zeros_like(centred), centred / (std + eps))
