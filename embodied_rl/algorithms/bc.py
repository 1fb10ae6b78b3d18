"""Behaviour-cloning losses (supervised fine-tuning on demonstrations).

- Discrete action heads (OpenVLA tokens, the MLP's bins): token cross-entropy, ``-log p`` of
  each demonstrated action token at temperature 1, exactly what ``policy.evaluate`` scores;
  OpenVLA (arXiv 2406.09246) trains with this next-token loss on the action tokens.
- Continuous heads (OpenVLA-OFT's L1-regression head, the MLP's Gaussian mean): the L1
  distance between the predicted mean and the normalised demonstrated action, as OpenVLA-OFT
  (arXiv 2502.19645) trains its continuous head.

Both are token means over the GLOBAL count of valid (unpadded) action tokens of the batch,
so the loss and its gradient do not depend on the data-parallel size or micro-batching (the
trainer sums the shares of every rank and micro-batch).
"""

from __future__ import annotations

import torch

from embodied_rl.algorithms.losses import GlobalCounts, aggregate


def token_cross_entropy(
    logprobs: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts
) -> torch.Tensor:
    """This shard's share of ``-sum(log p * mask) / global valid tokens``.

    Args:
        logprobs: (B, R) log-probabilities of the demonstrated tokens (temperature 1).
        mask: (B, R) 1 = a real (not padded) action token.
        counts: the batch's global counts (``tokens``).
    """
    return aggregate(-logprobs, mask, "token-mean", counts)


def l1_regression(
    prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts
) -> torch.Tensor:
    """This shard's share of ``sum(|prediction - target| * mask) / global valid tokens``.

    Args:
        prediction: (B, R) the head's mean, normalised units.
        target: (B, R) the normalised demonstrated actions.
        mask: (B, R) 1 = a real (not padded) action dimension.
        counts: the batch's global counts (``tokens``).
    """
    return aggregate((prediction - target.to(prediction.dtype)).abs(), mask, "token-mean", counts)


def flow_matching_regression(
    squared_error: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts
) -> torch.Tensor:
    """This shard's share of ``sum(|u - (a - eps)|^2 * mask) / global valid tokens``: the
    flow-matching loss, squared_error (B, R) from the policy, normalised like the L1 loss."""
    return aggregate(squared_error, mask.to(squared_error.dtype), "token-mean", counts)


def token_accuracy(
    predicted: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, counts: GlobalCounts
) -> torch.Tensor:
    """This shard's share of the fraction of valid tokens whose most likely token is the
    demonstrated one (no gradient)."""
    hits = (predicted.round().long() == target.long()).float()
    return aggregate(hits, mask, "token-mean", counts).detach()
