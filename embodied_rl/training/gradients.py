"""Gradient sync over the data-parallel group and clipping.

A DDP-style model's gradients are summed with one flat all-reduce; an FSDP model's were
reduce-scattered in backward already, so only the global norm needs a collective. Either way
this rank's non-finite-loss flag rides along in the same all-reduce, so the skip decision of
:func:`embodied_rl.training.guard.guarded_step` costs no extra collective.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.fsdp import is_fsdp


def sync_and_clip(
    ctx: NodeContext,
    model: torch.nn.Module,
    max_norm: float | None,
    loss_finite: bool = True,
) -> tuple[float, int]:
    """Sum gradients over the dp group, then clip (DDP: one flat all-reduce).

    This rank's non-finite-loss flag rides in the same all-reduce as one extra element, so
    every rank learns how many ranks had a non-finite loss without another collective. An
    FSDP model's gradients were already summed (reduce-scattered) in backward: see
    :func:`_clip_sharded`.

    Returns:
        (global gradient norm before clipping, number of dp ranks whose loss was non-finite).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bad_loss_ranks = 0 if loss_finite else 1
    if is_fsdp(model):
        return _clip_sharded(ctx, params, max_norm, bad_loss_ranks)
    if ctx.dp_group is not None and ctx.dp_size > 1:
        flag = params[0].grad.new_full((1,), float(bad_loss_ranks))
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [flag])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=ctx.dp_group)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        bad_loss_ranks = round(float(flat[-1]))
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    return float(norm), bad_loss_ranks


def _clip_sharded(
    ctx: NodeContext, params: list[torch.nn.Parameter], max_norm: float | None, bad_loss: int
) -> tuple[float, int]:
    """Global norm and clip of FSDP gradient shards (DTensors, Shard(0) over the dp group).

    The shards are disjoint, so the squared norm is the sum over ranks of the local shards'
    squared norms: one 2-element all-reduce ``[sum of squares, bad-loss flag]`` on the device.
    This rather than ``clip_grad_norm_`` on DTensors, whose reduction would run on the
    shards' device, i.e. on the CPU under ``cpu_offload`` where NCCL/HCCL cannot reduce.
    """
    local = [p.grad.to_local() for p in params]
    squares = torch.stack([g.detach().float().pow(2).sum().to(ctx.device) for g in local]).sum()
    flag = torch.tensor(float(bad_loss), device=ctx.device)
    summed = ctx.all_reduce_sum(torch.stack([squares, flag]))
    norm = float(summed[0].sqrt())
    if max_norm and math.isfinite(norm):
        coef = max_norm / (norm + 1e-6)  # as torch.nn.utils.clip_grad_norm_
        if coef < 1.0:
            for grad in local:
                grad.mul_(coef)
    return norm, round(float(summed[1]))
