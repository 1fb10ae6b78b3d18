"""Advantage estimators (docs/ALGORITHMS.md, "Advantage estimators").

Group statistics are computed over whole groups even when a group's samples sit on several
data-parallel ranks: callers pass every rank's (group id, reward) pairs, which are small.
Batch statistics over tokens (REINFORCE++, PPO advantage whitening) are reduced with sums
over the data-parallel group (:func:`whiten_global`), never by gathering tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, arXiv 2402.14740): ``A_i = R_i - mean_{j != i} R_j``.

    With ``G`` samples and group sum ``S``: ``A_i = R_i - (S - R_i)/(G - 1)``. A group of size
    1 has no other sample, so its leave-one-out baseline is 0 and ``A_i = R_i`` (the same
    convention as :func:`group_mean_std`).

    Args:
        rewards: (N,) scalar reward per sample.
        group_ids: (N,) group of each sample.

    Returns:
        (N,) float32 advantage per sample.
    """
    rewards = rewards.float()
    unique, inverse = torch.unique(group_ids, return_inverse=True)
    zeros = torch.zeros(len(unique), device=rewards.device)
    count = zeros.index_add(0, inverse, torch.ones_like(rewards))[inverse]
    total = zeros.index_add(0, inverse, rewards)[inverse]
    others = count - 1
    baseline = torch.where(others > 0, (total - rewards) / others.clamp(min=1), 0.0)
    return rewards - baseline


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Position of the last valid token of each row (B, R) -> (B,); -1 for an empty row."""
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return ((mask > 0).long() * positions).max(dim=-1).values - 1


def place_on_last_token(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A (B, R) float32 tensor holding ``values[i]`` on row i's last valid token, 0 elsewhere.

    A row without valid tokens stays all zero (there is no token to carry its reward).
    """
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = values.float()[rows]
    return out


def discounted_returns(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Return-to-go ``G_t = sum_{l>=0} gamma^l r_{t+l}`` (REINFORCE, Williams 1992).

    Invalid tokens contribute no reward; with right-padded masks (a valid prefix) the sum runs
    over the valid tokens of the row. Computed backwards: ``G_t = r_t + gamma * G_{t+1}``.

    Args:
        token_rewards: (B, R) per-token reward.
        mask: (B, R) 1 = valid token.
        gamma: discount in [0, 1].

    Returns:
        (B, R) float32 returns, 0 on invalid tokens.
    """
    mask = mask.float()
    rewards = token_rewards.float() * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype, device=rewards.device)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask


def whiten_global(
    values: torch.Tensor,
    mask: torch.Tensor,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Whiten ``values`` with the mean and std of the valid entries of the GLOBAL batch.

    The statistics come from one all-reduce of ``[sum x, sum x^2, count]`` (float64) over the
    data-parallel group, so no per-token data is gathered and the result does not depend on
    how the batch is split. ``var`` is the unbiased ``(sum x^2 - n*mean^2)/(n-1)`` (0 for
    n <= 1); the output is ``(x - mean) / sqrt(var + eps)``, plus ``mean`` again when
    ``shift_mean`` is False (scale only).

    Args:
        values: (B, R) e.g. returns or GAE advantages.
        mask: (B, R) 1 = valid entry.
        all_reduce_sum: sums a tensor over the dp group (``ctx.all_reduce_sum``); ``None``
            uses the local batch only.
        shift_mean: subtract the mean (True) or only rescale (False).
        eps: added to the variance.

    Returns:
        (B, R) float32, 0 on invalid entries.
    """
    local = masked_moments(values, mask)
    moments = all_reduce_sum(local) if all_reduce_sum else local
    return whiten_with_moments(values, mask, moments, shift_mean=shift_mean, eps=eps)


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[sum x, sum x^2, count]`` (3,) float64 over the valid entries of ``values`` (B, R).

    Summed over ranks (one all-reduce of 3 numbers) they give the whole batch's statistics
    without moving any token.
    """
    valid = (mask > 0).double()
    x = values.double() * valid
    return torch.stack([x.sum(), (x * x).sum(), valid.sum()])


def whiten_with_moments(
    values: torch.Tensor,
    mask: torch.Tensor,
    moments: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Whiten ``values`` (B, R) with (global) :func:`masked_moments`; 0 on invalid entries."""
    total, total_sq, count = (float(v) for v in moments.double().cpu())
    mean = total / count if count > 0 else 0.0
    var = (total_sq - count * mean * mean) / (count - 1) if count > 1 else 0.0
    whitened = (values.double() - mean) / math.sqrt(max(var, 0.0) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return (whitened * (mask > 0).double()).float()


def subtract_group_mean_at_last_token(
    token_rewards: torch.Tensor, mask: torch.Tensor, group_mean: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline: ``r[i, last_i] -= mean_{group(i)} R`` (arXiv 2501.03262).

    Only the last valid token, the one that carries the scalar reward, is shifted; per-token
    terms such as ``-beta*KL_t`` stay as they are.

    Args:
        token_rewards: (B, R).
        mask: (B, R) 1 = valid token.
        group_mean: (B,) mean scalar reward of each sample's group (0 for a group of one).

    Returns:
        (B, R) float32 shifted token rewards.
    """
    return token_rewards.float() - place_on_last_token(group_mean, mask)


def reinforce_pp_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): globally whitened discounted returns.

    Args:
        token_rewards: (B, R) per-token reward, ``-beta*KL_t`` already folded in.
        mask: (B, R) 1 = valid token.
        gamma: discount.
        all_reduce_sum: sums over the dp group (``ctx.all_reduce_sum``).
        eps: added to the variance.

    Returns:
        (B, R) float32 advantages, 0 on invalid tokens.
    """
    returns = discounted_returns(token_rewards, mask, gamma)
    return whiten_global(returns, mask, all_reduce_sum, eps=eps)
