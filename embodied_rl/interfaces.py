"""The policy interfaces the core and the rollout nodes program against (docs/ARCHITECTURE.md).

Policies live in ``policies/`` and are never imported by the core; these protocols say what a
policy object built through the registry must provide.

Embodied trajectories reuse the trainer's token keys, so one ``actor.train`` serves LLMs and
VLAs: a trajectory of ``T`` policy steps with ``K`` action tokens per step (``K = chunk * A``
for discrete-token VLAs, ``K = A`` for continuous ones) is flattened to ``R = T * K``:
``OLD_LOGPROBS`` and ``RESPONSE_MASK`` are ``(B, T * K)``, step-major (all tokens of step 0,
then step 1, ...), and the mask is the per-step ``STEP_MASK`` repeated over each step's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from tensordict import TensorDict

from embodied_rl import keys as K


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


ONE_CAMERA = ("agentview",)


def policy_cameras(policy: Any) -> tuple[str, ...]:
    """The cameras a policy reads each step, in the order ``act`` takes them (keys of
    ``keys.CAMERA_KEYS``): ``("agentview",)``, unless the policy says otherwise with a
    ``cameras`` attribute (OpenVLA-OFT with two images: agentview, then wrist)."""
    return tuple(getattr(policy, "cameras", ONE_CAMERA))


def stack_cameras(views: Sequence[Any], axis: int) -> Any:
    """One camera's images as they are; several stacked on a new ``axis`` (numpy or torch):
    e.g. two (N, H, W, 3) -> (N, 2, H, W, 3), the layout ``act`` takes them in."""
    if len(views) == 1:
        return views[0]
    if isinstance(views[0], torch.Tensor):
        return torch.stack(list(views), dim=axis)
    return np.stack(views, axis=axis)


def batch_images(batch: TensorDict, cameras: Sequence[str]) -> torch.Tensor:
    """The images of ``cameras`` in a trajectory batch: (B, T, H, W, 3) for one camera,
    (B, T, V, H, W, 3) for V, in the order given.

    Raises:
        KeyError: a camera's key is missing, naming the setting that records it.
    """
    missing = [c for c in cameras if K.CAMERA_KEYS[c] not in batch.keys()]
    if missing:
        raise KeyError(
            f"the policy reads the {missing} camera(s), but the batch has no "
            f"{[K.CAMERA_KEYS[c] for c in missing]}: record them (data.cameras={list(cameras)} "
            "for demonstrations; a simulator whose options.cameras include them for rollouts)"
        )
    return stack_cameras([batch[K.CAMERA_KEYS[c]] for c in cameras], axis=2)


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
        """Sample actions for N observations: images (N, H, W, 3) uint8 (V cameras, see
        :func:`policy_cameras`: (N, V, H, W, 3)), states (N, S)."""
        ...

    def evaluate(self, batch: TensorDict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, T * K) of the stored actions of trajectories.

        Reads OBS_IMAGE (B, T, H, W, 3), OBS_STATE (B, T, S), PROMPT_TEXT (instructions),
        ACTION_TOKENS (B, T, K) or RAW_ACTIONS (B, T, K) and STEP_MASK (B, T); entries of
        masked steps are 0.
        """
        ...


