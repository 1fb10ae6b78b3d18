"""What the VLA policies share: the LM input sequence, statistics, checkpoints and the
micro-batching of ``evaluate``, ``values`` and ``action_mode`` (:class:`VLAPolicyBase`).

Input sequence of one observation (OpenVLA's layout: image tokens right after BOS)::

    [BOS] [P image tokens] [proprio token (OFT, optional)] [prompt tokens ... "▁"] [suffix]

With two cameras (OFT's ``num_images_in_input: 2``) each image goes through the vision towers
and projector alone, and the 2 x P tokens follow BOS, agentview's first, then the wrist's (the
published layout, whose towers split the channel-stacked images and concatenate the patches).

The prompt block is left-padded (``prompt.py``), so the image tokens and the suffix (action
tokens) sit at the same index in every row. Padding is masked out and positions count real
tokens only, so every row computes exactly what it would alone.

Shapes: ``N`` observations, ``P`` image tokens, ``T`` prompt tokens, ``D`` LM width.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.interfaces import ONE_CAMERA
from policies.normalization import Normalizer, select_statistics
from policies.openvla.configuration import ACTION_DIM, VLAOptions
from policies.openvla.loading import save_checkpoint
from policies.openvla.prismatic import PrismaticVLA
from policies.openvla.prompt import PromptEncoder
from policies.openvla.steps import StepInputs
from policies.openvla.vision import center_crop_resize, images_to_float, oft_libero_frames

if TYPE_CHECKING:  # type only: importing ``policies`` must not import transformers
    from transformers import PreTrainedTokenizerBase


class VLAPolicyBase(nn.Module, abc.ABC):
    """Inputs, statistics and ``evaluate``'s batching shared by the VLA policies.

    Subclasses set ``tokens_per_step``, ``chunk`` and ``score_key`` (the stored field
    ``evaluate`` scores) and implement ``score_steps`` and ``mode_steps``; OFT adds a proprio
    token via ``extra_prefix``.

    Attributes:
        normalizer: :class:`policies.normalization.Normalizer` (persistent statistics buffers:
            normalised outputs -> env actions, env actions -> training targets, proprio).
        statistics_name: the dataset name the statistics are saved under.
    """

    tokens_per_step: int
    chunk: int = 1
    score_key: str = K.ACTION_TOKENS
    cameras: tuple[str, ...] = ONE_CAMERA  # interfaces.policy_cameras

    def __init__(
        self,
        vla: PrismaticVLA,
        tokenizer: PreTrainedTokenizerBase,
        options: VLAOptions,
        norm_stats: Mapping[str, Any] | None,
    ) -> None:
        super().__init__()
        self.vla = vla
        self.tokenizer = tokenizer
        self.prompts = PromptEncoder(tokenizer)
        self.options = options
        self.normalizer = Normalizer(
            ACTION_DIM, options.normalized_proprio_dim, options.gripper_convention
        )
        self.statistics_name = "demonstrations"
        selected = select_statistics(norm_stats, options.unnorm_key)
        if selected is not None:
            self.statistics_name, entry = selected
            self.normalizer.set_statistics(entry)
        self.default_temperature = options.temperature
        self.value_head = None
        if options.value_head:
            self.value_head = make_value_head(vla.hidden_size, options.seed)

    @property
    def device(self) -> torch.device:
        return self.vla.projector.fc1.weight.device

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write the policy in the published layout; ``path`` with the same options loads it.

        The statistics go to ``dataset_statistics.json`` under :attr:`statistics_name`.
        """
        entry = self.normalizer.statistics()
        stats = None if entry is None else {self.statistics_name: entry}
        extras = self.config_extras()
        return save_checkpoint(
            self, folder, self.vla.arch, stats, self.tokenizer, config_extras=extras
        )

    def config_extras(self) -> dict[str, Any]:
        """``config.json`` keys beside the architecture's (none for OpenVLA)."""
        return {}

    def published_extras(self, folder: Path) -> dict[str, torch.Tensor]:
        """Tensors a published checkpoint keeps outside its safetensors, under our names
        (none for OpenVLA; OpenVLA-OFT's side files)."""
        return {}

    def unpublished_defaults(self) -> dict[str, torch.Tensor]:
        """Parameters that no published file holds, with the values they start from."""
        return {}

    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Set the normalisation statistics (a ``norm_stats`` entry, e.g. from demos)."""
        self.normalizer.set_statistics(statistics)

    def action_targets(self, actions: torch.Tensor) -> tuple[str, torch.Tensor]:
        """What ``evaluate`` scores for env actions: ``(score_key, (N, K))``.

        Args:
            actions: (N, chunk, 7) env actions (demonstrations).

        Returns:
            ACTION_TOKENS ids of the normalised actions (discrete: the released token
            convention), or RAW_ACTIONS, the normalised actions themselves (continuous head).
        """
        if actions.shape[1:] != (self.chunk, ACTION_DIM):
            raise ValueError(
                f"{type(self).__name__} takes chunks of {self.chunk} x {ACTION_DIM} actions, got "
                f"actions of shape {tuple(actions.shape)}; set the demonstrations' chunk to "
                f"{self.chunk}"
            )
        normalized = self.normalizer.from_env(actions).reshape(len(actions), -1)
        if self.score_key == K.RAW_ACTIONS:
            return K.RAW_ACTIONS, normalized
        return K.ACTION_TOKENS, self.vla.action_tokenizer.encode(normalized.to(self.device))

    def pixel_values(self, images: np.ndarray | torch.Tensor | None) -> torch.Tensor:
        """uint8 (N, H, W, 3) -> (N, 6, S, S) normalised for both towers (resized as
        ``frame_resize`` says, optionally cropped)."""
        if images is None:
            raise ValueError(f"the {type(self).__name__} needs camera images, got images=None")
        size = self.vla.vision_backbone.image_size
        if self.options.frame_resize == "oft_libero":
            frames = images.cpu().numpy() if isinstance(images, torch.Tensor) else images
            images = oft_libero_frames(np.asarray(frames, dtype=np.uint8), size)
        pixels = torch.as_tensor(np.ascontiguousarray(images)).to(self.device)
        x = images_to_float(pixels, size)
        if self.options.center_crop:
            x = center_crop_resize(x)
        return self.vla.vision_backbone.normalize(x)

    def image_tokens(self, images: np.ndarray | torch.Tensor | None) -> torch.Tensor:
        """Image tokens (N, V * P, D) of N observations, each camera's P in ``cameras`` order.

        Args:
            images: uint8 (N, H, W, 3) with one camera, (N, V, H, W, 3) with V.
        """
        views = len(self.cameras)
        if views > 1:
            shape = tuple(getattr(images, "shape", ()))
            if len(shape) != 5 or shape[1] != views:
                raise ValueError(
                    f"the {type(self).__name__} reads {views} cameras {list(self.cameras)} "
                    f"and takes images (N, {views}, H, W, 3), got shape {shape}"
                )
            images = images.reshape(shape[0] * views, *shape[2:])
        tokens = self.vla.image_tokens(self.pixel_values(images))  # (N * V, P, D)
        return tokens.reshape(-1, views * tokens.shape[1], tokens.shape[2])

    def extra_prefix(self, states: torch.Tensor | None) -> torch.Tensor | None:
        """Tokens (N, E, D) placed after the image tokens; none by default."""
        return None

    def build_sequence(
        self,
        images: np.ndarray | torch.Tensor,
        instructions: Sequence[str],
        states: np.ndarray | torch.Tensor | None,
        suffix: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """LM inputs of N observations followed by ``suffix`` (N, E, D) embeddings.

        Returns:
            embeds (N, L, D), attention mask (N, L) int64 and position ids (N, L) int64.
        """
        device = self.device
        image_tokens = self.image_tokens(images)
        n = image_tokens.shape[0]
        start = torch.full((n, 1), self.prompts.start_id, dtype=torch.long, device=device)
        state = None if states is None else torch.as_tensor(np.asarray(states)).to(device)
        parts = [self.vla.embed_tokens(start), image_tokens]
        extra = self.extra_prefix(state)
        if extra is not None:
            parts.append(extra)
        prefix_len = sum(p.shape[1] for p in parts)
        text_ids, text_mask = self.prompts.batch(instructions)
        parts.append(self.vla.embed_tokens(text_ids.to(device)))
        masks = [torch.ones(n, prefix_len, dtype=torch.long), text_mask]
        if suffix is not None:
            parts.append(suffix)
            masks.append(torch.ones(n, suffix.shape[1], dtype=torch.long))
        dtype = parts[0].dtype
        embeds = torch.cat([p.to(dtype) for p in parts], dim=1)
        mask = torch.cat(masks, dim=1).to(device)
        # Positions count real tokens, so the padding inside the prompt block changes nothing.
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return embeds, mask, positions

    @abc.abstractmethod
    def score_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (n, K) of stored ``targets`` (n, K) for n observations."""

    @abc.abstractmethod
    def bin_logits_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        tokens: torch.Tensor,
    ) -> torch.Tensor:
        """float32 action logits (n, K, 256) of n observations whose stored action token ids
        are ``tokens`` (n, K) (autoregressive decoding is teacher-forced on them)."""

    @abc.abstractmethod
    def mode_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor | None,
    ) -> torch.Tensor:
        """The mode (n, K) of n observations' action distributions (see ``action_mode``)."""

    def _stored_targets(self, batch: TensorDict) -> torch.Tensor:
        """``score_key`` (B, T, K) of a batch as (B * T, K), checked against K."""
        b, t = batch[K.STEP_MASK].shape
        targets = batch[self.score_key].reshape(b * t, -1)
        if targets.shape[1] != self.tokens_per_step:
            raise ValueError(
                f"{self.score_key} has {targets.shape[1]} entries per step, expected "
                f"{self.tokens_per_step}"
            )
        return targets

    def action_mode(self, batch: TensorDict) -> torch.Tensor:
        """The most likely output of every step (B, T * K), step-major, 0 on masked steps.

        The continuous head's mean (normalised units, differentiable) or the most likely
        action token id (float); autoregressive decoding (OpenVLA) is teacher-forced on the
        stored ACTION_TOKENS, as its token accuracy is usually reported.
        """
        b, t = batch[K.STEP_MASK].shape
        targets = self._stored_targets(batch) if self.score_key in batch.keys() else None
        steps = StepInputs.from_batch(batch, self.cameras)
        parts = [
            self.mode_steps(
                images,
                instructions,
                states,
                None if targets is None else targets[rows.to(targets.device)],
            )
            for rows, images, instructions, states in steps.micro_batches(
                self.options.micro_batch_size
            )
        ]
        return steps.scatter(parts, self.tokens_per_step, self.device).reshape(b, -1)

    def evaluate(self, batch: TensorDict, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of the stored actions of trajectories (differentiable).

        Every valid step is one observation; they are scored ``micro_batch_size`` at a time.

        Args:
            batch: OBS_IMAGE (B, T, H, W, 3) uint8, PROMPT_TEXT (B instructions), OBS_STATE
                (B, T, S) when the policy reads proprio, STEP_MASK (B, T) and ``score_key``
                (B, T, K): ACTION_TOKENS (vocabulary ids) or RAW_ACTIONS.
            temperature: the rollout temperature.

        Returns:
            logprobs, entropy: (B, T * K) float32, step-major; 0 on masked steps.
        """
        check_range("evaluate temperature", temperature, 0, low_open=True)
        b, t = batch[K.STEP_MASK].shape
        k = self.tokens_per_step
        targets = self._stored_targets(batch)
        logprobs, entropies = [], []
        steps = StepInputs.from_batch(batch, self.cameras)
        size = self.options.micro_batch_size
        for rows, images, instructions, states in steps.micro_batches(size):
            logp, ent = self.score_steps(
                images, instructions, states, targets[rows.to(targets.device)], temperature
            )
            logprobs.append(logp)
            entropies.append(ent)
        logprobs_full = steps.scatter(logprobs, k, self.device).reshape(b, t * k)
        entropy_full = steps.scatter(entropies, k, self.device).reshape(b, t * k)
        return logprobs_full, entropy_full

    def bin_logprobs(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-softmax (B, T * K, 256) at temperature 1 over the action bins of every stored
        ACTION_TOKENS entry and its bin position (B, T * K) int64, step-major, 0 on masked
        steps (:class:`embodied_rl.interfaces.BinnedActionPolicy`). Positions run opposite to
        action values (OpenVLA's tokenizer) but stay ordered, which is all smoothing needs."""
        b, t = batch[K.STEP_MASK].shape
        k, bins = self.tokens_per_step, self.vla.action_tokenizer.n_bins
        targets = self._stored_targets(batch)
        logprobs, positions = [], []
        steps = StepInputs.from_batch(batch, self.cameras)
        for rows, images, instructions, states in steps.micro_batches(
            self.options.micro_batch_size
        ):
            tokens = targets[rows.to(targets.device)].to(self.device).long()
            logits = self.bin_logits_steps(images, instructions, states, tokens)
            logprobs.append(torch.log_softmax(logits, dim=-1).reshape(len(tokens), k * bins))
            positions.append(self.vla.action_tokenizer.token_to_index(tokens))
        logprobs_full = steps.scatter(logprobs, k * bins, self.device).reshape(b, t * k, bins)
        positions_full = steps.scatter(positions, k, self.device).reshape(b, t * k).long()
        return logprobs_full, positions_full

    def observation_values(
        self,
        images: np.ndarray | torch.Tensor,
        instructions: Sequence[str],
        states: np.ndarray | torch.Tensor | None,
    ) -> torch.Tensor:
        """V(s) (n,) float32 of n observations (differentiable; needs ``value_head``).

        The observation alone, ``[BOS, image, (proprio), prompt]``, goes through the LM and the
        value head reads the hidden state at the last prompt position (prompts are
        left-padded, so that is the last position of every row; it has attended to the image
        and the whole instruction, causally or bidirectionally).
        """
        if self.value_head is None:
            raise ValueError(f"this {type(self).__name__} has no value head; set value_head: true")
        embeds, mask, positions = self.build_sequence(images, instructions, states)
        hidden = self.vla.decode(embeds, mask, positions).last_hidden_state[:, -1]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def values(self, batch: TensorDict) -> torch.Tensor:
        """Value of every step's observation (B, T) float32, 0 on masked steps (differentiable).

        Reads OBS_IMAGE, PROMPT_TEXT, OBS_STATE (with proprio) and STEP_MASK like ``evaluate``;
        valid steps go through :meth:`observation_values` ``micro_batch_size`` at a time.
        """
        b, t = batch[K.STEP_MASK].shape
        steps = StepInputs.from_batch(batch, self.cameras)
        parts = [
            self.observation_values(images, instructions, states).unsqueeze(-1)
            for _, images, instructions, states in steps.micro_batches(
                self.options.micro_batch_size
            )
        ]
        return steps.scatter(parts, 1, self.device).reshape(b, t)


def make_value_head(hidden_size: int, seed: int) -> nn.Linear:
    """``Linear(hidden_size, 1)`` with small weights (std 1e-3) and a zero bias.

    Initialised under its own seed in a forked RNG, so adding it changes no other weight.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(hidden_size, 1)
        if not head.weight.is_meta:
            nn.init.normal_(head.weight, std=1e-3)
            nn.init.zeros_(head.bias)
    return head
