"""Behaviour-cloning losses (supervised fine-tuning on demonstrations).

- Discrete action heads (OpenVLA tokens, the MLP's bins): token cross-entropy, ``-log p`` of
  each demonstrated action token at temperature 1, exactly what ``policy.evaluate`` scores;
  OpenVLA (arXiv 2406.09246) trains with this next-token loss on the action tokens.
  Optionally against a discretised Gaussian around the demonstrated bin instead of the bin
  alone (the HL-Gauss classification loss of Farebrother et al., arXiv 2403.03950): the bins
  are ordered action values, and a one-hot target treats a neighbouring bin as wrong as the
  far end of the range, so a one-demo policy's distribution is a spike with unshaped tails.
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


def gaussian_bin_targets(index: torch.Tensor, num_bins: int, sigma: float) -> torch.Tensor:
    """Discretised Gaussian target distributions (..., num_bins) around bin positions (...,).

    Bin ``j`` covers ``[j - 0.5, j + 0.5)`` and gets the mass of ``N(index, sigma^2)`` on it;
    the mass beyond the end bins is dropped and the rest renormalised, so an edge target (a
    gripper at exactly -1 or 1) keeps its mode on the edge. ``sigma`` is in bins (> 0).
    """
    edges = torch.arange(num_bins + 1, device=index.device, dtype=torch.float32) - 0.5
    cdf = torch.special.ndtr((edges - index.unsqueeze(-1).float()) / sigma)
    mass = cdf[..., 1:] - cdf[..., :-1]
    return mass / mass.sum(dim=-1, keepdim=True)


def smoothed_token_cross_entropy(
    bin_logprobs: torch.Tensor,
    index: torch.Tensor,
    sigma: float,
    mask: torch.Tensor,
    counts: GlobalCounts,
) -> torch.Tensor:
    """This shard's share of ``-sum_j q_j log p_j`` per valid token / global valid tokens,
    ``q`` the :func:`gaussian_bin_targets` around each demonstrated bin.

    Args:
        bin_logprobs: (B, R, num_bins) log-softmax over the action bins (temperature 1).
        index: (B, R) int64 the demonstrated bins.
        sigma: the targets' standard deviation in bins (> 0).
        mask: (B, R) 1 = a real (not padded) action token.
        counts: the batch's global counts (``tokens``).
    """
    targets = gaussian_bin_targets(index, bin_logprobs.shape[-1], sigma)
    return aggregate(-(targets * bin_logprobs).sum(dim=-1), mask, "token-mean", counts)


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
