"""Test-session environment and the GPU skip rule.

The environment variables are set at import, before any test module imports transformers,
Ray or MuJoCo, so the plain ``python -m pytest`` run and CI behave the same. ``setdefault``
keeps a value the caller chose (e.g. ``MUJOCO_GL=osmesa``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights or data in tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede mujoco imports


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_vllm_without_vllm(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # do not pay for importing torch when no test asks for a GPU
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="marked 'gpu': needs a CUDA GPU, torch.cuda.is_available() is False"
    )
    for item in gpu_items:
        item.add_marker(skip)


def _skip_vllm_without_vllm(items: list[pytest.Item]) -> None:
    """``vllm`` tests need vLLM, which lives in its own venv (scripts/install_vllm.sh)."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(
        reason="marked 'vllm': vLLM is not installed here; run bash scripts/install_vllm.sh, "
        "then .venv-vllm/bin/python -m pytest -m vllm"
    )
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
