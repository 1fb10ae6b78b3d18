"""Causal-LM policy: any ``transformers`` causal LM, registered as policy ``causal_lm``."""

from typing import Any

from policies.causal_lm.configuration import CausalLMConfig
from policies.causal_lm.critic import CausalLMCritic, build_causal_lm_critic
from policies.causal_lm.modeling import CausalLMPolicy, build_causal_lm, build_tiny_qwen2
from policies.causal_lm.tokenizer import build_qwen2_tokenizer, load_tokenizer

__all__ = [
    "AllowedTokensLogitsProcessor",
    "CausalLMConfig",
    "CausalLMCritic",
    "CausalLMPolicy",
    "build_causal_lm",
    "build_causal_lm_critic",
    "build_qwen2_tokenizer",
    "build_tiny_qwen2",
    "load_tokenizer",
]


def __getattr__(name: str) -> Any:
    # AllowedTokensLogitsProcessor subclasses a transformers class: loaded on first access, so
    # that importing this package does not import transformers.
    if name == "AllowedTokensLogitsProcessor":
        from policies.causal_lm.logits import AllowedTokensLogitsProcessor

        return AllowedTokensLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
