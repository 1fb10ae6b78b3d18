"""Value model for PPO: a causal-LM backbone with a scalar head, policy ``causal_lm_critic``.

It is built from the same options as the ``causal_lm`` actor (preset or local checkpoint,
dtype, seed), minus constrained decoding: a critic scores states, it emits no tokens. The
LM head is dropped; a ``Linear(hidden, 1)`` value head reads the final hidden states.

Shapes: ``B`` samples, ``P`` prompt tokens (left-padded), ``R`` response tokens
(right-padded), ``H`` hidden size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.registry import POLICIES
from policies.causal_lm.configuration import CausalLMConfig
from policies.causal_lm.modeling import build_model_and_tokenizer, response_forward_inputs
from policies.causal_lm.tokenizer import load_tokenizer

# transformers is imported where a backbone is loaded (about 5 s): importing ``policies``,
# which every worker process and CLI call does, must not pay for it.
if TYPE_CHECKING:
    from transformers import PreTrainedModel

VALUE_HEAD_INIT_STD = 1e-2  # small: initial values near 0, the backbone is not disturbed
VALUE_HEAD_FILE = "value_head.safetensors"  # beside the backbone's files (save_pretrained)


class CausalLMCritic(torch.nn.Module):
    """V(s_t) for every response position of prompt + response sequences.

    Attributes:
        backbone: the transformer without its LM head (``model.base_model`` of the causal LM).
        value_head: ``Linear(H, 1)`` in float32, applied to the final hidden states.
        tokenizer: the tokenizer of the backbone (shared, treat as read-only).
    """

    def __init__(self, backbone: PreTrainedModel, tokenizer: Any, seed: int = 0) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        hidden = int(backbone.config.hidden_size)
        # Seeded without touching the global RNG, so every rank builds the same head.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.value_head = torch.nn.Linear(hidden, 1)
            torch.nn.init.normal_(self.value_head.weight, std=VALUE_HEAD_INIT_STD)
            torch.nn.init.zeros_(self.value_head.bias)

    @property
    def device(self) -> torch.device:
        return self.value_head.weight.device

    def values(self, batch: TensorDict) -> torch.Tensor:
        """Value of the state before each response token (differentiable).

        One forward pass over prompt + response with the same padding and position handling
        as ``CausalLMPolicy.evaluate``: the hidden state at position ``P - 1 + t`` (the one
        that predicts response token t) gives ``V(s_t)``.

        Args:
            batch: with PROMPT_IDS (B, P), PROMPT_MASK (B, P), RESPONSE_IDS (B, R) and
                RESPONSE_MASK (B, R).

        Returns:
            (B, R) float32 values, 0 where RESPONSE_MASK is 0.
        """
        device = self.device
        response_ids = batch[K.RESPONSE_IDS].to(device)
        inputs = response_forward_inputs(
            batch[K.PROMPT_IDS].to(device), batch[K.PROMPT_MASK].to(device), response_ids
        )
        hidden = self.backbone(**inputs, use_cache=False).last_hidden_state  # (B, P + R, H)
        resp_len = response_ids.shape[1]
        # Position P - 1 + t has seen the prompt and tokens < t: the state s_t.
        states = hidden[:, -(resp_len + 1) : -1].float()  # (B, R, H)
        values = self.value_head(states).squeeze(-1)  # (B, R)
        valid = batch[K.RESPONSE_MASK].to(device) > 0
        return torch.where(valid, values, torch.zeros_like(values))

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write the backbone in the ``transformers`` layout (``config.json``,
        ``model.safetensors``: an ``AutoModel``), the value head (``value_head.safetensors``)
        and the tokenizer's files; :meth:`from_pretrained` loads them."""
        out = Path(folder).expanduser()
        self.backbone.save_pretrained(str(out))
        head = {k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()}
        save_file(head, str(out / VALUE_HEAD_FILE))
        self.tokenizer.save_pretrained(str(out))
        return out

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike[str], device: torch.device | str = "cpu"
    ) -> CausalLMCritic:
        """Load a folder written by :meth:`save_pretrained` (local files only)."""
        folder = Path(folder).expanduser()
        if not (folder / VALUE_HEAD_FILE).is_file():
            raise FileNotFoundError(
                f"{folder} has no {VALUE_HEAD_FILE}; point at a folder written by "
                "CausalLMCritic.save_pretrained (embodied-rl export --critic)"
            )
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(
            str(folder), local_files_only=True, use_safetensors=True
        )
        critic = cls(backbone, load_tokenizer(folder))
        critic.value_head.load_state_dict(load_file(str(folder / VALUE_HEAD_FILE)))
        return critic.to(device)

    @classmethod
    def from_config(cls, config: CausalLMConfig, device: torch.device) -> CausalLMCritic:
        """Backbone (preset or local checkpoint) without LM head, plus a fresh value head."""
        if config.allowed_response_tokens is not None:
            raise ValueError(
                "causal_lm_critic takes no allowed_response_tokens: a critic scores states and "
                "emits no tokens; remove that option from the critic's options"
            )
        model, tokenizer = build_model_and_tokenizer(config, device)
        critic = cls(model.base_model, tokenizer, seed=config.seed)
        return critic.to(device)


@POLICIES.register("causal_lm_critic")
def build_causal_lm_critic(options: Mapping[str, Any], device: torch.device) -> CausalLMCritic:
    """Registry builder: ``options`` are :class:`CausalLMConfig` fields."""
    config = CausalLMConfig.from_options(options)
    return CausalLMCritic.from_config(config, torch.device(device))
