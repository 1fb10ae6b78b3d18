"""Fault injection for reliability tests and drills (chaos testing of a real run).

Insert a ``fault.inject`` node anywhere in a DAG: it passes its batch through unchanged and,
at the configured rank and step, kills its worker process, raises, or hangs. Used by the
tests that prove a dead worker stops the run with a clear message and that resume works.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tensordict import TensorDict

from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext

FAULT_MODES = ("exit", "raise", "hang")


class InjectedFault(RuntimeError):
    """The exception raised by ``fault.inject`` in ``raise`` mode."""


@dataclass
class FaultConfig:
    """Options of ``fault.inject``: where and how to fail (``step: -1`` disables it)."""

    rank: int = 0
    step: int = -1
    mode: str = "exit"
    hang_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.mode not in FAULT_MODES:
            raise ValueError(f"mode must be one of {FAULT_MODES}, got {self.mode!r}")


@register_node("fault.inject", config=FaultConfig)
def fault_node(ctx: NodeContext, batch: TensorDict | None) -> TensorDict | None:
    cfg: FaultConfig = ctx.node_config
    if ctx.rank == cfg.rank and ctx.step == cfg.step:
        if cfg.mode == "exit":
            os._exit(17)  # no cleanup, as if the process were killed
        if cfg.mode == "raise":
            raise InjectedFault(f"injected fault at rank {cfg.rank}, step {cfg.step}")
        time.sleep(cfg.hang_s)
    return batch
