"""Timing of ``model_scale``: one measured row (:class:`Phase`) and how it is filled.

Only the standard library at import time (torch and ``common`` are imported inside the
functions): ``model_scale.py`` imports this module also when it runs as the vLLM worker, in
an interpreter that may lack the project's dependencies.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Phase:
    """One measured row: seconds per call, peak memory, status and what was checked."""

    name: str
    seconds: list[float] = field(default_factory=list)
    peak_mem_mb: float | None = None
    status: str = "ok"
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def checks_cell(self) -> str:
        """``pass`` / ``FAIL`` over the ``ok_*`` checks; ``-`` when the phase did not run."""
        if self.status != "ok":
            return "-"
        passed = all(v is True for k, v in self.checks.items() if k.startswith("ok_"))
        return "pass" if passed else "FAIL"


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(phase: Phase, fn: Callable[[int], Any], device: Any, warmup: int, repeats: int) -> Any:
    """Call ``fn(i)`` ``warmup`` times untimed, then ``repeats`` times timed, into ``phase``.

    Peak memory covers every call: ``max_memory_allocated`` on GPU, sampled RSS on CPU.
    Returns what the first (warm-up) call returned, for the checks.
    """
    import common
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first = None
    with common.PeakRss() as rss:
        for i in range(warmup + repeats):
            synchronize(device)
            started = time.perf_counter()
            result = fn(i)
            synchronize(device)
            if i >= warmup:
                phase.seconds.append(time.perf_counter() - started)
            if i == 0:
                first = result
    if device.type == "cuda":
        phase.peak_mem_mb = torch.cuda.max_memory_allocated(device) / common.MB
    else:
        phase.peak_mem_mb = rss.peak_mb
    return first


def guarded(phase: Phase, run: Callable[[], None]) -> None:
    """Run a phase; an out-of-memory error becomes its status instead of ending the script."""
    import torch

    try:
        run()
    except torch.OutOfMemoryError as error:
        phase.status = "OOM"
        phase.checks["error"] = str(error).splitlines()[0]
        phase.seconds.clear()


def count_params(module: Any, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def free_memory(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
