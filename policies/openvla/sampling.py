"""Categorical action sampling and scoring over the 256 action bins (OpenVLA and OFT's
discrete head): ``act`` samples with :func:`sample_action_index`, ``evaluate`` re-scores the
stored choices with :func:`categorical_scores` under the same tempered distribution, so the
two log-probs of a sampled token agree."""

from __future__ import annotations

import torch


def sample_action_index(
    logits: torch.Tensor, temperature: float, do_sample: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample from ``softmax(logits / temperature)`` (or take the argmax).

    Sampling runs on the CPU with the global CPU generator, so that a rollout seeded with
    ``torch.manual_seed`` is reproducible whatever device the model is on.

    Args:
        logits: (M, 256) float32 action logits.

    Returns:
        index: (M,) int64 position in the action slice; logprob: (M,) float32 its log-prob
        under the tempered distribution (also for greedy decoding).
    """
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    if do_sample:
        index = torch.multinomial(logprobs.exp().cpu(), 1).squeeze(1).to(logits.device)
    else:
        index = logprobs.argmax(dim=-1)
    return index, logprobs.gather(-1, index.unsqueeze(-1)).squeeze(-1)


def categorical_scores(
    logits: torch.Tensor, index: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``index`` (...,) and entropy (...,) under ``softmax(logits (..., V) / t)``."""
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    chosen = logprobs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return chosen, entropy
