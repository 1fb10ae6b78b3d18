"""Published OpenVLA / OpenVLA-OFT checkpoints: reading, name mapping, writing.

Assumed published layout (``openvla/openvla-7b`` on the HF hub, written with transformers
4.40 and timm 0.9; the OpenVLA-OFT fine-tunes, e.g. ``moojink/openvla-7b-oft-finetuned-*``
and SimpleVLA-RL's OFT SFT models, use the same ``OpenVLAForActionPrediction`` names).
These names were read off the code that writes and reads the published files (OpenVLA's HF
converter and modeling code, OpenVLA-OFT's training and evaluation scripts, vLLM's OpenVLA
loader), not off a downloaded checkpoint (nothing is downloaded here).

``config.json``::

    {"model_type": "openvla", "architectures": ["OpenVLAForActionPrediction"],
     "use_fused_vision_backbone": true, "vision_backbone_id": "dinosiglip-vit-so-224px",
     "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
     "image_sizes": [224, 224], "timm_override_act_layers": [null, null],
     "llm_backbone_id": "llama2-7b-pure", "arch_specifier": "no-align+fused-gelu-mlp",
     "text_config": {"model_type": "llama", "vocab_size": 32064, "pad_token_id": 32000, ...},
     "pad_to_multiple_of": 64, "n_action_bins": 256,
     "norm_stats": {"<dataset>": {"action": {"q01": [...], "q99": [...], "mask": [...], ...},
                                  "proprio": {...}}}}

``text_config`` lists only what differs from ``LlamaConfig``'s defaults (which are Llama-2-7B's
shape), exactly as the HF port builds its LM. OFT checkpoints add ``dataset_statistics.json``
(same structure as ``norm_stats``); where it exists its datasets replace ``norm_stats``, as
OFT's evaluation loader does (``config.json`` then still lists the base model's pretraining
datasets, which are not the fine-tune's).

Weights (``model.safetensors`` or shards + ``model.safetensors.index.json``)::

    vision_backbone.featurizer.{cls_token, reg_token, pos_embed, patch_embed.proj.*, norm.*}
    vision_backbone.featurizer.blocks.{i}.{norm1, attn.qkv, attn.proj, ls1.scale_factor,
                                           norm2, mlp.fc1, mlp.fc2, ls2.scale_factor}.*
    vision_backbone.fused_featurizer.{pos_embed, patch_embed.proj.*, norm.*, blocks.{i}.*,
                                      attn_pool.{latent, q, kv, proj, norm, mlp.fc1, mlp.fc2}.*}
    projector.{fc1, fc2, fc3}.{weight, bias}
    language_model.model.embed_tokens.weight, language_model.model.norm.weight,
    language_model.model.layers.{i}.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
                                     input_layernorm, post_attention_layernorm}.weight
    language_model.lm_head.weight

Differences to our modules: everything above lives under ``vla.``; timm's LayerScale
parameter ``gamma`` is published as ``scale_factor`` (Prismatic renamed it because older
transformers rewrote parameters named ``gamma`` when loading); rotary ``inv_freq`` entries,
if a checkpoint has them, are recomputed instead of loaded.

Ours only: a ``config.json`` with ``"vision_backbone": "efficientnet_lite0"`` (and
``use_fused_vision_backbone: false``, ``timm_model_ids: []``) is the ``tiny_libero_effnet``
preset's single EfficientNet-Lite0 tower, weights ``vision_backbone.{_conv_stem, _bn0,
_blocks.{i}}.*`` (``policies/openvla/efficientnet_tower.py``); a config without the key is the
published fused backbone. Also ours, written by :func:`save_checkpoint` under these top-level
names:
``proprio_projector.{fc1, fc2}.*``, ``action_head.*``, ``action_log_std``, ``value_head.*``.
The OpenVLA-OFT releases keep their action head and proprio projector in separate ``.pt``
files instead, read by ``policies/openvla_oft/published.py``.

The policy's normalisation buffers (``normalizer.*``, see ``policies/normalization.py``) are
not weights of the published layout: they are filled from the statistics when a checkpoint is
read, and :func:`save_checkpoint` writes them as ``dataset_statistics.json``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from policies.folder_layout import (
    CONFIG_FILE,
    INDEX_FILE,
    STATISTICS_FILE,
    WEIGHTS_FILE,
    is_statistics_buffer,
)
from policies.openvla.configuration import FUSED_VIT, VLAArchitecture

logger = logging.getLogger(__name__)
VLA_PREFIXES = ("vision_backbone.", "projector.", "language_model.")
_LAYER_SCALE = ((".ls1.gamma", ".ls1.scale_factor"), (".ls2.gamma", ".ls2.scale_factor"))


def to_published_name(name: str) -> str:
    """Our state-dict name -> the published checkpoint's name."""
    if name.startswith("vla."):
        name = name[len("vla.") :]
        for ours, published in _LAYER_SCALE:
            if name.endswith(ours):
                name = name[: -len(ours)] + published
    return name


