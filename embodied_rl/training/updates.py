"""The epoch x mini-batch loop of a training node and one optimizer update.

``run_updates`` cuts the step's batch into global mini-batches (the same pieces for any
number of dp ranks, :mod:`embodied_rl.data.mini_batches`), and for each one normalises the
loss by the mini-batch's global counts, accumulates gradients over micro-batches, and steps
through the non-finite guard (:mod:`embodied_rl.training.guard`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.losses import GlobalCounts
from embodied_rl.data.batch import batch_len
from embodied_rl.data.mini_batches import global_mini_batches
from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.fsdp import discarded_metrics, filler_rows, fsdp_pass_count, is_fsdp
from embodied_rl.training.guard import count_bad_steps, guarded_step


def mini_batch_update(
    ctx: NodeContext,
    model_name: str,
    mini: TensorDict,
    micro_batch_size: int,
    micro_loss: Callable[[TensorDict], torch.Tensor],
    filler: TensorDict | None = None,
) -> tuple[float, bool]:
    """One optimizer update of ``ctx.models[model_name]`` on this rank's mini-batch.

    Gradients accumulate over micro-batches of ``micro_batch_size`` rows, then
    :func:`guarded_step` syncs them and steps unless anything is non-finite.

    Args:
        mini: this rank's rows of the mini-batch (may be empty).
        micro_loss: a micro-batch's share of the global mini-batch loss (a scalar).
        filler: a row for the zero-weight passes an FSDP model needs when this rank has
            fewer micro-batches than another (default: :func:`filler_rows` of ``mini``).

    Returns:
        (global gradient norm before clipping, whether the update was skipped).
    """
    model = ctx.models[model_name]
    optimizer = ctx.models.optimizer(model_name)
    optimizer.zero_grad(set_to_none=False)
    loss_finite = True
    micro_batches = torch.arange(batch_len(mini)).split(micro_batch_size)
    # FSDP: agree on the pass count first (every pass is a collective), then run as many
    # forward/backward passes as the busiest dp rank; a zero-weight loss adds nothing to the
    # gradients (and its metrics are dropped).
    passes = fsdp_pass_count(ctx, model, len(micro_batches))
    for micro_rows in micro_batches:
        loss = micro_loss(mini[micro_rows])
        loss.backward()
        loss_finite = loss_finite and bool(torch.isfinite(loss))
    with discarded_metrics(ctx):
        for _ in range(passes - len(micro_batches)):
            (micro_loss(filler if filler is not None else filler_rows(mini)) * 0.0).backward()
    ctx.models.set_scheduled_lr(model_name)
    return guarded_step(ctx, model, optimizer, ctx.models.grad_clip(model_name), loss_finite)


def run_updates(
    ctx: NodeContext,
    batch: TensorDict,
    cfg: Any,
    loss_for: Callable[[GlobalCounts], Callable[[TensorDict], torch.Tensor]],
    prefix: str,
) -> int:
    """``ppo_epochs`` x ``num_mini_batches`` updates of ``cfg.model`` on this rank's batch.

    ``loss_for(counts)`` gives the micro-batch loss normalised by that mini-batch's global
    counts. Logs ``<prefix>/grad_norm`` of applied updates and counts bad steps (which raises
    after ``cfg.max_bad_steps`` in a row). Returns the number of skipped updates.
    """
    skipped = 0
    # The row of an FSDP model's zero-weight passes (see mini_batch_update); DDP needs none.
    filler = filler_rows(batch) if is_fsdp(ctx.models[cfg.model]) else None
    pieces = mini_batches_of(ctx, batch, cfg.num_mini_batches)
    for _ in range(cfg.ppo_epochs):
        for mini in pieces:
            loss = loss_for(global_counts(ctx, mini))
            grad_norm, was_skipped = mini_batch_update(
                ctx, cfg.model, mini, cfg.micro_batch_size, loss, filler
            )
            skipped += was_skipped
            if not was_skipped:
                ctx.metrics.log(f"{prefix}/grad_norm", grad_norm, reduce="max")
    count_bad_steps(ctx, prefix, skipped, cfg.max_bad_steps, cfg.model)
    return skipped


def mini_batches_of(ctx: NodeContext, batch: TensorDict, num_mini_batches: int) -> list[TensorDict]:
    """This rank's rows of each global mini-batch (:mod:`embodied_rl.data.mini_batches`): the
    same pieces of the step's batch for any number of dp ranks."""
    if num_mini_batches > 1 and K.SAMPLE_ID not in batch.keys():
        raise ValueError(
            f"node {ctx.node_id!r}: num_mini_batches={num_mini_batches} cuts the batch by "
            f"{K.SAMPLE_ID}, which its input lacks; write {K.SAMPLE_ID} upstream or set "
            "num_mini_batches=1"
        )
    dp_ranks = ctx.layout.dp_group_ranks(ctx.rank)
    return global_mini_batches(
        batch, num_mini_batches, ctx.dp_group, dp_ranks, ctx.rank, ctx.gather_over_dp
    )


def global_counts(ctx: NodeContext, mini: TensorDict) -> GlobalCounts:
    """Valid tokens, sequences and the widest response of this mini-batch over the dp group."""
    mask = mini[K.RESPONSE_MASK].float()
    local = torch.tensor(
        [mask.sum().item(), float(batch_len(mini))], dtype=torch.float64, device=ctx.device
    )
    tokens, sequences = ctx.all_reduce_sum(local).tolist()
    width = torch.tensor([float(mask.shape[-1])], dtype=torch.float64, device=ctx.device)
    if ctx.dp_group is not None and ctx.dp_size > 1:
        dist.all_reduce(width, op=dist.ReduceOp.MAX, group=ctx.dp_group)
    return GlobalCounts(tokens=tokens, sequences=sequences, width=width.item())
