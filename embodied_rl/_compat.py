"""Make the registry's CUDA-only torchvision importable next to CPU torch.

Only CUDA builds of torchvision exist on the package registry these machines use. On CPU
torch its native library fails to load, and torchvision's Python code then dies registering
fake kernels for ``torchvision::nms`` (``operator torchvision::nms does not exist``). timm
imports torchvision unconditionally and transformers' model imports go through it, so every
process that touches a model needs this. When the native library loads (GPU machines with a
matching build), nothing is changed.

It must run before anything imports torchvision; ``embodied_rl/__init__.py`` calls it, and
every process we start (Ray workers, simulator processes) imports ``embodied_rl`` first.
"""

from __future__ import annotations

import importlib.util
import os

_library = None  # keeps the schema fragment alive for the life of the process


def _torchvision_native_library() -> str | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    for name in sorted(os.listdir(folder)):
        if name.startswith("_C") and name.endswith((".so", ".pyd")):
            return os.path.join(folder, name)
    return None


def ensure_torchvision_ops() -> None:
    """Define the torchvision op schemas torchvision needs when its library cannot load."""
    global _library
    if _library is not None:
        return
    native = _torchvision_native_library()
    if native is None:  # torchvision not installed: nothing to fix
        return
    import torch

    if torch._C._jit_get_schemas_for_operator("torchvision::nms"):
        return  # defined already: native library loaded, or fixed earlier in this process
    try:
        torch.ops.load_library(native)
        return
    except (OSError, RuntimeError):
        pass
    library = torch.library.Library("torchvision", "FRAGMENT")
    library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    library.define(
        "qnms(Tensor dets, Tensor scores, float iou_threshold, int left, int right) -> Tensor"
    )
    _library = library
