"""Exporters of ``embodied-rl export``: each policy in its Hugging Face layout.

Each writes the built policy (the run's weights and statistics loaded) with the policy's own
``save_pretrained`` and says how the folder loads again (``interfaces.Exported``):

- ``openvla`` / ``openvla_oft``: the published OpenVLA layout (``config.json``,
  ``model.safetensors``, ``dataset_statistics.json``, the tokenizer's files), which the
  policy's ``path`` option reads (``policies/openvla/loading.py``);
- ``causal_lm``: the ``transformers`` layout, for ``AutoModelForCausalLM`` and the
  policy's ``path`` option; ``causal_lm_critic``: the backbone, ``value_head.safetensors``
  and the tokenizer, for ``CausalLMCritic.from_pretrained``;
- ``mlp``: ``config.json``, ``model.safetensors`` and the statistics, for
  ``MLPPolicy.from_pretrained``;
- ``world_model.vjepa2``: a ``VJEPA2Model`` (the EMA target encoder and the predictor), which
  ``video_encoder.vjepa2`` loads with ``path`` as it loads the published V-JEPA 2 weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from embodied_rl.interfaces import Exported
from embodied_rl.registry import EXPORTERS


def _path_options(options: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """The run's options with the folder in place of the preset (and of a tokenizer path:
    the folder holds the tokenizer)."""
    return {**options, "preset": None, "path": str(folder), "tokenizer_path": None}


@EXPORTERS.register("openvla")
@EXPORTERS.register("openvla_oft")
def export_vla(policy: nn.Module, options: Mapping[str, Any], folder: Path) -> Exported:
    """The published OpenVLA / OpenVLA-OFT layout; ``path`` loads it."""
    policy.save_pretrained(folder)
    return Exported(options=_path_options(options, folder))


@EXPORTERS.register("causal_lm")
def export_causal_lm(policy: nn.Module, options: Mapping[str, Any], folder: Path) -> Exported:
    """The ``transformers`` layout with the tokenizer; ``path`` and ``AutoModelForCausalLM``."""
    policy.save_pretrained(folder)
    python = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(folder)!r})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r})"
    )
    return Exported(options=_path_options(options, folder), python=python)


@EXPORTERS.register("causal_lm_critic")
def export_causal_lm_critic(
    policy: nn.Module, options: Mapping[str, Any], folder: Path
) -> Exported:
    """The backbone, the value head and the tokenizer; ``CausalLMCritic.from_pretrained``."""
    policy.save_pretrained(folder)
    python = (
        "from policies.causal_lm import CausalLMCritic\n\n"
        f"critic = CausalLMCritic.from_pretrained({str(folder)!r})"
    )
    return Exported(options=None, python=python)


@EXPORTERS.register("mlp")
def export_mlp(policy: nn.Module, options: Mapping[str, Any], folder: Path) -> Exported:
    """Options, weights and statistics; ``MLPPolicy.from_pretrained``."""
    policy.save_pretrained(folder)
    python = (
        f"from policies.mlp import MLPPolicy\n\npolicy = MLPPolicy.from_pretrained({str(folder)!r})"
    )
    return Exported(options=None, python=python)


@EXPORTERS.register("world_model.vjepa2")
def export_vjepa2_world_model(
    policy: nn.Module, options: Mapping[str, Any], folder: Path
) -> Exported:
    """A ``VJEPA2Model`` folder; the SRPO encoder ``video_encoder.vjepa2`` reads it with the
    same frame count and preprocessing the world model was trained with."""
    policy.save_pretrained(folder)
    opts = policy.options
    frames = {
        "num_frames": opts.num_frames,
        "resize_short": opts.resize_short,
        "crop_size": opts.crop_size,
    }
    python = (
        "from transformers import VJEPA2Model\n\n"
        f"model = VJEPA2Model.from_pretrained({str(folder)!r})"
    )
    encoder = ("video_encoder", "video_encoder.vjepa2", {"path": str(folder), **frames})
    return Exported(
        options={"path": str(folder), **frames},  # world_model.vjepa2: pretrain further
        python=python,
        also={"As SRPO's trajectory encoder (encode.video)": encoder},
    )