def from_published_name(name: str) -> str | None:
    """Published name -> ours; ``None`` for entries that are recomputed, not loaded."""
    if name.endswith("rotary_emb.inv_freq"):
        return None
    if name.startswith(VLA_PREFIXES):
        for ours, published in _LAYER_SCALE:
            if name.endswith(published):
                name = name[: -len(published)] + ours
        return "vla." + name
    return name


@dataclass
class Checkpoint:
    """What a checkpoint directory says before any weight is read.

    Attributes:
        folder: the directory.
        config: its ``config.json``.
        architecture: the model to build.
        norm_stats: dataset statistics (``dataset_statistics.json``, else ``config.json``'s
            ``norm_stats``), or ``None``.
    """

    folder: Path
    config: Mapping[str, Any]
    architecture: VLAArchitecture
    norm_stats: dict[str, Any] | None


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read ``config.json`` (and ``dataset_statistics.json``) of a local checkpoint."""
    folder = Path(path).expanduser()
    config_file = folder / CONFIG_FILE
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{folder} has no {CONFIG_FILE}; point path at a local OpenVLA checkpoint directory "
            "(config.json + *.safetensors + tokenizer files); nothing is downloaded"
        )
    config = json.loads(config_file.read_text())
    stats = dict(config.get("norm_stats") or {})
    if (folder / STATISTICS_FILE).is_file():  # replaces them, as OFT's loader does
        stats = dict(json.loads((folder / STATISTICS_FILE).read_text()))
    return Checkpoint(folder, config, architecture_from_config(config), stats or None)


def architecture_from_config(config: Mapping[str, Any]) -> VLAArchitecture:
    """The architecture a published ``config.json`` describes."""
    backbone = config.get("vision_backbone", FUSED_VIT)  # published configs have none
    if backbone == FUSED_VIT and not config.get("use_fused_vision_backbone", False):
        raise ValueError(
            "only fused DINOv2 + SigLIP checkpoints (use_fused_vision_backbone: true, as "
            "OpenVLA and OpenVLA-OFT) are supported"
        )
    missing = [k for k in ("timm_model_ids", "image_sizes", "text_config") if k not in config]
    if missing:
        raise ValueError(f"checkpoint config.json lacks {missing}; is it an OpenVLA checkpoint?")
    text = {k: v for k, v in config["text_config"].items() if k not in _CONFIG_METADATA}
    return VLAArchitecture(
        timm_model_ids=tuple(config["timm_model_ids"]),
        image_sizes=tuple(int(s) for s in config["image_sizes"]),
        text_config=text,
        timm_override_act_layers=tuple(config.get("timm_override_act_layers") or (None, None)),
        pad_to_multiple_of=int(config.get("pad_to_multiple_of", 64)),
        n_action_bins=int(config.get("n_action_bins", 256)),
        vision_backbone=backbone,
    )


_CONFIG_METADATA = frozenset(
    {"model_type", "torch_dtype", "dtype", "transformers_version", "architectures", "_name_or_path"}
)


def architecture_to_config(arch: VLAArchitecture) -> dict[str, Any]:
    """The published ``config.json`` fields describing ``arch`` (a ``vision_backbone`` key
    only for a backbone other than the published fused one, whose files stay as they were)."""
    fused = arch.vision_backbone == FUSED_VIT
    return {
        "model_type": "openvla",
        "architectures": ["OpenVLAForActionPrediction"],
        "use_fused_vision_backbone": fused,
        **({} if fused else {"vision_backbone": arch.vision_backbone}),
        "timm_model_ids": list(arch.timm_model_ids),
        "image_sizes": list(arch.image_sizes),
        "timm_override_act_layers": list(arch.timm_override_act_layers),
        "text_config": {"model_type": "llama", **dict(arch.text_config)},
        "pad_to_multiple_of": arch.pad_to_multiple_of,
        "n_action_bins": arch.n_action_bins,
    }


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint: the shards its index names, else every ``*.safetensors``."""
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(folder / name), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                tensors[key] = handle.get_tensor(key)
    return tensors


