"""``embodied-rl inspect <folder>``: what a checkpoint folder holds and how to use it.

Read from the folder's files only (``config.json``, safetensors headers, the names and, for
the proprio size, the tensors of OpenVLA-OFT's side files); no weights are loaded and nothing
is downloaded. Kinds recognised: an OpenVLA / OpenVLA-OFT checkpoint (``model_type:
openvla``, the published layout of ``policies/openvla/loading.py`` and the side files of
``policies/openvla_oft/published.py``), a V-JEPA 2 model (``model_type: vjepa2``), a
Hugging Face causal LM (``*ForCausalLM``), and a run folder of ``embodied-rl train``. Each
gets its facts and the exact overrides that train or evaluate it; anything else is refused
with the reason.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied_rl.runtime.config_errors import ConfigError
from policies.folder_layout import CONFIG_FILE, STATISTICS_FILE
from policies.openvla.preprocessor import PREPROCESSOR_FILE
from policies.openvla_oft.published import IMAGES_KEY, side_file, trained_parts

# Images per step of the published OFT LIBERO fine-tunes (third-person + wrist); their
# config.json does not record it, their evaluation script is given it.
OFT_LIBERO_IMAGES = 2


@dataclass
class Description:
    """What :func:`describe` found: a title, ``(fact, value)`` lines, the overrides that use
    the folder, and warnings (things that load but would not act as trained)."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def text(self) -> str:
        width = max((len(k) for k, _ in self.facts), default=0)
        lines = [self.title, *(f"  {k:<{width}}  {v}" for k, v in self.facts)]
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.overrides:
            lines += ["to train or evaluate it, add:", "  " + " ".join(self.overrides)]
        return "\n".join(lines)


def tensor_census(folder: Path) -> tuple[int, Counter[str]]:
    """Parameters (sum of the tensors' element counts) and dtypes of a folder's safetensors,
    from the file headers."""
    from safetensors import safe_open

    count, dtypes = 0, Counter()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                elements = 1
                for side in piece.get_shape():
                    elements *= int(side)
                count += elements
                dtypes[str(piece.get_dtype()).lower()] += elements
    return count, dtypes


