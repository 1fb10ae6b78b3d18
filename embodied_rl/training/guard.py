"""The non-finite guard: an update with a non-finite loss or gradient is skipped on every
rank, and a node stops the run after ``max_bad_steps`` such steps in a row.

Skipping before ``optimizer.step()`` keeps the weights and Adam's moments free of NaN; the
streak counter is node state, so it is checkpointed and a resumed run stops where the
uninterrupted one would have.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from embodied_rl.checks import check_range
from embodied_rl.runtime.context import NodeContext
from embodied_rl.training.gradients import sync_and_clip

logger = logging.getLogger(__name__)

BAD_STEPS_STATE = "bad_steps"


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive training steps had a non-finite loss or gradient norm."""


def check_max_bad_steps(max_bad_steps: int) -> None:
    """Validate the ``max_bad_steps`` option of the train nodes."""
    check_range("max_bad_steps", max_bad_steps, 0, note=" (0 never stops)")


class BadStepCounter:
    """Consecutive training steps of one node with a skipped update.

    Node state (``ctx.state``), so it is checkpointed: a run resumed in the middle of a streak
    stops where the uninterrupted run would have.
    """

    def __init__(self) -> None:
        self.consecutive = 0

    def blocks_checkpoint(self) -> bool:
        """No checkpoints during a streak: they would push the last good one out."""
        return self.consecutive > 0

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consecutive = int(state["consecutive"])


def create_bad_step_counter(ctx: NodeContext) -> None:
    """Setup of the train nodes: the counter must exist before a checkpoint restores it."""
    ctx.state[BAD_STEPS_STATE] = BadStepCounter()


def guarded_step(
    ctx: NodeContext,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    max_norm: float | None,
    loss_finite: bool,
) -> tuple[float, bool]:
    """Sync and clip the gradients, then step the optimizer unless anything is non-finite.

    The decision must be the same on every dp rank, or the replicas' weights drift apart.
    The gradient norm is taken after the all-reduce, so every rank sees the same number. The
    loss is local, and a non-finite loss does not always give a non-finite gradient (an inf
    or NaN in a term that does not depend on the weights, or that reaches them only through
    a ``torch.where``-style branch whose backward drops it), so the ranks' loss flags are
    summed in the same all-reduce and one bad rank skips the update everywhere. Skipping
    before ``optimizer.step()`` keeps the weights and Adam's moments free of NaN.

    Args:
        loss_finite: whether every micro-batch loss of this rank's mini-batch was finite.

    Returns:
        (global gradient norm before clipping, whether the update was skipped).
    """
    grad_norm, bad_loss_ranks = sync_and_clip(ctx, model, max_norm, loss_finite)
    if bad_loss_ranks == 0 and math.isfinite(grad_norm):
        optimizer.step()
        return grad_norm, False
    optimizer.zero_grad(set_to_none=False)  # no NaN gradient is left for anything to read
    if ctx.dp_rank == 0:
        logger.warning(
            "step %d, node %r: skipped an update (non-finite loss on %d of %d rank(s), global "
            "gradient norm %s); weights and optimizer state are unchanged",
            ctx.step,
            ctx.node_id,
            bad_loss_ranks,
            ctx.dp_size,
            grad_norm,
        )
    return grad_norm, True


def count_bad_steps(
    ctx: NodeContext, prefix: str, skipped: int, max_bad_steps: int, model: str
) -> None:
    """Log ``<prefix>/skipped_updates`` and stop after ``max_bad_steps`` bad steps in a row.

    A step with any skipped update is bad; a step without one resets the count. Every rank
    made the same skip decisions, so every rank raises at the same step.
    """
    ctx.metrics.log(f"{prefix}/skipped_updates", skipped, reduce="max")
    counter = ctx.state.setdefault(BAD_STEPS_STATE, BadStepCounter())
    counter.consecutive = counter.consecutive + 1 if skipped else 0
    if not max_bad_steps or counter.consecutive < max_bad_steps:
        return
    first = ctx.step - counter.consecutive + 1
    raise NonFiniteTrainingError(
        f"node {ctx.node_id!r}: {counter.consecutive} consecutive training steps "
        f"({first}..{ctx.step}) had a non-finite loss or gradient norm (max_bad_steps="
        f"{max_bad_steps}); each such update was skipped, so NaN never reached the weights or "
        f"the optimizer state. Fix: lower the learning rate (models.{model}.optimizer.lr) or "
        "the gradient clip (optimizer.grad_clip); check the rewards, advantages and log-probs "
        "for NaN/inf; then resume from the newest checkpoint (resume=true). Or raise "
        f"max_bad_steps of node {ctx.node_id!r} (0 never stops)."
    )
