"""A word-level tokenizer of LIBERO's instructions, for the ``tiny_libero`` VLA preset.

The ``tiny`` preset reads prompts with the Qwen2.5 tokenizer: 151646 ids, so 19.5 M of its
19.8 M parameters are embedding and LM-head rows, and a checkpoint is 80 MB of weights that no
LIBERO prompt ever touches. Every word of the 130 LIBERO tasks (spatial, object, goal, 10, 90)
plus OpenVLA's prompt template fits in 91 ids, which makes a whole trained VLA 1.6 MB of
weights: small enough to ship under ``assets/``. Words outside the list map to ``[UNK]`` (instructions
of other benchmarks still run; they just cannot be told apart by their unknown words).

The list is fixed in code rather than read from the LIBERO package at run time so that token
ids never change under a checkpoint; ``tests/policies/test_libero_words.py`` checks that it
covers every LIBERO instruction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# tokenizers and transformers are imported where the tokenizer is built: the vocabulary is
# read by the options (configuration.py), which importing ``policies`` loads.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)
# OpenVLA's prompt "In: What action should the robot take to {instruction}?\nOut:", lowercased
# and split into words and punctuation (policies/openvla/prompt.py PROMPT).
PROMPT_WORDS = ("in", ":", "what", "action", "should", "the", "robot", "take", "to", "?", "out")
# Every lowercased word of the instructions of libero_spatial, libero_object, libero_goal,
# libero_10 and libero_90 (130 tasks).
LIBERO_WORDS = (
    "alphabet", "and", "at", "back", "basket", "bbq", "between", "black", "book", "both",
    "bottle", "bottom", "bowl", "box", "butter", "cabinet", "caddy", "center", "cheese",
    "chocolate", "close", "compartment", "cookie", "cream", "drawer", "dressing", "from",
    "front", "frying", "in", "inside", "it", "juice", "ketchup", "left", "microwave", "middle",
    "milk", "moka", "mug", "next", "of", "off", "on", "open", "orange", "pan", "pick", "place",
    "plate", "pot", "pots", "pudding", "push", "put", "rack", "ramekin", "red", "right", "salad",
    "sauce", "shelf", "soup", "stack", "stove", "table", "the", "them", "to", "tomato", "top",
    "tray", "turn", "under", "up", "white", "wine", "wooden", "yellow",
)  # fmt: skip


def libero_vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens (ids 0-3), then the words in a fixed order."""
    tokens = list(SPECIAL_TOKENS)
    for word in PROMPT_WORDS + LIBERO_WORDS:
        if word not in tokens:
            tokens.append(word)
    return {token: i for i, token in enumerate(tokens)}


def build_libero_word_tokenizer() -> PreTrainedTokenizerFast:
    """Lowercasing word-level tokenizer over :func:`libero_vocabulary` (about 100 ids).

    Words and punctuation runs are split apart (``"to?"`` -> ``["to", "?"]``); the tokenizer
    has a BOS token, so prompts start with it as OpenVLA's do.
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(WordLevel(vocab=libero_vocabulary(), unk_token=UNK))
    model.normalizer = normalizers.Lowercase()
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token=PAD, unk_token=UNK, bos_token=BOS, eos_token=EOS
    )
