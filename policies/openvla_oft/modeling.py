"""OpenVLA-OFT policy: a whole action chunk in one forward pass (registered as ``openvla_oft``).

Parallel decoding as OpenVLA-OFT implements it:

- The sequence is ``[BOS, image, (proprio), prompt, "▁", 56 action slots, STOP]``: the action
  slots get *zero* embeddings (OFT zeroes the placeholder tokens' embeddings), followed by the
  tokenizer's EOS as the stop token that OFT also appends at training time.
- Attention is fully bidirectional: OFT's transformers fork drops the causal mask of the
  whole Llama (not only over the action slots; the authors confirm it in openvla-oft issue
  #27), so the LM is switched to non-causal attention here, padding still masked.
- Action ``j`` is read, as in training's next-token alignment, from the hidden state of the
  position *before* slot ``j`` (the "▁" prompt token for ``j = 0``).

Discrete mode samples each of the 56 tokens from the tempered 256-bin action slice; its input
does not depend on the tokens, so ``evaluate`` re-runs the same single pass and gathers the
stored tokens. Continuous mode feeds the hidden states (chunk, 7 * D) to an MLP head (OFT's
L1-regression head) whose output is the mean of a Gaussian with a learnable per-dimension
log-std; ``raw_actions`` are the Gaussian samples, clipped to [-1, 1] before de-normalisation.
Tempering a Gaussian density, ``p(x)^(1/t)``, gives ``N(mean, t * std^2)``: the sampling std is
``std * sqrt(t)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.interfaces import ActOutput
from embodied_rl.registry import POLICIES
from policies.openvla.builders import build_policy
from policies.openvla.configuration import ACTION_DIM
from policies.openvla.policy_base import VLAPolicyBase
from policies.openvla.prismatic import PrismaticVLA
from policies.openvla.sampling import categorical_scores, sample_action_index
from policies.openvla_oft.configuration import OpenVLAOFTConfig
from policies.openvla_oft.published import IMAGES_KEY, check_checkpoint_options, read_side_tensors


class ProprioProjector(nn.Module):
    """Proprio state (N, S) -> one LM token (N, 1, D): ``fc1 -> GELU -> fc2``."""

    def __init__(self, state_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(state_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(state))).unsqueeze(1)


class ResidualBlock(nn.Module):
    """``x + ReLU(Linear(LayerNorm(x)))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.fc(self.norm(x)))


class ContinuousActionHead(nn.Module):
    """OFT's L1-regression head (an MLP-ResNet with 2 residual blocks).

    Maps the hidden states of one chunk step's 7 action positions, concatenated
    (N, chunk, 7 * D), to that step's normalised action (N, chunk, 7).
    """

    def __init__(self, input_dim: int, hidden_dim: int, action_dim: int, blocks: int = 2) -> None:
        super().__init__()
        self.norm_in = nn.LayerNorm(input_dim)
        self.fc_in = nn.Linear(input_dim, hidden_dim)
        self.blocks = nn.ModuleList(ResidualBlock(hidden_dim) for _ in range(blocks))
        self.norm_out = nn.LayerNorm(hidden_dim)
        self.fc_out = nn.Linear(hidden_dim, action_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc_in(self.norm_in(x)))
        for block in self.blocks:
            x = block(x)
        return self.fc_out(self.norm_out(x))


def make_bidirectional(language_model: nn.Module) -> None:
    """Switch a transformers decoder to full (non-causal) attention, padding still masked.

    ``config.is_causal = False`` makes the mask builder produce a padding-only mask; the
    attention modules' own ``is_causal`` flag is what SDPA / flash-attention use when that
    mask is skipped (no padding), so both are cleared.
    """
    language_model.config.is_causal = False
    for module in language_model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False