def _size(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return str(count)


def _main_dtype(dtypes: Counter[str]) -> str | None:
    """The dtype most elements have, in the option's spelling (``bfloat16``, ...)."""
    if not dtypes:
        return None
    name = dtypes.most_common(1)[0][0]
    return {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}.get(name, name)


def describe_vla(folder: Path, config: dict[str, Any]) -> Description:
    """An OpenVLA / OpenVLA-OFT checkpoint (see the module docstring)."""
    from policies.openvla.loading import architecture_from_config

    arch = architecture_from_config(config)  # refuses a backbone we do not build
    parts = trained_parts(folder)
    # OFT's own files (side files, dataset_statistics.json) or the image count OFT records
    oft = any(parts.values()) or (folder / STATISTICS_FILE).is_file() or IMAGES_KEY in config
    policy = "openvla_oft" if oft else "openvla"
    out = Description(f"{folder}: {'OpenVLA-OFT' if oft else 'OpenVLA'} checkpoint")
    text = arch.text_config
    towers = " + ".join(arch.timm_model_ids) or arch.vision_backbone
    out.facts.append(("vision", f"{towers} at {arch.image_size} px"))
    layers, width = text.get("num_hidden_layers", 32), text.get("hidden_size", 4096)
    out.facts.append(("language model", f"Llama, {layers} layers, width {width}"))
    head = parts["use_continuous_head"]
    out.facts.append(("action head", f"L1 regression ({head})" if head else "action tokens"))
    proprio = parts["use_proprio"]
    out.facts.append(("proprio", f"{_proprio_dim(folder)}-d ({proprio})" if proprio else "none"))
    images = config.get(IMAGES_KEY)
    if images is None:
        said = "not recorded in config.json"
        if oft:
            said += f"; the OFT LIBERO fine-tunes take {OFT_LIBERO_IMAGES} (agentview + wrist)"
            out.warnings.append(
                f"config.json does not say how many images the model was trained on: add "
                f"++models.actor.options.{IMAGES_KEY}={OFT_LIBERO_IMAGES} (and "
                "++data.cameras=[agentview,wrist] for SFT) for a model trained on two, as the "
                "OFT LIBERO fine-tunes are; one image otherwise"
            )
        out.facts.append(("images per step", said))
    elif int(images) > 1:
        said = f"{images} (agentview + wrist; SFT on demonstrations adds data.cameras=[agentview,wrist])"
        out.facts.append(("images per step", said))
    else:
        out.facts.append(("images per step", str(images)))
    if (folder / PREPROCESSOR_FILE).is_file():
        out.facts.append(("image processor", f"{PREPROCESSOR_FILE} (its mean / std)"))
    else:
        out.facts.append(("image processor", "none: the towers' own mean / std"))
    stats = _statistics(folder, config)
    out.facts.append(("statistics", ", ".join(stats) if stats else "none"))
    count, dtypes = tensor_census(folder)
    dtype = _main_dtype(dtypes)
    out.facts.append(("parameters", f"{_size(count)} in the safetensors ({dtype})"))
    if (folder / "lora_adapter").is_dir():
        out.facts.append(("not read", "lora_adapter/ (its adapter is merged into the weights)"))
    where = "models.actor"
    # `++` adds the key or overrides it: a config's file lists only some of a policy's options
    # (a plain `options.path=` is refused there as an unknown key).
    out.overrides = [f"{where}.policy={policy}", f"++{where}.options.preset=null"]
    out.overrides.append(f"++{where}.options.path={folder}")
    if oft:
        out.overrides.append(f"++{where}.options.use_continuous_head={str(bool(head)).lower()}")
        out.overrides.append(f"++{where}.options.use_proprio={str(bool(proprio)).lower()}")
        out.overrides.append(f"++{where}.options.center_crop=true")
        if images is not None:
            out.overrides.append(f"++{where}.options.{IMAGES_KEY}={int(images)}")
        if images is not None and int(images) > 1:
            out.overrides.append("simulator.options.cameras=[agentview,wrist]")
    if len(stats) > 1:
        out.overrides.append(f"++{where}.options.unnorm_key=<one of the statistics above>")
    if dtype in ("bfloat16", "float16"):
        out.overrides.append(f"++{where}.options.dtype={dtype}")
    return out


def _statistics(folder: Path, config: dict[str, Any]) -> list[str]:
    """Dataset names of the statistics the loader uses (``dataset_statistics.json`` replaces
    ``config.json``'s ``norm_stats``)."""
    path = folder / STATISTICS_FILE
    if path.is_file():
        return sorted(json.loads(path.read_text()))
    return sorted(config.get("norm_stats") or {})


def _proprio_dim(folder: Path) -> int | str:
    """The proprio size the projector reads: its ``fc1`` input width."""
    import torch

    path = side_file(folder, "proprio_projector")
    if path is None:
        return "?"
    state = torch.load(path, map_location="cpu", weights_only=True)
    weights = [v for k, v in state.items() if k.endswith("fc1.weight")]
    return int(weights[0].shape[1]) if weights else "?"


def describe_vjepa2(folder: Path, config: dict[str, Any]) -> Description:
    """A ``VJEPA2Model`` folder: its size and the clip the encoder feeds it."""
    out = Description(f"{folder}: V-JEPA 2 video model")
    hidden, layers = config.get("hidden_size"), config.get("num_hidden_layers")
    crop, frames = config.get("crop_size"), config.get("frames_per_clip")
    out.facts.append(("encoder", f"{layers} layers, width {hidden} (the embedding size)"))
    out.facts.append(("clip", f"{frames} frames, crop {crop}, patch {config.get('patch_size')}"))
    count, dtypes = tensor_census(folder)
    out.facts.append(("parameters", f"{_size(count)} ({_main_dtype(dtypes)})"))
    where = "models.video_encoder"
    out.overrides = [f"{where}.policy=video_encoder.vjepa2", f"++{where}.options.path={folder}"]
    return out


def describe_causal_lm(folder: Path, config: dict[str, Any]) -> Description:
    out = Description(f"{folder}: {config['architectures'][0]} (a Hugging Face causal LM)")
    count, dtypes = tensor_census(folder)
    out.facts.append(("model type", str(config.get("model_type"))))
    out.facts.append(("parameters", f"{_size(count)} ({_main_dtype(dtypes)})"))
    where = "models.actor"
    out.overrides = [f"{where}.policy=causal_lm", f"++{where}.options.preset=null"]
    out.overrides.append(f"++{where}.options.path={folder}")
    return out


def describe_run(folder: Path) -> Description:
    """A run folder of ``embodied-rl train``: its trained models and the newest checkpoint."""
    from omegaconf import OmegaConf

    from embodied_rl import checkpoint

    cfg = OmegaConf.load(folder / "config.yaml")
    latest = checkpoint.latest_checkpoint(folder / "checkpoints")
    out = Description(f"{folder}: a run of embodied-rl train ({cfg.get('name')})")
    out.facts.append(("newest checkpoint", str(latest.name) if latest else "none"))
    for name, spec in (cfg.get("models") or {}).items():
        if spec.get("trainable", True):
            out.facts.append((f"models.{name}", f"{spec.policy} {dict(spec.get('options') or {})}"))
            out.overrides.append(f"++models.{name}.init_from={folder}")
    if latest is None:
        out.warnings.append("no complete checkpoint: init_from refuses it")
    return out


def describe(path: str | Path) -> Description:
    """Describe a folder (see the module docstring).

    Raises:
        ConfigError: not a folder, or one no policy or encoder here loads, with the reason.
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a directory", "give a checkpoint or run folder")
    if (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir():
        return describe_run(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise ConfigError(
            f"{folder} has no {CONFIG_FILE} (nor a run's config.yaml and checkpoints/)",
            "point at a Hugging Face checkpoint folder or a run folder",
        )
    config = json.loads((folder / CONFIG_FILE).read_text())
    if not any(folder.glob("*.safetensors")):
        raise ConfigError(
            f"{folder} holds no *.safetensors weights (only safetensors are read)",
            "convert the weights to safetensors (save_pretrained(safe_serialization=True))",
        )
    kind = config.get("model_type")
    try:
        if kind == "openvla":
            return describe_vla(folder, config)
        if kind == "vjepa2":
            return describe_vjepa2(folder, config)
    except ValueError as err:
        raise ConfigError(
            f"{folder}: {err}", "use a checkpoint of a supported architecture"
        ) from None
    if any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
        return describe_causal_lm(folder, config)
    raise ConfigError(
        f"{folder}: config.json has model_type {kind!r}, which no policy or encoder here loads",
        "use an OpenVLA / OpenVLA-OFT, V-JEPA 2 or causal-LM checkpoint",
    )
