"""The random number generators' state in a checkpoint: captured after a step, restored on
resume, so that a resumed run draws what the uninterrupted one would have drawn.

Torch (CPU and the accelerator's), numpy's global and Python's ``random``; everything is a
tensor or a plain value (``torch.load(weights_only=True)`` reads it).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)


def _accelerator_rng_module() -> Any | None:
    """``torch.cuda``/``torch.npu``-like module of the current accelerator, if any."""
    if not torch.accelerator.is_available():
        return None
    device = torch.accelerator.current_accelerator()
    module = torch.get_device_module(device.type)
    return module if hasattr(module, "get_rng_state_all") else None


def capture_rng_state() -> dict[str, Any]:
    """The torch, numpy (global), Python ``random`` and accelerator RNG states.

    Everything is a tensor or a plain value, so the result can go into a shard and be loaded
    with ``weights_only=True``.
    """
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    py_version, py_state, py_gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_state, dtype=torch.int64),  # 625 values < 2**32
            "gauss_next": py_gauss_next,
        },
    }
    accelerator = _accelerator_rng_module()
    if accelerator is not None:
        state["accelerator"] = list(accelerator.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the RNGs to a state from :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["name"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    py_state = state["python"]
    random.setstate(
        (py_state["version"], tuple(py_state["state"].tolist()), py_state["gauss_next"])
    )
    _restore_accelerator_rng(state.get("accelerator"))


def _restore_accelerator_rng(saved: list[torch.Tensor] | None) -> None:
    accelerator = _accelerator_rng_module()
    if saved is None or accelerator is None:
        if saved is not None:
            logger.warning("checkpoint has accelerator RNG states but no accelerator is present")
        return
    if len(saved) != accelerator.device_count():
        logger.warning(
            "checkpoint has RNG states of %d devices, %d are visible; not restoring them",
            len(saved),
            accelerator.device_count(),
        )
        return
    accelerator.set_rng_state_all(saved)
