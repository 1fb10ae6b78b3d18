"""The logits processors of :meth:`CausalLMPolicy.generate`: constrained decoding, then
temperature and top-p.

A module of its own because :class:`AllowedTokensLogitsProcessor` subclasses a
``transformers`` class: only generating imports it, so importing ``policies`` stays free of
transformers (every worker process and CLI call imports ``policies``).

Shapes: ``B`` samples, ``V`` vocabulary entries.
"""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)


class AllowedTokensLogitsProcessor(LogitsProcessor):
    """Constrained decoding: every token outside ``allowed_ids`` gets logit ``-inf``.

    Like OpenVLA's action-token slice of the vocabulary, this makes the policy a
    distribution over a small set (e.g. the ten digits and EOS). A random-init tiny LM can
    then learn a task such as arithmetic with RL in minutes, because it does not have to
    discover which of 150k tokens are even meaningful. It must run before temperature and
    top-p so that nucleus sampling sees the restricted distribution, the one ``evaluate``
    scores.
    """

    def __init__(self, allowed_ids: torch.Tensor) -> None:
        self.allowed_ids = allowed_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        """Mask ``scores`` (B, V) outside the allowed set; ``input_ids`` is unused."""
        ids = self.allowed_ids.to(scores.device)
        restricted = torch.full_like(scores, float("-inf"))
        restricted[:, ids] = scores[:, ids]
        return restricted


def logits_processors(
    allowed_ids: torch.Tensor | None, temperature: float, top_p: float, do_sample: bool
) -> LogitsProcessorList:
    """The processors in the order ``evaluate`` assumes: allowed tokens, temperature, top-p.

    Args:
        allowed_ids: (K,) int64 token ids the policy may emit, or ``None`` for all.
        temperature: softmax temperature (applied when sampling and not 1).
        top_p: nucleus mass (applied when sampling and below 1).
        do_sample: sample (True) or decode greedily (False: only the restriction applies).
    """
    processors = LogitsProcessorList()
    if allowed_ids is not None:
        processors.append(AllowedTokensLogitsProcessor(allowed_ids))
    if do_sample:
        if temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            processors.append(TopPLogitsWarper(top_p))
    return processors
