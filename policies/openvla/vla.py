"""The Prismatic VLA core shared by OpenVLA and OpenVLA-OFT.

Input sequence of one observation (OpenVLA's layout: image tokens right after BOS)::

    [BOS] [P image tokens] [proprio token (OFT, optional)] [prompt tokens ... "▁"] [suffix]

with the prompt ``"In: What action should the robot take to {instruction.lower()}?\\nOut:"``.
OpenVLA appends the SentencePiece space token ``"▁"`` (id 29871 for Llama-2) when the prompt
does not already end with it, to match training. Prompts of a batch differ in length; they are
left-padded *inside the prompt block*, so the image tokens and the suffix (action tokens) sit
at the same index in every row. Padding is masked out and positions count real tokens only,
so every row computes exactly what it would alone.

Tokenizers without a BOS token (the Qwen2.5 tokenizer the tiny preset uses for the prompt
text, as no Llama-2 tokenizer is available offline) start the sequence with their EOS token.

Shapes: ``N`` observations, ``P`` image tokens, ``T`` prompt tokens, ``D`` LM width.
"""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix timm/transformers need)

# isort: split
import abc
import functools
import inspect
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from policies.causal_lm.tokenizer import build_qwen2_tokenizer, load_tokenizer
from policies.normalization import Normalizer, select_statistics
from policies.openvla.action_tokenizer import ActionTokenizer
from policies.openvla.configuration import (
    ACTION_DIM,
    TINY_ARCHITECTURE,
    TINY_LIBERO_64_ARCHITECTURE,
    TINY_LIBERO_ARCHITECTURE,
    VLAArchitecture,
    VLAOptions,
)
from policies.openvla.libero_words import build_libero_word_tokenizer
from policies.openvla.loading import load_weights, read_checkpoint, save_checkpoint
from policies.openvla.steps import StepInputs
from policies.openvla.vision import (
    FusedVisionBackbone,
    Projector,
    center_crop_resize,
    images_to_float,
)

PROMPT = "In: What action should the robot take to {}?\nOut:"
SPACE_TOKEN = "▁"


class PromptEncoder:
    """Token ids of OpenVLA prompts, cached per instruction (instructions repeat all the time)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        bos = tokenizer.bos_token_id
        self.start_id = int(bos if bos is not None else tokenizer.eos_token_id)
        space = tokenizer.convert_tokens_to_ids(SPACE_TOKEN)
        known = isinstance(space, int) and space != tokenizer.unk_token_id
        self.space_id = space if known else None
        self.pad_id = int(
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.start_id
        )
        self._cache: dict[str, list[int]] = {}

    def text_ids(self, instruction: str) -> list[int]:
        """Prompt ids after the start token, ending with the space token when there is one."""
        if instruction not in self._cache:
            prompt = PROMPT.format(instruction.lower())
            ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if self.space_id is not None and (not ids or ids[-1] != self.space_id):
                ids.append(self.space_id)
            self._cache[instruction] = ids
        return self._cache[instruction]

    def batch(self, instructions: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids (N, T) int64 and their mask (N, T) int64."""
        rows = [self.text_ids(text) for text in instructions]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids, mask


