"""Test-session environment and the GPU skip rule.

The environment variables are set at import, before any test module imports transformers,
Ray or MuJoCo, so the plain ``python -m pytest`` run and CI behave the same. ``setdefault``
keeps a value the caller chose (e.g. ``MUJOCO_GL=osmesa``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights or data in tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede mujoco imports


@pytest.fixture(scope="module", autouse=True)
def _remove_module_folders_after_passing_modules(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Removes the folders a module's ``tmp_path_factory`` fixtures made once its tests pass.

    ``tmp_path_retention_policy = "failed"`` (pyproject.toml) removes a passing test's
    ``tmp_path`` only; module-scoped run folders (several hundred MB of checkpoints each) would
    otherwise stay until the session ends, and a full run writes about 20 GB. A module with a
    failure keeps everything it wrote, to be looked at.
    """
    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        return
    for path in set(base.iterdir()) - before:
        shutil.rmtree(path, ignore_errors=True)


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