def load_weights(policy: nn.Module, folder: Path) -> None:
    """Load a published checkpoint into ``policy`` (typically built on the meta device).

    Besides the safetensors, the tensors of ``policy.published_extras(folder)`` (OpenVLA-OFT's
    action head and proprio projector files) are loaded, and parameters no file holds take
    ``policy.unpublished_defaults()`` (OFT's ``action_log_std``), with a warning that says so.
    Every parameter must be in the checkpoint and every checkpoint entry must be used; the
    error names both lists. The normalisation buffers are the exception: they come from the
    checkpoint's statistics (set when the policy was constructed), not from its weights. Tensors are assigned (no copy, no random init needed); the LM's
    rotary frequencies, the only non-persistent buffers, are recomputed on the CPU.
    """
    mapped = {}
    for key, value in read_state_dict(folder).items():
        ours = from_published_name(key)
        if ours is not None:
            mapped[ours] = value
    extras = policy.published_extras(folder)  # e.g. OFT's action head file
    both = sorted(set(extras) & set(mapped))
    if both:
        raise ValueError(f"{folder}: {_head(both)} are in its safetensors and in a side file")
    mapped.update(extras)
    for name, value in policy.unpublished_defaults().items():
        if name not in mapped:
            logger.warning(
                "%s: %s is in no file of the checkpoint; starts at %s", folder, name, value.tolist()
            )
            mapped[name] = value
    expected = {k for k in policy.state_dict() if not is_statistics_buffer(k)}
    missing, unexpected = sorted(expected - set(mapped)), sorted(set(mapped) - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {_head(missing)}, unexpected "
            f"{_head(unexpected)} (names as in our modules; see policies/openvla/loading.py). "
            "Options such as use_proprio / use_continuous_head must match what was trained."
        )
    # Not strict: the normalisation buffers keep what the statistics files set.
    policy.load_state_dict(mapped, strict=False, assign=True)
    _rebuild_rotary_embeddings(policy)
    on_meta = [n for n, t in [*policy.named_parameters(), *policy.named_buffers()] if t.is_meta]
    if on_meta:
        raise RuntimeError(f"tensors left uninitialised after loading {folder}: {_head(on_meta)}")


def _rebuild_rotary_embeddings(policy: nn.Module) -> None:
    for name, module in list(policy.named_modules()):
        if name.endswith("rotary_emb") and getattr(module, "inv_freq", None) is not None:
            if module.inv_freq.is_meta:
                parent = policy.get_submodule(name.rsplit(".", 1)[0])
                with torch.device("cpu"):
                    parent.rotary_emb = type(module)(module.config)


def _head(names: list[str], count: int = 8) -> str:
    more = f" ... ({len(names)} in all)" if len(names) > count else ""
    return f"{names[:count]}{more}"


def save_checkpoint(
    policy: nn.Module,
    folder: str | os.PathLike[str],
    architecture: VLAArchitecture,
    statistics: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    shard_size: int | None = None,
    config_extras: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``policy`` in the published layout (config.json, safetensors, tokenizer).

    Args:
        policy: the policy module (our names; see :func:`to_published_name`).
        folder: output directory (created).
        architecture: written to ``config.json``.
        statistics: ``{dataset_name: {"action": ..., "proprio": ...}}``, written as
            ``dataset_statistics.json`` (OpenVLA-OFT's file); the normalisation buffers are
            left out of the weights.
        tokenizer: saved with ``save_pretrained`` when given, so the folder loads as ``path``.
        shard_size: tensors per shard; ``None`` writes one ``model.safetensors``.
        config_extras: more ``config.json`` keys (OFT's ``num_images_in_input``).

    Returns:
        The folder.
    """
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        to_published_name(k): v.detach().cpu().contiguous()
        for k, v in policy.state_dict().items()
        if not is_statistics_buffer(k)
    }
    if shard_size is None:
        save_file(tensors, str(out / WEIGHTS_FILE))
    else:
        names = sorted(tensors)
        shards = [names[i : i + shard_size] for i in range(0, len(names), shard_size)]
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file({k: tensors[k] for k in shard}, str(out / file))
            weight_map.update(dict.fromkeys(shard, file))
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {**architecture_to_config(architecture), **dict(config_extras or {})}
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    if statistics:
        (out / STATISTICS_FILE).write_text(json.dumps(dict(statistics), indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out
