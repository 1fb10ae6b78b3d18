"""Building a VLA policy (OpenVLA or OpenVLA-OFT) from a tiny preset or a local checkpoint.

The presets are random-init architectures with their prompt tokenizers, for tests and CPU
runs (``tiny_libero_effnet``'s vision tower is the pretrained EfficientNet-Lite0 instead); a checkpoint is a folder in the published layout (``loading.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from policies.causal_lm.tokenizer import build_qwen2_tokenizer, load_tokenizer
from policies.openvla.configuration import (
    TINY_ARCHITECTURE,
    TINY_LIBERO_64_ARCHITECTURE,
    TINY_LIBERO_ARCHITECTURE,
    TINY_LIBERO_EFFNET_ARCHITECTURE,
    VLAOptions,
)
from policies.openvla.libero_words import build_libero_word_tokenizer
from policies.openvla.loading import load_weights, read_checkpoint
from policies.openvla.policy_base import VLAPolicyBase
from policies.openvla.preprocessor import PREPROCESSOR_FILE, read_preprocessing
from policies.openvla.prismatic import PrismaticVLA

if TYPE_CHECKING:  # type only: importing ``policies`` must not import transformers
    from transformers import PreTrainedTokenizerBase

# Preset name -> (architecture, its prompt tokenizer); keys are configuration.PRESETS.
PRESET_BUILDS = {
    "tiny": (TINY_ARCHITECTURE, build_qwen2_tokenizer),
    "tiny_libero": (TINY_LIBERO_ARCHITECTURE, build_libero_word_tokenizer),
    "tiny_libero_64": (TINY_LIBERO_64_ARCHITECTURE, build_libero_word_tokenizer),
    "tiny_libero_effnet": (TINY_LIBERO_EFFNET_ARCHITECTURE, build_libero_word_tokenizer),
}


def build_policy(cls: type[VLAPolicyBase], options: VLAOptions, device: torch.device) -> Any:
    """Build ``cls(vla, tokenizer, options, norm_stats)`` from a preset or a checkpoint.

    Presets are random-init under ``options.seed`` (without touching the global RNG), so all
    ranks build identical replicas. Checkpoints are built on the meta device (no random
    init of 7B parameters) and their tensors assigned.
    """
    if options.preset is not None:
        architecture, build_tokenizer = PRESET_BUILDS[options.preset]
        tokenizer = _tokenizer(options.tokenizer_path) or build_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(options.seed)
            policy = cls(PrismaticVLA(architecture), tokenizer, options, None)
    else:
        checkpoint = read_checkpoint(options.path)
        tokenizer = _tokenizer(options.tokenizer_path) or load_tokenizer(checkpoint.folder)
        with torch.device("meta"):
            vla = PrismaticVLA(checkpoint.architecture)
            policy = cls(vla, tokenizer, options, checkpoint.norm_stats)
        load_weights(policy, checkpoint.folder)
        _use_processor_normalization(policy, checkpoint.folder, checkpoint.architecture.image_size)
    rows = policy.vla.language_model.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise ValueError(f"tokenizer has {len(tokenizer)} ids, the LM only {rows} output rows")
    policy.to(device=device, dtype=options.torch_dtype)
    if options.gradient_checkpointing:
        policy.vla.language_model.gradient_checkpointing_enable()
    return policy.eval()


def _use_processor_normalization(policy: VLAPolicyBase, folder: Path, image_size: int) -> None:
    """The towers' mean / std from the checkpoint's ``preprocessor_config.json``, if it has one
    (the values the published models were trained with: ``preprocessor.py``)."""
    towers = read_preprocessing(folder, image_size)
    if towers is None:
        return
    backbone = policy.vla.vision_backbone
    if not hasattr(backbone, "set_normalization"):
        raise ValueError(
            f"{folder} has {PREPROCESSOR_FILE} for two ViT towers, but its vision backbone is "
            f"{type(backbone).__name__}; remove the file or the backbone setting"
        )
    backbone.set_normalization(towers)


def _tokenizer(path: str | None) -> PreTrainedTokenizerBase | None:
    return None if path is None else load_tokenizer(path)
