"""The LIBERO word tokenizer and the ``tiny_libero`` VLA presets that read prompts with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.openvla.configuration import (
    TINY_ARCHITECTURE,
    TINY_LIBERO_64_ARCHITECTURE,
    TINY_LIBERO_ARCHITECTURE,
)
from policies.openvla.libero_words import UNK, build_libero_word_tokenizer, libero_vocabulary
from policies.openvla.prompt import PROMPT, PromptEncoder
from policies.openvla_oft.modeling import build_openvla_oft
from tests.simulators.libero_common import requires_libero

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def test_prompt_ids_by_hand():
    tokenizer = build_libero_word_tokenizer()
    vocab = libero_vocabulary()
    assert [vocab[t] for t in ("[PAD]", "[UNK]", "[BOS]", "[EOS]")] == [0, 1, 2, 3]
    prompts = PromptEncoder(tokenizer)
    ids = prompts.text_ids("Pick up the KETCHUP and place it in the basket")
    words = "in : what action should the robot take to pick up the ketchup and place it in"
    words += " the basket ? out :"
    assert ids == [vocab[w] for w in words.split()]  # lowercased, punctuation split off
    assert prompts.start_id == vocab["[BOS]"] and prompts.space_id is None
    unknown = tokenizer(PROMPT.format("pick up the zebra"), add_special_tokens=False)
    assert vocab[UNK] in unknown["input_ids"]


def test_the_preset_has_room_for_the_words_and_the_action_ids():
    """Tokenizer ids, then the 256 action ids, then the 64 padding rows; the rest as ``tiny``."""
    words = len(build_libero_word_tokenizer())
    arch = TINY_LIBERO_ARCHITECTURE
    assert arch.vocab_size - arch.n_action_bins == words
    assert arch.padded_vocab_size == words + arch.n_action_bins + arch.pad_to_multiple_of
    assert arch.timm_model_ids == TINY_ARCHITECTURE.timm_model_ids
    assert arch.image_sizes == TINY_ARCHITECTURE.image_sizes
    changed = {
        k for k in arch.text_config if arch.text_config[k] != TINY_ARCHITECTURE.text_config[k]
    }
    assert changed == {"vocab_size", "pad_token_id"}


def test_the_preset_is_the_tiny_vla_without_the_qwen_rows():
    options = {"use_continuous_head": True, "use_proprio": True, "chunk": 8}
    tiny = build_openvla_oft({**options, "preset": "tiny"}, "cpu")
    small = build_openvla_oft({**options, "preset": "tiny_libero"}, "cpu")
    rows = TINY_ARCHITECTURE.padded_vocab_size - TINY_LIBERO_ARCHITECTURE.padded_vocab_size
    width = TINY_ARCHITECTURE.text_config["hidden_size"]

    def count(policy):
        return sum(p.numel() for p in policy.parameters())

    assert count(tiny) - count(small) == 2 * rows * width  # embedding and LM head rows
    assert count(small) == 392_346


def test_the_64_px_preset_reads_64_patch_tokens_with_the_same_weights_otherwise():
    """``tiny_libero_64`` = ``tiny_libero`` with 8 x 8 patches of 8 px: the rendered 64 px
    frame reaches the towers unresized, the LM reads 64 image tokens instead of 16, and only
    the two towers' position embeddings grow (48 more rows, widths 32 and 48)."""
    assert TINY_LIBERO_64_ARCHITECTURE.image_sizes == (64, 64)
    assert TINY_LIBERO_64_ARCHITECTURE.text_config == TINY_LIBERO_ARCHITECTURE.text_config
    options = {"use_continuous_head": True, "use_proprio": True, "chunk": 8, "center_crop": False}
    small = build_openvla_oft({**options, "preset": "tiny_libero"}, "cpu")
    large = build_openvla_oft({**options, "preset": "tiny_libero_64"}, "cpu")

    def count(policy):
        return sum(p.numel() for p in policy.parameters())

    assert count(large) - count(small) == (64 - 16) * (32 + 48)
    images = np.random.default_rng(0).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    pixels = large.pixel_values(images)  # (2, 6, 64, 64): both towers' normalisations
    mean = torch.tensor(large.vla.vision_backbone.pixel_mean)[:3, None, None]
    std = torch.tensor(large.vla.vision_backbone.pixel_std)[:3, None, None]
    raw = torch.as_tensor(images[1]).permute(2, 0, 1).float() / 255
    torch.testing.assert_close(pixels[1, :3], (raw - mean) / std)
    assert small.pixel_values(images).shape[-1] == 32
    assert small.vla.image_tokens(small.pixel_values(images)).shape[1] == 16
    assert large.vla.image_tokens(pixels).shape[1] == 64


@pytest.mark.libero
@requires_libero
def test_every_libero_instruction_is_known_word_for_word():
    from libero.libero import benchmark

    tokenizer = build_libero_word_tokenizer()
    unknown = set()
    for suite in SUITES:
        tasks = benchmark.get_benchmark_dict()[suite]()
        for i in range(tasks.n_tasks):
            ids = tokenizer(PROMPT.format(tasks.get_task(i).language), add_special_tokens=False)
            tokens = tokenizer.convert_ids_to_tokens(ids["input_ids"])
            words = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(
                PROMPT.format(tasks.get_task(i).language).lower()
            )
            unknown |= {w for (w, _), t in zip(words, tokens) if t == UNK}
    assert unknown == set()
