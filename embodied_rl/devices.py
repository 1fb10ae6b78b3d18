"""The one module that names devices: torch device, collective backend, Ray resource."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICE_TYPES = ("cpu", "cuda", "npu")


@dataclass(frozen=True)
class DeviceSpec:
    """What a device type implies for the rest of the runtime."""

    type: str
    backend: str  # torch.distributed backend
    ray_resource: str  # the placement-group bundle resource of one worker

    def torch_device(self, local_index: int = 0) -> torch.device:
        return torch.device("cpu") if self.type == "cpu" else torch.device(self.type, local_index)


_SPECS = {
    "cpu": DeviceSpec("cpu", "gloo", "CPU"),
    "cuda": DeviceSpec("cuda", "nccl", "GPU"),
    "npu": DeviceSpec("npu", "hccl", "NPU"),
}


def device_spec(name: str) -> DeviceSpec:
    """The spec of ``device=cpu|cuda|npu``; a clear error for anything else."""
    if name not in _SPECS:
        raise ValueError(f"device must be one of {DEVICE_TYPES}, got {name!r}")
    return _SPECS[name]


def bundle(spec: DeviceSpec, cpus_per_worker: float) -> dict[str, float]:
    """Placement-group bundle of one worker: its device plus its CPU share."""
    if spec.type == "cpu":
        return {"CPU": cpus_per_worker}
    return {spec.ray_resource: 1, "CPU": cpus_per_worker}
