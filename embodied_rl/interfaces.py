"""The policy interfaces the core and the rollout nodes program against (DESIGN.md section 4).

Policies live in ``policies/`` and are never imported by the core; these protocols say what a
policy object built through the registry must provide.

Embodied trajectories reuse the trainer's token keys, so one ``actor.train`` serves LLMs and
VLAs: a trajectory of ``T`` policy steps with ``K`` action tokens per step (``K = chunk * A``
for discrete-token VLAs, ``K = A`` for continuous ones) is flattened to ``R = T * K``:
``OLD_LOGPROBS`` and ``RESPONSE_MASK`` are ``(B, T * K)``, step-major (all tokens of step 0,
then step 1, ...), and the mask is the per-step ``STEP_MASK`` repeated over each step's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from tensordict import TensorDict


@dataclass
class ActOutput:
    """What an embodied policy returns for one batch of observations.

    Attributes:
        actions: (N, chunk, A) float32 actions in the environment's units (de-normalised),
            executed one after another (chunk = 1 for single-step policies).
        tokens: (N, K) int64 the sampled action tokens (discrete policies), or ``None``.
        raw_actions: (N, K) float32 the sampled pre-squash values (continuous policies), or
            ``None``; whatever ``evaluate`` needs to score the same sample again.
        logprobs: (N, K) float32 log-probability of each sampled token / action dimension.
        values: (N,) float32 critic value of the observation, when the policy has a value head.
    """

    actions: np.ndarray
    tokens: torch.Tensor | None
    raw_actions: torch.Tensor | None
    logprobs: torch.Tensor
    values: torch.Tensor | None = None


@runtime_checkable
class EmbodiedPolicy(Protocol):
    """A VLA or MLP policy usable by ``rollout.env`` and ``actor.train``."""

    tokens_per_step: int  # K

    def act(
        self,
        images: np.ndarray | None,
        instructions: Sequence[str],
        states: np.ndarray | None,
        *,
        temperature: float,
        do_sample: bool,
    ) -> ActOutput:
        """Sample actions for N observations: images (N, H, W, 3) uint8, states (N, S)."""
        ...

    def evaluate(self, batch: TensorDict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, T * K) of the stored actions of trajectories.

        Reads OBS_IMAGE (B, T, H, W, 3), OBS_STATE (B, T, S), PROMPT_TEXT (instructions),
        ACTION_TOKENS (B, T, K) or RAW_ACTIONS (B, T, K) and STEP_MASK (B, T); entries of
        masked steps are 0.
        """
        ...


@runtime_checkable
class LanguagePolicy(Protocol):
    """A causal LM usable by ``rollout.llm`` and ``actor.train``."""

    tokenizer: object

    def generate(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, **sampling: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Responses (B, R) and their mask (B, R) for left-padded prompts (B, P)."""
        ...

    def evaluate(self, batch: TensorDict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, R) of the stored responses."""
        ...
