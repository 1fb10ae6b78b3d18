"""The clipped policy-gradient core and its aggregation (ALGORITHMS.md, "Policy losses").

Aggregation divides by GLOBAL counts (tokens or sequences over all data-parallel ranks and
micro-batches of one mini-batch), so a mini-batch's loss and gradient do not depend on how it
is split; gradients are then SUMMED across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_LIMIT = 20.0  # clamp before exp so a stale sample cannot overflow the ratio


@dataclass(frozen=True)
class GlobalCounts:
    """Normalisers of one mini-batch over every rank: valid tokens and sequences."""

    tokens: float
    sequences: float


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)``.

    Args:
        logprobs, old_logprobs, advantages: (B, R).

    Returns:
        loss: (B, R) per-token loss; clipped: (B, R) bool, where the clipped term was chosen.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate: k1, k2 or k3 (Schulman's estimators)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        neg = (-log_ratio).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; use one of {KL_ESTIMATORS}")


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, counts: GlobalCounts
) -> torch.Tensor:
    """Reduce per-token ``values`` (B, R) to this rank's share of the global loss.

    ``token-mean``: sum over all valid tokens / global token count.
    ``seq-mean-token-sum``: per-sequence token sum, summed / global sequence count.
    ``seq-mean-token-mean``: per-sequence token mean, summed / global sequence count.
    Summing the results of every rank and micro-batch gives the mini-batch loss.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / max(counts.tokens, 1.0)
    per_seq = (values * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {LOSS_AGG_MODES}")
    return per_seq.sum() / max(counts.sequences, 1.0)
