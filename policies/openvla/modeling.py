"""OpenVLA policy: 7 action tokens per step, decoded one at a time (registered as ``openvla``).

``act`` runs the prompt once and then decodes the 7 tokens autoregressively with the LM's KV
cache, each sampled from ``softmax(action_logits / temperature)`` over the 256 action ids only.
``evaluate`` scores stored tokens with teacher forcing: one forward pass per batch of steps
over ``[prompt, a_0 .. a_5]``, whose last 7 positions predict ``a_0 .. a_6``. Both see the
same distribution, so ``evaluate``'s log-probs of sampled tokens equal ``act``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embodied_rl.checks import check_range
from embodied_rl.interfaces import ActOutput
from embodied_rl.registry import POLICIES
from policies.openvla.builders import build_policy
from policies.openvla.configuration import ACTION_DIM, OpenVLAConfig
from policies.openvla.policy_base import VLAPolicyBase
from policies.openvla.preprocessor import check_processor_file
from policies.openvla.sampling import categorical_scores, sample_action_index


class OpenVLAPolicy(VLAPolicyBase):
    """OpenVLA behind the ``EmbodiedPolicy`` interface.

    Attributes:
        vla: :class:`policies.openvla.prismatic.PrismaticVLA` (vision, projector, Llama).
        tokenizer: the prompt tokenizer.
        normalizer: normalised actions -> environment actions (q01/q99, gripper).
        tokens_per_step: K = 7.
    """

    tokens_per_step = ACTION_DIM

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
        """Sample one action step per observation (eval mode, no grad).

        Args:
            images: (N, H, W, 3) uint8 camera images.
            instructions: N task instructions.
            states: (N, S) proprio; unused by OpenVLA.
            temperature: softmax temperature (> 0); log-probs use it also when greedy.
            do_sample: sample (True) or take the most likely bin (False).

        Returns:
            ActOutput with actions (N, 1, 7) float32 in environment units, tokens (N, 7) int64
            vocabulary ids and logprobs (N, 7) float32.
        """
        check_range("temperature", temperature, 0, low_open=True)
        was_training = self.training
        self.eval()
        try:
            tokens, logprobs = self._decode(images, instructions, states, temperature, do_sample)
        finally:
            self.train(was_training)
        normalized = self.vla.action_tokenizer.decode(tokens).cpu().numpy()
        actions = self.normalizer.to_env(normalized)[:, None, :]
        return ActOutput(
            actions=actions, tokens=tokens.cpu(), raw_actions=None, logprobs=logprobs.cpu()
        )

    def _decode(
        self,
        images: Any,
        instructions: Sequence[str],
        states: Any,
        temperature: float,
        do_sample: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Autoregressive decoding with the KV cache: tokens (N, 7), logprobs (N, 7)."""
        embeds, mask, positions = self.build_sequence(images, instructions, states)
        output = self.vla.decode(embeds, mask, positions, use_cache=True)
        tokens, logprobs = [], []
        for step in range(ACTION_DIM):
            logits = self.vla.action_logits(output.last_hidden_state[:, -1])
            index, logprob = sample_action_index(logits, temperature, do_sample)
            token = self.vla.action_tokenizer.index_to_token(index)
            tokens.append(token)
            logprobs.append(logprob)
            if step == ACTION_DIM - 1:
                break
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            positions = positions[:, -1:] + 1
            output = self.vla.decode(
                self.vla.embed_tokens(token[:, None]),
                mask,
                positions,
                cache=self.vla.kv_cache(output),
                use_cache=True,
            )
        return torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1).float()

    def bin_logits_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        tokens: torch.Tensor,
    ) -> torch.Tensor:
        """Action logits (n, 7, 256) of each position given the stored tokens (n, 7) before it."""
        # a_6 is never an input: the 7 positions ending at a_5 predict a_0 .. a_6.
        suffix = self.vla.embed_tokens(tokens[:, :-1])
        embeds, mask, positions = self.build_sequence(images, instructions, states, suffix)
        hidden = self.vla.decode(embeds, mask, positions).last_hidden_state[:, -ACTION_DIM:]
        return self.vla.action_logits(hidden)

    def score_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced log-probs and entropies (n, 7) of action tokens ``targets`` (n, 7)."""
        tokens = targets.to(self.device).long()
        index = self.vla.action_tokenizer.token_to_index(tokens)
        logits = self.bin_logits_steps(images, instructions, states, tokens)
        return categorical_scores(logits, index, temperature)

    def mode_steps(
        self,
        images: torch.Tensor,
        instructions: Sequence[str],
        states: torch.Tensor | None,
        targets: torch.Tensor | None,
    ) -> torch.Tensor:
        """Teacher-forced most likely token ids (n, 7) given the stored ``targets`` (n, 7)."""
        if targets is None:
            raise ValueError("openvla action_mode is teacher-forced: the batch needs ACTION_TOKENS")
        tokens = targets.to(self.device).long()
        logits = self.bin_logits_steps(images, instructions, states, tokens)
        return self.vla.action_tokenizer.index_to_token(logits.argmax(-1))

    @classmethod
    def from_config(cls, config: OpenVLAConfig, device: torch.device) -> OpenVLAPolicy:
        """Build from a preset or a local checkpoint (see :func:`build_policy`)."""
        return build_policy(cls, config, device)


@POLICIES.register("openvla")
def build_openvla(options: Mapping[str, Any], device: torch.device | str) -> OpenVLAPolicy:
    """Registry builder: ``options`` are :class:`OpenVLAConfig` fields."""
    config = OpenVLAConfig.from_options(options)
    return OpenVLAPolicy.from_config(config, torch.device(device))


# What an ``init_from`` checkpoint must agree on (embodied_rl/interfaces.py, PolicyBuilder).
build_openvla.architecture_options = OpenVLAConfig.architecture_options
build_openvla.state_size = OpenVLAConfig.state_size_of
build_openvla.check_options = check_processor_file  # a path checkpoint's processor file
