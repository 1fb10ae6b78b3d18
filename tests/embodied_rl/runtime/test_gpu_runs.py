"""Whole runs on one CUDA GPU (marked ``gpu``: skipped without one).

The LLM run with the vLLM backend is in ``tests/rollout/test_vllm_backend.py``.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose

pytestmark = [pytest.mark.gpu, pytest.mark.ray]


def _metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.libero
@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_srpo_step_with_openvla_oft_on_cuda(tmp_path):
    """One SRPO step on LIBERO with the reduced-size (tiny) OpenVLA-OFT on the GPU."""
    overrides = [
        "device=cuda",
        "workers.num_workers=1",
        "trainer.total_steps=1",
        "trainer.checkpoint_every=1",
        "eval.at_end=false",
        f"run_dir={tmp_path}",
    ]
    result = launch(compose("srpo_libero", overrides), show_progress=False)
    (step,) = _metrics(result.run_dir)
    assert step["rollout/episode_steps"] > 0
    assert 0.0 <= step["rollout/success_rate"] <= 1.0
    assert torch.isfinite(torch.tensor(step["loss/policy"]))
    # One epoch of one mini-batch is on-policy: the log-probs of the update (bf16 autocast on
    # the GPU) must match the rollout's, so every token's ratio is 1 up to kernel rounding.
    assert step["actor/ratio_mean"] == pytest.approx(1.0, abs=0.05)
    grad_norm = step["actor/grad_norm"]
    assert math.isfinite(grad_norm) and grad_norm >= 0
    # A random-init policy rarely succeeds: with no success in the batch SRPO has no
    # reference, every advantage is 0 and so is the gradient (the H200 run saw exactly that).
    if 0 < step["rollout/success_rate"] < 1:
        assert grad_norm > 0
    assert (result.run_dir / "checkpoints" / "step_000001" / "manifest.json").exists()


def test_grpo_llm_hf_backend_on_cuda_matches_its_cpu_config(tmp_path):
    """``device=cuda`` is the only change from the CPU run of grpo_llm."""
    overrides = [
        "device=cuda",
        "workers.num_workers=1",
        "trainer.total_steps=2",
        "trainer.checkpoint_every=0",
        f"run_dir={tmp_path}",
    ]
    lines = _metrics(launch(compose("grpo_llm", overrides), show_progress=False).run_dir)
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        assert 0.0 <= m["reward/mean"] <= 1.0
        assert torch.isfinite(torch.tensor(m["loss/policy"]))