class PrismaticVLA(nn.Module):
    """Vision backbone + projector + Llama, with the action vocabulary (published names).

    Attributes:
        vision_backbone: :class:`FusedVisionBackbone`.
        projector: fused features (N, P, D_vision) -> LM embeddings (N, P, D).
        language_model: ``LlamaForCausalLM``.
        action_tokenizer: the 256 action ids at the end of the vocabulary.
    """

    def __init__(self, arch: VLAArchitecture) -> None:
        super().__init__()
        self.arch = arch
        self.vision_backbone = FusedVisionBackbone(
            arch.timm_model_ids, arch.image_size, arch.timm_override_act_layers
        )
        llm_config = LlamaConfig(**dict(arch.text_config))
        self.projector = Projector(self.vision_backbone.embed_dim, llm_config.hidden_size)
        self.language_model = LlamaForCausalLM(llm_config)
        self.action_tokenizer = ActionTokenizer(
            arch.vocab_size, arch.padded_vocab_size, arch.n_action_bins
        )

    @property
    def hidden_size(self) -> int:
        return self.language_model.config.hidden_size

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, T) ids -> (N, T, D) LM input embeddings."""
        return self.language_model.get_input_embeddings()(ids)

    def image_tokens(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(N, 6, S, S) normalised pixels -> (N, P, D) LM-space image tokens."""
        return self.projector(self.vision_backbone(pixel_values))

    def decode(
        self,
        embeds: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any = None,
        use_cache: bool = False,
    ) -> Any:
        """The Llama decoder (no LM head) on (N, L, D) embeddings; returns its output (its KV
        cache: :meth:`kv_cache`)."""
        decoder = self.language_model.model
        return decoder(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=positions,
            use_cache=use_cache,
            **{_cache_argument(type(decoder)): cache},
        )

    @staticmethod
    def kv_cache(output: Any) -> Any:
        """The KV cache of a :meth:`decode` output made with ``use_cache=True``."""
        return output["cache"] if "cache" in output else output["past_key_values"]

    def action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits (..., 256) of the action ids from hidden states (..., D).

        Equal to ``lm_head(hidden)[..., action_tokenizer.logit_slice]`` but multiplies only the
        256 action rows of the output layer (and in float32, for stable log-probs).
        """
        tok = self.action_tokenizer
        head = self.language_model.get_output_embeddings()
        weight = head.weight[tok.first_id : tok.vocab_size].float()
        bias = None if head.bias is None else head.bias[tok.first_id : tok.vocab_size].float()
        return F.linear(hidden.float(), weight, bias)


@functools.cache
def _cache_argument(decoder_cls: type) -> str:
    """``cache``, or ``past_key_values`` before transformers renamed it (5.24 warns on it)."""
    names = inspect.signature(decoder_cls.forward).parameters
    return "cache" if "cache" in names else "past_key_values"


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
        return save_checkpoint(self, folder, self.vla.arch, stats, self.tokenizer)

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
        """uint8 (N, H, W, 3) -> (N, 6, S, S) normalised for both towers (optionally cropped)."""
        if images is None:
            raise ValueError(f"the {type(self).__name__} needs camera images, got images=None")
        pixels = torch.as_tensor(np.ascontiguousarray(images)).to(self.device)
        x = images_to_float(pixels, self.vla.vision_backbone.image_size)
        if self.options.center_crop:
            x = center_crop_resize(x)
        return self.vla.vision_backbone.normalize(x)

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
        image_tokens = self.vla.image_tokens(self.pixel_values(images))
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
        steps = StepInputs.from_batch(batch)
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
        steps = StepInputs.from_batch(batch)
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
        steps = StepInputs.from_batch(batch)
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
        steps = StepInputs.from_batch(batch)
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


# Preset name -> (architecture, its prompt tokenizer); keys are configuration.PRESETS.
PRESET_BUILDS = {
    "tiny": (TINY_ARCHITECTURE, build_qwen2_tokenizer),
    "tiny_libero": (TINY_LIBERO_ARCHITECTURE, build_libero_word_tokenizer),
    "tiny_libero_64": (TINY_LIBERO_64_ARCHITECTURE, build_libero_word_tokenizer),
}


def build_policy(cls: type[VLAPolicyBase], options: VLAOptions, device: torch.device) -> Any:
    """Build ``cls(vla, tokenizer, options, norm_stats)`` from a preset or a checkpoint.

    Presets are random-init under ``options.seed`` (without touching the global RNG), so all
    ranks build identical replicas. Checkpoints are built on the meta device (no random
    init of 7B parameters) and their tensors assigned.
    """
    if options.preset is not None:
        architecture, build_tokenizer = PRESET_BUILDS[options.preset]
        tokenizer = _tokenizer(options.tokenizer_path) or build_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(options.seed)
            policy = cls(PrismaticVLA(architecture), tokenizer, options, None)
    else:
        checkpoint = read_checkpoint(options.path)
        tokenizer = _tokenizer(options.tokenizer_path) or load_tokenizer(checkpoint.folder)
        with torch.device("meta"):
            vla = PrismaticVLA(checkpoint.architecture)
            policy = cls(vla, tokenizer, options, checkpoint.norm_stats)
        load_weights(policy, checkpoint.folder)
    rows = policy.vla.language_model.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"tokenizer has {len(tokenizer)} ids, the LM only {rows} output rows")
    policy.to(device=device, dtype=options.torch_dtype)
    if options.gradient_checkpointing:
        policy.vla.language_model.gradient_checkpointing_enable()
    return policy.eval()


def _tokenizer(path: str | None) -> PreTrainedTokenizerBase | None:
    return None if path is None else load_tokenizer(path)
