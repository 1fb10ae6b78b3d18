"""Fault injection for reliability tests and drills (chaos testing of a real run).

Insert a ``fault.inject`` node anywhere in a DAG: it passes its batch through unchanged and,
at the configured rank and step(s), kills its worker process, raises, hangs, poisons one
field of its batch with NaN/inf (numerical faults: the train nodes must skip such updates and
stop after too many in a row), or warns. Used by the tests that prove a dead worker stops the
run with a clear message, that resume works, that a NaN never reaches the weights, and that a
worker's warnings and errors reach the console.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext

FAULT_MODES = ("exit", "raise", "hang", "poison", "warn")

logger = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """The exception raised by ``fault.inject`` in ``raise`` mode."""


class InjectedWarning(UserWarning):
    """The warning issued by ``fault.inject`` in ``warn`` mode."""


@dataclass
class FaultConfig:
    """Options of ``fault.inject``: where and how to fail.

    Attributes:
        rank: the global rank that fails.
        step: the step it fails at; ``-1`` (and no ``steps``) disables the node.
        until_step: with ``step``, fail at every step ``step..until_step`` (inclusive).
        steps: more steps to fail at, e.g. ``[1, 3, 4, 5]``.
        mode: ``exit`` (the process dies, no cleanup), ``raise`` (:class:`InjectedFault`),
            ``hang`` (sleep ``hang_s``), ``poison`` (overwrite the float batch field ``key``
            of this rank with ``value`` and carry on) or ``warn`` (an
            :class:`InjectedWarning` and a logged WARNING, then carry on).
        key: the batch key ``poison`` overwrites (e.g. ``advantages``, ``old_logprobs``).
        value: what ``poison`` writes: ``"nan"`` (default), ``"inf"``, ``"-inf"`` or a number
            (a string, because a config value may not be NaN itself).
    """

    rank: int = 0
    step: int = -1
    until_step: int | None = None
    steps: list[int] = field(default_factory=list)
    mode: str = "exit"
    hang_s: float = 3600.0
    key: str = K.ADVANTAGES
    value: float | str = "nan"

    def __post_init__(self) -> None:
        check_range("rank", self.rank, 0)
        check_range("step", self.step, -1, note=" (-1: off)")
        check_range("hang_s", self.hang_s, 0)
        check_range("until_step", self.until_step, 0, note=" or null")
        if self.mode not in FAULT_MODES:
            raise ValueError(f"mode must be one of {FAULT_MODES}, got {self.mode!r}")
        if self.key not in K.ALL_KEYS:
            raise ValueError(f"key {self.key!r} is not a batch key (embodied_rl/keys.py)")
        if self.until_step is not None and self.until_step < self.step:
            raise ValueError(
                f"until_step ({self.until_step}) must be >= step ({self.step}); "
                "it ends the inclusive range of failing steps"
            )
        self.steps = [int(s) for s in self.steps]
        try:
            self.value = float(self.value)
        except ValueError:
            raise ValueError(
                f"value must be a number, 'nan', 'inf' or '-inf', got {self.value!r}"
            ) from None

    def fires_at(self, step: int) -> bool:
        """Whether the fault happens at ``step`` (on ``rank``)."""
        last = self.step if self.until_step is None else self.until_step
        return (self.step >= 0 and self.step <= step <= last) or step in self.steps


@register_node("fault.inject", config=FaultConfig)
def fault_node(ctx: NodeContext, batch: TensorDict | None) -> TensorDict | None:
    cfg: FaultConfig = ctx.node_config
    if ctx.rank != cfg.rank or not cfg.fires_at(ctx.step):
        return batch
    if cfg.mode == "exit":
        os._exit(17)  # no cleanup, as if the process were killed
    if cfg.mode == "raise":
        raise InjectedFault(f"injected fault at rank {cfg.rank}, step {ctx.step}")
    if cfg.mode == "poison":
        return poison(batch, cfg.key, cfg.value)
    if cfg.mode == "warn":
        where = f"rank {cfg.rank}, step {ctx.step}"
        warnings.warn(f"injected warning at {where}", InjectedWarning, stacklevel=1)
        logger.warning("injected log warning at %s", where)
        return batch
    time.sleep(cfg.hang_s)
    return batch


def poison(batch: TensorDict | None, key: str, value: float) -> TensorDict | None:
    """``batch`` with every element of float field ``key`` set to ``value`` (a new tensor).

    The field is replaced, not written in place, so the upstream node's output is untouched.
    """
    if batch is None or key not in batch.keys():
        present = [] if batch is None else sorted(batch.keys())
        raise KeyError(f"fault.inject poison: the batch has no {key!r}; it has {present}")
    if not batch[key].is_floating_point():
        raise TypeError(f"fault.inject poison: {key!r} is {batch[key].dtype}, not a float field")
    batch[key] = torch.full_like(batch[key], value)
    return batch
