"""OpenVLA-OFT's side files: the L1 action head and the proprio projector of a published model.

The OFT fine-tunes (``moojink/openvla-7b-oft-finetuned-libero-*``; SimpleVLA-RL's and RLinf's
OFT models follow the same training script) keep the VLA in the OpenVLA layout
(``policies/openvla/loading.py``) and two extra modules beside it, each a ``torch.save`` of a
``state_dict``, written from the DDP-wrapped module (names prefixed ``module.``)::

    action_head--<step>_checkpoint.pt          (or action_head--latest_checkpoint.pt)
        model.layer_norm1.{weight,bias}                  LayerNorm(7 D)
        model.fc1.{weight,bias}                          Linear(7 D -> D)
        model.mlp_resnet_blocks.{i}.ffn.0.{weight,bias}  LayerNorm(D), i = 0, 1
        model.mlp_resnet_blocks.{i}.ffn.1.{weight,bias}  Linear(D -> D)
        model.layer_norm2.{weight,bias}                  LayerNorm(D)
        model.fc2.{weight,bias}                          Linear(D -> 7)
    proprio_projector--<step>_checkpoint.pt
        fc1.{weight,bias}                                Linear(proprio -> D)
        fc2.{weight,bias}                                Linear(D -> D)

(``lora_adapter/`` beside them is the un-merged adapter of the merged weights: not read.) The
head computes what :class:`~policies.openvla_oft.modeling.ContinuousActionHead` computes
(``x = relu(fc1(ln1(x)))``, then ``x + relu(fc(ln(x)))`` per block, then ``fc2(ln2(x))``);
only the names differ, mapped by :func:`our_name`. The projector is
:class:`~policies.openvla_oft.modeling.ProprioProjector` with the same names. OFT's L1 head is
deterministic, so the Gaussian head's ``action_log_std`` is in no published file: it starts at
``init_log_std``.

A folder's files say what the model was trained with, and options that disagree would act
wrongly without an error (an L1-trained model decoded through its LM head, a proprio token
left out): :func:`check_checkpoint_options` refuses them on the driver, before workers start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from embodied_rl.runtime.config_errors import ConfigError
from policies.folder_layout import INDEX_FILE
from policies.openvla.preprocessor import check_processor_file

# Published file stem -> the attribute of our policy that holds the module.
SIDE_MODULES = {"action_head": "action_head", "proprio_projector": "proprio_projector"}
# Published name (after ``module.``) of the action head -> ours, inside ``action_head.``.
_HEAD_NAMES = (
    (re.compile(r"^model\.layer_norm1\."), "norm_in."),
    (re.compile(r"^model\.fc1\."), "fc_in."),
    (re.compile(r"^model\.mlp_resnet_blocks\.(\d+)\.ffn\.0\."), r"blocks.\1.norm."),
    (re.compile(r"^model\.mlp_resnet_blocks\.(\d+)\.ffn\.1\."), r"blocks.\1.fc."),
    (re.compile(r"^model\.layer_norm2\."), "norm_out."),
    (re.compile(r"^model\.fc2\."), "fc_out."),
)
DDP_PREFIX = "module."


def side_file(folder: Path, stem: str) -> Path | None:
    """The one ``<stem>--*checkpoint.pt`` file of ``folder`` (``None``: there is none).

    Raises:
        ConfigError: more than one (OFT's own loader refuses that too: which step is meant?).
    """
    found = sorted(p for p in folder.glob(f"{stem}--*checkpoint.pt") if p.is_file())
    if len(found) > 1:
        raise ConfigError(
            f"{folder} holds {len(found)} {stem} files ({', '.join(p.name for p in found)})",
            "keep the one of the step the merged weights are from",
        )
    return found[0] if found else None


def our_name(stem: str, name: str) -> str:
    """A side file's tensor name (``module.`` stripped) -> our state-dict name."""
    module = SIDE_MODULES[stem]
    if stem == "action_head":
        for pattern, ours in _HEAD_NAMES:
            if pattern.match(name):
                return f"{module}.{pattern.sub(ours, name)}"
        raise ValueError(f"unexpected tensor {name!r} in OFT's action head file")
    return f"{module}.{name}"


def read_side_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of the folder's side files under our names (none without side files).

    Loaded with ``weights_only=True`` (tensors only, no pickled code), on the CPU.
    """
    tensors: dict[str, torch.Tensor] = {}
    for stem in SIDE_MODULES:
        path = side_file(folder, stem)
        if path is None:
            continue
        state = torch.load(path, map_location="cpu", weights_only=True)
        for name, value in state.items():
            name = name[len(DDP_PREFIX) :] if name.startswith(DDP_PREFIX) else name
            tensors[our_name(stem, name)] = value
    return tensors


def weight_names(folder: Path) -> set[str]:
    """The tensor names of a folder's safetensors (its index, else the files' headers)."""
    index = folder / INDEX_FILE
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    names: set[str] = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            names.update(handle.keys())
    return names


def trained_parts(folder: Path) -> dict[str, str | None]:
    """What the files say the model has: ``{option: the file that holds it, or None}`` for
    ``use_continuous_head`` and ``use_proprio`` (a side file, or our own layout's weights)."""
    names = weight_names(folder)
    parts: dict[str, str | None] = {}
    for option, stem in (
        ("use_continuous_head", "action_head"),
        ("use_proprio", "proprio_projector"),
    ):
        path = side_file(folder, stem)
        if path is not None:
            parts[option] = path.name
        elif any(n.startswith(f"{SIDE_MODULES[stem]}.") for n in names):
            parts[option] = f"{SIDE_MODULES[stem]}.* weights"
        else:
            parts[option] = None
    return parts


def check_checkpoint_options(options: Mapping[str, Any], where: str = "models.actor") -> None:
    """Refuse options that disagree with what a ``path`` checkpoint's files hold.

    Raises:
        ConfigError: an L1 head or proprio projector in the files with the option off, or the
            option on with no such file; the message names the file and the override. Or a
            ``preprocessor_config.json`` the policy would not follow.
    """
    path = options.get("path")
    if path is None:
        return
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return  # the builder's own error names the missing folder
    check_processor_file(options, where)
    _check_image_count(folder, options, where)
    for option, held in trained_parts(folder).items():
        wanted = bool(options.get(option, False))
        if held is not None and not wanted:
            raise ConfigError(
                f"{where}.options.{option} is false, but {folder} holds {held}: the model was "
                "trained with it, and without it would act wrongly without an error",
                f"set {where}.options.{option}=true",
            )
        if held is None and wanted:
            raise ConfigError(
                f"{where}.options.{option} is true, but {folder} has no "
                f"{'action_head' if option == 'use_continuous_head' else 'proprio_projector'}"
                "--*_checkpoint.pt file nor such weights: it was trained without it",
                f"set {where}.options.{option}=false",
            )


IMAGES_KEY = "num_images_in_input"  # config.json's key (written by our OFT checkpoints)


def recorded_image_count(folder: Path) -> int | None:
    """Images per step ``config.json`` says the model was trained on; ``None`` when it does
    not say (the published OFT files do not: their LIBERO fine-tunes take 2)."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    count = json.loads(path.read_text()).get(IMAGES_KEY)
    return None if count is None else int(count)


def _check_image_count(folder: Path, options: Mapping[str, Any], where: str) -> None:
    recorded = recorded_image_count(folder)
    wanted = int(options.get(IMAGES_KEY, 1))
    if recorded is not None and recorded != wanted:
        raise ConfigError(
            f"{where}.options.{IMAGES_KEY} is {wanted}, but {folder}/config.json says the model "
            f"takes {recorded} image(s) per step: with another count it acts on other inputs "
            "than it was trained on",
            f"set ++{where}.options.{IMAGES_KEY}={recorded}",
        )
