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

import tests.hypothesis_profiles  # noqa: F401  (registers and loads the "ci" profile)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads weights or data in tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede mujoco imports


@pytest.fixture(scope="module", autouse=True)
def _one_ray_cluster_for_the_session_module(request: pytest.FixtureRequest) -> None:
    """The module's part of ``_one_ray_cluster_for_the_session``: before the module's own
    fixtures, which may launch runs (a module-scoped SFT run) or call ``ray.init``."""
    _share_ray_as_marked(request.node)


@pytest.fixture(autouse=True)
def _one_ray_cluster_for_the_session(request: pytest.FixtureRequest) -> None:
    """Tests marked ``ray`` share one embedded Ray cluster, started by the first of them.

    ``launch`` runs on a cluster this process is already connected to and leaves it running
    (``start_ray`` returns False), so each run of a test skips starting and stopping a cluster
    of its own (about 4 s a run on 2 cores; a hundred runs in the default tier). The shared
    cluster is started with the launcher's own ``ray_init_kwargs`` (no dashboard, the same
    logging) and CPUs for the largest run of the tests (4 workers). Tests marked
    ``own_ray_cluster`` need this process unconnected (their own ``ray.init``, a cluster given
    by ``ray.address``, the embedded cluster's own size or start-up under test): the shared
    cluster is stopped before them and the next ``ray`` test starts a new one.
    """
    _share_ray_as_marked(request.node)


def _share_ray_as_marked(node: pytest.Item | pytest.Collector) -> None:
    if node.get_closest_marker("own_ray_cluster") is not None:
        _stop_shared_ray()
    elif node.get_closest_marker("ray") is not None:
        _start_shared_ray()


SHARED_RAY_WORKERS = 4  # the most workers any in-process run of the tests asks for
_shared_ray = {"started": False}  # whether this process's Ray connection is the shared cluster


def _start_shared_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    from embodied_rl.launch.ray_setup import ray_init_kwargs
    from embodied_rl.runtime.config import compose

    ray.init(**ray_init_kwargs(compose("grpo_llm", []), SHARED_RAY_WORKERS, 1.0))
    _shared_ray["started"] = True


def _stop_shared_ray() -> None:
    """Stops the shared cluster only: a module's own ``ray.init`` (made by its module-scoped
    fixture before its tests run) stays up for its tests."""
    if not _shared_ray["started"]:
        return
    _shared_ray["started"] = False
    import ray

    if ray.is_initialized():
        ray.shutdown()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _stop_shared_ray()


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
