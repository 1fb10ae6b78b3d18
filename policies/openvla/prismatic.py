"""The Prismatic VLA module shared by OpenVLA and OpenVLA-OFT: vision backbone, projector and
Llama, under the published parameter names (``loading.py``).

It knows nothing of prompts or actions as env values: it embeds token ids and images, runs the
decoder and reads the 256 action logits; the policies (``policy_base.py``) build the sequence.

Shapes: ``N`` observations, ``P`` image tokens, ``L`` sequence length, ``D`` LM width.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from policies.openvla.action_tokenizer import ActionTokenizer
from policies.openvla.configuration import EFFICIENTNET_LITE0, VLAArchitecture
from policies.openvla.efficientnet_tower import EfficientNetBackbone
from policies.openvla.vision import FusedVisionBackbone, Projector


def build_vision_backbone(arch: VLAArchitecture) -> FusedVisionBackbone | EfficientNetBackbone:
    """The backbone ``arch.vision_backbone`` names (both map (N, C, S, S) to (N, P, D))."""
    if arch.vision_backbone == EFFICIENTNET_LITE0:
        return EfficientNetBackbone(arch.image_size)
    return FusedVisionBackbone(arch.timm_model_ids, arch.image_size, arch.timm_override_act_layers)


class PrismaticVLA(nn.Module):
    """Vision backbone + projector + Llama, with the action vocabulary (published names).

    Attributes:
        vision_backbone: :class:`FusedVisionBackbone`, or :class:`EfficientNetBackbone` for
            ``arch.vision_backbone == "efficientnet_lite0"``.
        projector: fused features (N, P, D_vision) -> LM embeddings (N, P, D).
        language_model: ``LlamaForCausalLM``.
        action_tokenizer: the 256 action ids at the end of the vocabulary.
    """

    def __init__(self, arch: VLAArchitecture) -> None:
        # Imported here, not at module level: importing ``policies`` (every worker process
        # and CLI call) must not import transformers, only building a VLA does.
        from transformers import LlamaConfig, LlamaForCausalLM

        super().__init__()
        self.arch = arch
        self.vision_backbone = build_vision_backbone(arch)
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
        """(N, C, S, S) normalised pixels (C = 6 fused, 3 EfficientNet) -> (N, P, D) LM-space
        image tokens."""
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