@runtime_checkable
class DemonstrationPolicy(EmbodiedPolicy, Protocol):
    """An embodied policy that behaviour cloning (``sft.train``) and ``data.demos`` can train.

    Its outputs live in normalised units; a normaliser with persistent buffers (so that
    checkpoints and ``init_from`` carry it) maps them to env actions in ``act`` and back
    (``action_targets``), from statistics set once from the demonstrations.
    """

    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Set the action / proprio statistics: an OpenVLA ``norm_stats`` entry
        ``{"action": {"q01", "q99", "mask"}, "proprio": {...}}``."""
        ...

    def action_targets(self, actions: torch.Tensor) -> tuple[str, torch.Tensor]:
        """The batch key ``evaluate`` scores and its values (N, K) for env actions (N, C, A).

        ACTION_TOKENS (discrete heads: the demo's tokens, so ``-evaluate`` at temperature 1
        is the token cross-entropy) or RAW_ACTIONS (continuous heads: the normalised actions,
        the L1 regression target of ``action_mode``).
        """
        ...

    def action_mode(self, batch: TensorDict) -> torch.Tensor:
        """The most likely output of every step (B, T * K), step-major, 0 on masked steps.

        Continuous heads: the mean, differentiable (L1 loss). Discrete heads: the most likely
        token (as float; token accuracy). Reads what ``evaluate`` reads.
        """
        ...


@runtime_checkable
class BinnedActionPolicy(DemonstrationPolicy, Protocol):
    """A demonstration policy whose discrete head scores ordered action bins (OpenVLA and
    OpenVLA-OFT tokens, the MLP's bins): behaviour cloning can then smooth its targets over
    neighbouring bins (``sft.train``'s ``target_sigma_bins``)."""

    def bin_logprobs(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-softmax at temperature 1 over the action bins of every stored output
        (B, T * K, bins) and the stored outputs' bin positions (B, T * K) int64, step-major,
        0 on masked steps; neighbouring positions are neighbouring action values. Reads what
        ``evaluate`` reads; a head without bins raises ``ValueError``."""
        ...


@runtime_checkable
class FlowMatchingPolicy(DemonstrationPolicy, Protocol):
    """A demonstration policy that generates actions by integrating a learned velocity field
    (``policies/flow_vla``): behaviour cloning regresses the velocity instead of a mean."""

    def flow_matching_loss(self, batch: TensorDict, targets: torch.Tensor) -> torch.Tensor:
        """Elementwise squared velocity error (n, C * A) for the rows' normalised
        demonstrated actions ``targets`` (n, C * A) (``action_targets``), at random flow
        times and noise."""
        ...


class PolicyBuilder(Protocol):
    """What ``embodied_rl.registry.POLICIES`` holds: ``builder(options, device) -> policy``.

    A builder may carry ``architecture_options(options) -> dict``: every option (defaults
    filled in) that fixes what the weights mean (head, chunk, image size, conventions, ...),
    leaving out runtime-only ones (temperature, micro-batch size, seed). ``init_from``
    compares these between the checkpoint's run and the new run; without it, the whole
    options mappings must be equal. It may also carry ``check_options(options, where)``,
    called on the driver before any worker starts (``validate_config``): it raises
    ``ConfigError`` for options that the files they name contradict (e.g. a ``path``
    checkpoint trained with a head the options disable); and ``state_size(options) -> int``,
    the proprio size the policy reads (0: none), checked against the simulator's state; and
    ``cameras(options) -> tuple``, the cameras it reads (:func:`policy_cameras`; without it
    agentview alone), checked against ``data.cameras``.
    """

    def __call__(self, options: Mapping[str, Any], device: torch.device) -> Any: ...


@dataclass
class Exported:
    """What an exporter (``registry.EXPORTERS``) wrote for ``embodied-rl export``, and how
    the folder loads again without the run that trained it.

    Attributes:
        options: the policy options with which its registry builder loads the folder (its
            ``path`` option set to it), or ``None`` when the builder cannot load a folder.
        python: Python code that loads the folder with the policy's own ``from_pretrained``
            (or the library's), or ``None``.
        also: other model entries that load the folder, as ``{purpose: (model name,
            registry name, options)}``, e.g. a pretrained world model as SRPO's
            ``video_encoder``; the model card shows each.
    """

    options: dict[str, Any] | None
    python: str | None = None
    also: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)


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


@dataclass
class TurnResult:
    """What a text environment answers to one model turn.

    Attributes:
        observation: the environment's next message (appended to the conversation through
            the chat template), or ``None`` when the episode is over.
        reward: this turn's reward.
        done: the episode is over (the model gets no further turn).
    """

    observation: str | None
    reward: float
    done: bool


class TextEpisode(Protocol):
    """One episode of a text environment: the model's turns in, observations out."""

    def step(self, response: str) -> TurnResult:
        """The environment's answer to the model's turn (its text, special tokens removed)."""
        ...

    def final_reward(self) -> float:
        """The reward for the whole episode, asked once when it ends (done, turn limit or
        token budget)."""
        ...


class TextEnvironment(Protocol):
    """A multi-turn text environment (registered in ``embodied_rl.registry.TEXT_ENVS``)."""

    def start(self, prompt: str, answer: str) -> TextEpisode:
        """A new episode for a data row (its ``prompt`` opens the conversation; ``answer``
        is the row's ground truth, in the environment's own format)."""
        ...
