"""The one module that names devices.

Everything that differs between ``device=cpu``, ``cuda`` and ``npu`` lives here: the torch
device, the collective backend, the Ray resource of one worker, the mixed-precision dtype and
the default data-parallel strategy of trainable models. The rest of the code asks a
:class:`DeviceSpec`, so switching the device changes nothing else in any config.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

DEVICE_TYPES = ("cpu", "cuda", "npu")
STRATEGIES = ("ddp", "fsdp")


class DeviceUnavailableError(RuntimeError):
    """The configured device cannot be used on this machine; the message names the fix."""


@dataclass(frozen=True)
class DeviceSpec:
    """What a device type implies for the rest of the runtime.

    Attributes:
        type: ``cpu``, ``cuda`` or ``npu`` (the torch device type).
        backend: the torch.distributed backend of its collectives.
        ray_resource: the placement-group bundle resource of one worker.
        autocast_dtype: the mixed-precision compute dtype of training, ``None`` for float32.
        default_strategy: how trainable models are data-parallel when their config says
            ``parallel.strategy: auto``: ``fsdp`` (FSDP2 sharding) or ``ddp`` (replicas with
            a flat gradient all-reduce).
        runtime_module: a module that must be imported before the device exists in torch
            (``torch_npu`` registers ``npu``); ``None`` when torch has it built in.
    """

    type: str
    backend: str
    ray_resource: str
    autocast_dtype: torch.dtype | None
    default_strategy: str
    runtime_module: str | None = None

    def torch_device(self, local_index: int = 0) -> torch.device:
        """The torch device of a worker; checks first that this machine can use it."""
        require_available(self)
        return torch.device("cpu") if self.type == "cpu" else torch.device(self.type, local_index)


_SPECS = {
    # CPU: float32 training (bf16 matmuls are slow on most CPUs) and replicas, since FSDP's
    # per-layer all-gathers cost more than they save when memory is not the limit.
    "cpu": DeviceSpec("cpu", "gloo", "CPU", None, "ddp"),
    "cuda": DeviceSpec("cuda", "nccl", "GPU", torch.bfloat16, "fsdp"),
    "npu": DeviceSpec("npu", "hccl", "NPU", torch.bfloat16, "fsdp", runtime_module="torch_npu"),
}


def device_spec(name: str) -> DeviceSpec:
    """The spec of ``device=cpu|cuda|npu``; a clear error for anything else."""
    if name not in _SPECS:
        raise ValueError(f"device must be one of {DEVICE_TYPES}, got {name!r}")
    return _SPECS[name]


def require_available(spec: DeviceSpec) -> None:
    """Raise :class:`DeviceUnavailableError` naming the fix when ``spec`` cannot run here.

    ``npu`` imports ``torch_npu`` (which registers the device and the HCCL backend with
    torch), so call this before building tensors or process groups on an NPU.
    """
    if spec.runtime_module is not None:
        try:
            importlib.import_module(spec.runtime_module)
        except ImportError as err:
            raise DeviceUnavailableError(
                f"device={spec.type} needs the {spec.runtime_module} package, which cannot be "
                f"imported ({err}). Fix: pip install {spec.runtime_module} matching torch "
                f"{torch.__version__.split('+')[0]}, or set device=cpu or device=cuda"
            ) from err
    if spec.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "device=cuda but torch.cuda.is_available() is False (no GPU visible, or a CPU-only "
            f"torch build: {torch.__version__}). Fix: set device=cpu, or install a CUDA build "
            "of torch on a machine with a GPU"
        )


def bundle(spec: DeviceSpec, cpus_per_worker: float) -> dict[str, float]:
    """Placement-group bundle of one worker: its device plus its CPU share."""
    if spec.type == "cpu":
        return {"CPU": cpus_per_worker}
    return {spec.ray_resource: 1, "CPU": cpus_per_worker}


def actor_options(spec: DeviceSpec, cpus_per_worker: float) -> dict[str, Any]:
    """Ray actor options of one worker: the same resources as its bundle.

    Ray spells GPUs ``num_gpus`` (it sets ``CUDA_VISIBLE_DEVICES`` from them) and any other
    accelerator as a custom resource.
    """
    options: dict[str, Any] = {"num_cpus": cpus_per_worker, "num_gpus": 0}
    if spec.ray_resource == "GPU":
        options["num_gpus"] = 1
    elif spec.type != "cpu":
        options["resources"] = {spec.ray_resource: 1}
    return options


def resolve_strategy(spec: DeviceSpec, strategy: str) -> str:
    """``auto`` -> the device's default data-parallel strategy; others pass through."""
    if strategy == "auto":
        return spec.default_strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {('auto',) + STRATEGIES}, got {strategy!r}")
    return strategy


def resolve_dtype(spec: DeviceSpec, mixed_precision: str) -> torch.dtype | None:
    """``auto`` -> the device's autocast dtype; ``float32`` -> None (full precision)."""
    named = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if mixed_precision == "auto":
        return spec.autocast_dtype
    if mixed_precision not in named:
        raise ValueError(
            f"mixed_precision must be one of {['auto', *named]}, got {mixed_precision!r}"
        )
    return named[mixed_precision]