class OpenVLAOFTPolicy(VLAPolicyBase):
    """OpenVLA-OFT behind the ``EmbodiedPolicy`` interface.

    Attributes:
        chunk: actions per step (8 on LIBERO); ``tokens_per_step`` = chunk * 7.
        proprio_projector: :class:`ProprioProjector` when ``use_proprio``.
        action_head, action_log_std: the continuous head and its (7,) log-std when
            ``use_continuous_head``; ``evaluate`` then scores RAW_ACTIONS.
    """

    def __init__(
        self,
        vla: PrismaticVLA,
        tokenizer: Any,
        options: OpenVLAOFTConfig,
        norm_stats: Mapping[str, Any] | None,
    ) -> None:
        super().__init__(vla, tokenizer, options, norm_stats)
        self.chunk = options.chunk
        self.tokens_per_step = options.chunk * ACTION_DIM
        self.cameras = options.cameras
        self.stop_id = int(tokenizer.eos_token_id)
        width = vla.hidden_size
        self.proprio_projector = None
        if options.use_proprio:
            self.proprio_projector = ProprioProjector(options.proprio_dim, width)
        self.action_head = None
        self.action_log_std = None
        if options.use_continuous_head:
            self.action_head = ContinuousActionHead(ACTION_DIM * width, width, ACTION_DIM)
            self.action_log_std = nn.Parameter(torch.full((ACTION_DIM,), options.init_log_std))
            self.score_key = K.RAW_ACTIONS
        self.init_log_std = options.init_log_std
        make_bidirectional(vla.language_model)

    def published_extras(self, folder: Path) -> dict[str, torch.Tensor]:
        """The L1 action head and proprio projector files of a published OFT model."""
        return read_side_tensors(folder)

    def config_extras(self) -> dict[str, Any]:
        """``num_images_in_input``, under OFT's name: a reload with another count is refused
        (``published.check_checkpoint_options``)."""
        return {IMAGES_KEY: len(self.cameras)}

    def unpublished_defaults(self) -> dict[str, torch.Tensor]:
        """``action_log_std`` (OFT's L1 head is deterministic): ``init_log_std``."""
        if self.action_log_std is None:
            return {}
        return {"action_log_std": torch.full((ACTION_DIM,), float(self.init_log_std))}

    def extra_prefix(self, states: torch.Tensor | None) -> torch.Tensor | None:
        """The proprio token (N, 1, D), or ``None`` without ``use_proprio``."""
        if self.proprio_projector is None:
            return None
        if states is None:
            raise ValueError("openvla_oft with use_proprio needs states (N, proprio_dim)")
        state = self.normalizer.normalize_proprio(states.float())
        return self.proprio_projector(state.to(self.proprio_projector.fc1.weight.dtype))

    def action_hidden(self, images: Any, instructions: Sequence[str], states: Any) -> torch.Tensor:
        """One forward pass; hidden states (N, K, D) that produce the K action outputs."""
        n, k = len(instructions), self.tokens_per_step
        stop = torch.full((n, 1), self.stop_id, dtype=torch.long, device=self.device)
        stop_embed = self.vla.embed_tokens(stop)
        slots = stop_embed.new_zeros(n, k, stop_embed.shape[-1])
        embeds, mask, positions = self.build_sequence(
            images, instructions, states, torch.cat([slots, stop_embed], dim=1)
        )
        hidden = self.vla.decode(embeds, mask, positions).last_hidden_state
        # Slots occupy [-K-1, -1); each is predicted from the position before it.
        return hidden[:, -(k + 2) : -2]

    def gaussian(
        self, hidden: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (N, K) and sampling std (N, K) float32 of the continuous head."""
        n = hidden.shape[0]
        steps = hidden.reshape(n, self.chunk, ACTION_DIM * hidden.shape[-1])
        mean = self.action_head(steps.to(self.action_head.fc_in.weight.dtype)).float()
        std = self.action_log_std.float().exp() * math.sqrt(temperature)
        return mean.reshape(n, -1), std.repeat(self.chunk).expand(n, -1)

    @torch.no_grad()
    def act(
        self,
        images: np.ndarray | torch.Tensor | None,
        instructions: Sequence[str],
        states: np.ndarray | torch.Tensor | None,
        *,
        temperature: float,
        do_sample: bool,
    ) -> ActOutput:
        """Sample one action chunk per observation in a single forward pass (eval, no grad).

        Args:
            images: (N, H, W, 3) uint8 camera images; (N, 2, H, W, 3) with
                ``num_images_in_input: 2``, agentview then wrist.
            instructions: N task instructions.
            states: (N, proprio_dim) proprio state (read with ``use_proprio``).
            temperature: > 0; tempers the token softmax or widens the Gaussian.
            do_sample: sample (True) or take the most likely bin / the mean (False).

        Returns:
            ActOutput with actions (N, chunk, 7) float32 in environment units, logprobs
            (N, K) and tokens (N, K) vocabulary ids (discrete) or raw_actions (N, K).
        """
        check_range("temperature", temperature, 0, low_open=True)
        was_training = self.training
        self.eval()
        try:
            hidden = self.action_hidden(images, instructions, states)
            if self.action_head is None:
                out = self._sample_tokens(hidden, temperature, do_sample)
            else:
                out = self._sample_gaussian(hidden, temperature, do_sample)
        finally:
            self.train(was_training)
        return out

    def _sample_tokens(
        self, hidden: torch.Tensor, temperature: float, do_sample: bool
    ) -> ActOutput:
        n = hidden.shape[0]
        logits = self.vla.action_logits(hidden).reshape(-1, self.vla.action_tokenizer.n_bins)
        index, logprob = sample_action_index(logits, temperature, do_sample)
        tokens = self.vla.action_tokenizer.index_to_token(index).reshape(n, -1)
        normalized = self.vla.action_tokenizer.decode(tokens).reshape(n, self.chunk, ACTION_DIM)
        actions = self.normalizer.to_env(normalized.cpu().numpy())
        return ActOutput(
            actions=actions,
            tokens=tokens.cpu(),
            raw_actions=None,
            logprobs=logprob.reshape(n, -1).float().cpu(),
        )

    def _sample_gaussian(
        self, hidden: torch.Tensor, temperature: float, do_sample: bool
    ) -> ActOutput:
        mean, std = self.gaussian(hidden, temperature)
        raw = mean
        if do_sample:  # CPU noise: reproducible under a CPU seed on any device
            raw = mean + std * torch.randn(mean.shape, dtype=torch.float32).to(mean.device)
        logprob = torch.distributions.Normal(mean, std).log_prob(raw)
        n = raw.shape[0]
        normalized = raw.clamp(-1.0, 1.0).reshape(n, self.chunk, ACTION_DIM)
        actions = self.normalizer.to_env(normalized.cpu().numpy())
        return ActOutput(
            actions=actions, tokens=None, raw_actions=raw.cpu(), logprobs=logprob.cpu()
        )

    def score_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (n, K) of stored tokens or raw actions ``targets`` (n, K)."""
        if self.action_head is None:
            index = self.vla.action_tokenizer.token_to_index(targets.to(self.device))
            logits = self.bin_logits_steps(images, instructions, states, targets)
            return categorical_scores(logits, index, temperature)
        mean, std = self.gaussian(self.action_hidden(images, instructions, states), temperature)
        dist = torch.distributions.Normal(mean, std)
        return dist.log_prob(targets.to(mean.device).float()), dist.entropy()

    def bin_logits_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        tokens: torch.Tensor,
    ) -> torch.Tensor:
        """Action logits (n, K, 256) of the K parallel slots (decoding does not read the
        stored ``tokens``); the continuous head has no bins and raises."""
        if self.action_head is not None:
            raise ValueError(
                "the OpenVLA-OFT continuous head regresses actions and has no action bins; "
                "bin-smoothed targets need action_head: false (discrete tokens)"
            )
        return self.vla.action_logits(self.action_hidden(images, instructions, states))

    def mode_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor | None,
    ) -> torch.Tensor:
        """The continuous head's mean (n, K) (differentiable), or the argmax token ids (n, K)."""
        if self.action_head is not None:
            return self.gaussian(self.action_hidden(images, instructions, states), 1.0)[0]
        index = self.bin_logits_steps(images, instructions, states, targets).argmax(-1)
        return self.vla.action_tokenizer.index_to_token(index)

    @classmethod
    def from_config(cls, config: OpenVLAOFTConfig, device: torch.device) -> OpenVLAOFTPolicy:
        """Build from a preset or a local checkpoint (see :func:`build_policy`)."""
        return build_policy(cls, config, device)


@POLICIES.register("openvla_oft")
def build_openvla_oft(options: Mapping[str, Any], device: torch.device | str) -> OpenVLAOFTPolicy:
    """Registry builder: ``options`` are :class:`OpenVLAOFTConfig` fields."""
    config = OpenVLAOFTConfig.from_options(options)
    return OpenVLAOFTPolicy.from_config(config, torch.device(device))


# What an ``init_from`` checkpoint must agree on, and the driver's check of a ``path``
# checkpoint's files against the options (embodied_rl/interfaces.py, PolicyBuilder).
build_openvla_oft.architecture_options = OpenVLAOFTConfig.architecture_options
build_openvla_oft.state_size = OpenVLAOFTConfig.state_size_of
build_openvla_oft.cameras = OpenVLAOFTConfig.cameras_of
build_openvla_oft.check_options = check_checkpoint_options
