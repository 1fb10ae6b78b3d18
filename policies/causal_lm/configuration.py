"""Configuration of the causal-LM policy (kept beside the model, LeRobot-style)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from embodied_rl.checks import check_range, options_dataclass

PRESETS = ("tiny_qwen2",)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class CausalLMConfig:
    """Options of the ``causal_lm`` policy.

    Attributes:
        preset: a tiny random-init model built from code (``"tiny_qwen2"``), for tests and
            CPU runs. Set it to ``None`` when loading weights with ``path``.
        path: local HF checkpoint directory (``config.json`` + safetensors + tokenizer),
            loaded with ``local_files_only=True``. Mutually exclusive with ``preset``.
        tokenizer_path: local tokenizer directory overriding the tokenizer of ``path`` (or
            the Qwen2.5 tokenizer of the presets).
        trust_remote_code: allow model/tokenizer code shipped in ``path`` to run.
        dtype: parameter dtype: ``float32``, ``bfloat16`` or ``float16``.
        allowed_response_tokens: constrained decoding. Strings that must each be one token;
            when set, the policy can only emit them and EOS, both in ``generate`` and in the
            distribution ``evaluate`` scores (renormalised over that set).
        seed: seed of the random init of presets; equal on every rank so that all
            data-parallel replicas start from the same weights.
        gradient_checkpointing: recompute activations in backward to save memory.
    """

    preset: str | None = "tiny_qwen2"
    path: str | None = None
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    dtype: str = "float32"
    allowed_response_tokens: list[str] | None = None
    seed: int = 0
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        check_range("causal_lm seed", self.seed, 0)
        if self.preset is not None and self.path is not None:
            raise ValueError(
                f"causal_lm policy got both preset={self.preset!r} and path={self.path!r}; "
                "set preset: null to load the checkpoint at path, or drop path to use the preset"
            )
        if self.preset is None and self.path is None:
            raise ValueError(
                f"causal_lm policy needs a preset (one of {list(PRESETS)}) or a local "
                "checkpoint path; set one of them"
            )
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(
                f"unknown causal_lm preset {self.preset!r}; valid presets: {list(PRESETS)}, "
                "or set preset: null and path: <local checkpoint dir>"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"causal_lm dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
        self._check_allowed_tokens()

    def _check_allowed_tokens(self) -> None:
        if self.allowed_response_tokens is None:
            return
        if isinstance(self.allowed_response_tokens, str):
            raise ValueError(
                "allowed_response_tokens must be a list of strings, got the string "
                f"{self.allowed_response_tokens!r}; write it as a list, e.g. ['0', '1']"
            )
        # Hydra hands over ListConfig; a plain list keeps the dataclass picklable.
        tokens = list(self.allowed_response_tokens)
        if not tokens:
            raise ValueError(
                "allowed_response_tokens is empty; set it to null for an unconstrained policy"
            )
        bad = [t for t in tokens if not isinstance(t, str) or not t]
        if bad:
            raise ValueError(f"allowed_response_tokens must be non-empty strings, got {bad}")
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"allowed_response_tokens has duplicates: {tokens}")
        self.allowed_response_tokens = tokens

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> CausalLMConfig:
        """Build from a mapping of field values; unknown keys are an error naming valid keys."""
        return options_dataclass(cls, options, "causal_lm policy")
