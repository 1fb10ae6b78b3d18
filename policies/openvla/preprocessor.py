"""The released OpenVLA image processor's settings, from a checkpoint's
``preprocessor_config.json``.

The released processor (``PrismaticImageProcessor``) prepares each tower's input in four steps:
1. resize to ``tvf_resize_params[i].size`` (interpolation 3, PIL's bicubic, with antialias);
2. centre-crop to ``tvf_crop_params[i].output_size``;
3. divide by 255;
4. normalise with ``tvf_normalize_params[i]``'s mean and std.

The DINOv2 mean and std stored there are ImageNet's, rounded to bfloat16: mean (0.484375,
0.455078125, 0.40625) and std (0.228515625, 0.2236328125, 0.224609375). The published models
were trained with those values, so they are what :func:`read_preprocessing` returns. The
unrounded ``means`` / ``stds`` are the fallback for a file without ``tvf_normalize_params``.
The policy's own resize (``vision.images_to_float``) is the same bicubic, with antialias, to
the towers' size. A file asking for anything else (another interpolation, a crop smaller than
the resize, letterbox padding, another size) is refused with the reason, not followed
approximately.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_rl.runtime.config_errors import ConfigError
from policies.folder_layout import CONFIG_FILE
from policies.openvla.loading import architecture_from_config

PREPROCESSOR_FILE = "preprocessor_config.json"
BICUBIC = 3  # torchvision's InterpolationMode code for PIL's BICUBIC
TOWERS = 2  # the fused backbone: DINOv2-like then SigLIP-like


@dataclass(frozen=True)
class TowerNormalization:
    """One tower's per-channel normalisation: ``(pixels / 255 - mean) / std``."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]


def read_preprocessing(folder: Path, image_size: int) -> list[TowerNormalization] | None:
    """Each tower's normalisation from ``folder/preprocessor_config.json`` (None: no file).

    Args:
        folder: a checkpoint folder in the published layout.
        image_size: S, the towers' input size (``config.json``'s ``image_sizes``).

    Raises:
        ConfigError: the file asks for preprocessing the policy does not do (the message says
            which setting and what it holds).
    """
    path = folder / PREPROCESSOR_FILE
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    if any(_as_list(config.get("tvf_do_letterbox", False))):
        _refuse(path, "tvf_do_letterbox is true (letterbox padding before the resize)")
    for resize in config.get("tvf_resize_params") or []:
        if resize.get("interpolation", BICUBIC) != BICUBIC:
            _refuse(path, f"resize interpolation {resize['interpolation']} is not bicubic (3)")
        _check_size(path, "tvf_resize_params size", resize.get("size"), image_size)
    for crop in config.get("tvf_crop_params") or []:
        _check_size(path, "tvf_crop_params output_size", crop.get("output_size"), image_size)
    for input_size in config.get("input_sizes") or []:
        _check_size(path, "input_sizes", list(input_size)[1:], image_size)
    normalize = config.get("tvf_normalize_params") or [
        {"mean": mean, "std": std}
        for mean, std in zip(config.get("means") or [], config.get("stds") or [])
    ]
    if len(normalize) != TOWERS:
        _refuse(path, f"it normalises for {len(normalize)} towers; the fused backbone has 2")
    return [TowerNormalization(_rgb(n["mean"]), _rgb(n["std"])) for n in normalize]


def check_processor_file(options: Mapping[str, Any], where: str = "models.actor") -> None:
    """``check_options`` of the OpenVLA builders: a ``path`` checkpoint's processor file is
    read on the driver, so that one it would not follow is refused before workers start."""
    path = options.get("path")
    if path is None:
        return
    folder = Path(path).expanduser()
    config_file = folder / CONFIG_FILE
    if config_file.is_file():  # else the builder's own error names the missing file
        architecture = architecture_from_config(json.loads(config_file.read_text()))
        read_preprocessing(folder, architecture.image_size)


def _check_size(path: Path, name: str, size: Any, image_size: int) -> None:
    """``size`` (an int or [h, w]) must be the towers' square ``image_size``."""
    sides = _as_list(size)
    if sides and any(int(side) != image_size for side in sides):
        _refuse(path, f"{name} is {size}, the towers take {image_size} x {image_size}")


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]


def _rgb(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) != 3:
        raise ValueError(f"a mean / std of {len(values)} channels, not 3: {list(values)}")
    return float(values[0]), float(values[1]), float(values[2])


def _refuse(path: Path, reason: str) -> None:
    raise ConfigError(
        f"{path}: {reason}; this policy resizes with antialiased bicubic to the towers' size "
        "and normalises each tower, nothing else",
        "remove the file to use the towers' own normalisation, or write it with the published "
        "processor's settings",
    )
