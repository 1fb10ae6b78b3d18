"""Device selection: what cpu / cuda / npu imply, and the errors that name the fix."""

from __future__ import annotations

import pytest
import torch

from embodied_rl import devices
from embodied_rl.devices import (
    DeviceUnavailableError,
    actor_options,
    bundle,
    device_spec,
    require_available,
    resolve_dtype,
    resolve_strategy,
)

EXPECTED = {
    # device: (backend, ray resource, autocast dtype, default strategy)
    "cpu": ("gloo", "CPU", None, "ddp"),
    "cuda": ("nccl", "GPU", torch.bfloat16, "fsdp"),
    "npu": ("hccl", "NPU", torch.bfloat16, "fsdp"),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_device_names_its_backend_resource_dtype_and_strategy(name):
    spec = device_spec(name)
    backend, resource, dtype, strategy = EXPECTED[name]
    assert (spec.type, spec.backend, spec.ray_resource) == (name, backend, resource)
    assert spec.autocast_dtype == dtype
    assert spec.default_strategy == strategy
    assert resolve_strategy(spec, "auto") == strategy
    assert resolve_dtype(spec, "auto") == dtype


def test_bundles_and_actor_options_ask_ray_for_one_device_per_worker():
    assert bundle(device_spec("cpu"), 2.0) == {"CPU": 2.0}
    assert bundle(device_spec("cuda"), 1.5) == {"GPU": 1, "CPU": 1.5}
    assert bundle(device_spec("npu"), 4.0) == {"NPU": 1, "CPU": 4.0}
    assert actor_options(device_spec("cpu"), 2.0) == {"num_cpus": 2.0, "num_gpus": 0}
    # Ray's own GPU accounting (it sets CUDA_VISIBLE_DEVICES) vs a custom NPU resource.
    assert actor_options(device_spec("cuda"), 1.5) == {"num_cpus": 1.5, "num_gpus": 1}
    assert actor_options(device_spec("npu"), 4.0) == {
        "num_cpus": 4.0,
        "num_gpus": 0,
        "resources": {"NPU": 1},
    }


def test_explicit_strategy_and_precision_override_the_device_default():
    cuda, cpu = device_spec("cuda"), device_spec("cpu")
    assert resolve_strategy(cuda, "ddp") == "ddp"
    assert resolve_strategy(cpu, "fsdp") == "fsdp"
    assert resolve_dtype(cuda, "float32") is None
    assert resolve_dtype(cpu, "bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match=r"\('auto', 'ddp', 'fsdp'\)"):
        resolve_strategy(cpu, "zero3")
    with pytest.raises(ValueError, match="auto.*float32.*bfloat16"):
        resolve_dtype(cpu, "fp8")


def test_unknown_device_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"one of \('cpu', 'cuda', 'npu'\), got 'tpu'"):
        device_spec("tpu")


def test_cpu_is_always_available():
    assert device_spec("cpu").torch_device(3) == torch.device("cpu")


def test_cuda_without_a_gpu_names_device_cpu_as_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="Fix: set device=cpu"):
        device_spec("cuda").torch_device(0)


def test_cuda_with_a_gpu_gives_the_local_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_spec("cuda").torch_device(1) == torch.device("cuda", 1)


def test_npu_without_torch_npu_names_the_install_and_the_alternatives(monkeypatch):
    def no_torch_npu(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(devices.importlib, "import_module", no_torch_npu)
    with pytest.raises(DeviceUnavailableError) as info:
        require_available(device_spec("npu"))
    message = str(info.value)
    version = torch.__version__.split("+")[0]
    assert f"pip install torch_npu matching torch {version}" in message
    assert "device=cpu or device=cuda" in message


def test_npu_imports_torch_npu_before_use(monkeypatch):
    imported = []
    monkeypatch.setattr(devices.importlib, "import_module", lambda name: imported.append(name))
    require_available(device_spec("npu"))
    assert imported == ["torch_npu"]
