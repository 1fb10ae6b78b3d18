"""FSDP2 for the models of a ``ModelStore``, and the equal-pass rule it imposes on nodes.

``fully_shard`` makes every forward pass of a sharded model a collective over its dp group
(each unit all-gathers its parameters; backward reduce-scatters the gradients). Hence
:func:`chunked_forward` and :func:`fsdp_pass_count`: every rank of the group runs the same
number of passes, whatever its number of rows. Checkpoints hold full tensors in the plain
``nn.Module`` / ``torch.optim`` formats (:func:`full_tensor`, :func:`gather_optimizer_state`,
:func:`load_full_into_sharded`, :func:`load_full_optimizer_state`), so they are the same as
those of replicated (DDP) models.

``torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True,
cpu_offload=True)`` is not used: it keeps the state on GLOBAL rank 0 only and its
``broadcast_from_rank0`` loads from there, which fails for a model held by another subset of
ranks (a fan-out branch of the DAG).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._pytree import tree_map

from embodied_rl.data.batch import batch_len
from embodied_rl.runtime.context import MetricSink, NodeContext

# The policy interface methods that run the model (interfaces.py); FSDP must gather the root's
# parameters around each of them, not only around ``forward``.
FORWARD_METHODS = ("evaluate", "values", "act", "generate")


def enable_gradient_checkpointing(model: torch.nn.Module, name: str) -> None:
    """The policy's ``enable_gradient_checkpointing()``, else its ``transformers`` model's."""
    if callable(getattr(model, "enable_gradient_checkpointing", None)):
        model.enable_gradient_checkpointing()
        return
    # Non-reentrant checkpointing works with FSDP2 hooks and frozen inputs.
    kwargs = {"use_reentrant": False}
    for module in model.modules():  # pre-order: the outermost transformers model first
        if callable(getattr(module, "activation_checkpointing_enable", None)):
            module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            return
        if callable(getattr(module, "gradient_checkpointing_enable", None)):  # transformers < 5.x
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            return
    raise ValueError(
        f"models.{name}.parallel.gradient_checkpointing: {type(model).__name__} has no "
        "enable_gradient_checkpointing() method and no transformers submodule; set it to false"
    )


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of ``model``: children of each outermost ``nn.ModuleList`` whose
    children (two or more) all have one type, e.g. ``model.layers`` of a transformers LM."""
    blocks: list[torch.nn.Module] = []
    taken: list[str] = []
    for path, module in model.named_modules():
        if any(path.startswith(prefix + ".") for prefix in taken):
            continue  # inside a block already chosen (e.g. MoE experts)
        children = list(module) if isinstance(module, torch.nn.ModuleList) else []
        if len(children) > 1 and len({type(c) for c in children}) == 1:
            blocks.extend(children)
            taken.append(path)
    return blocks


def shard_model(
    model: torch.nn.Module,
    group: Any,
    device_type: str,
    dtype: torch.dtype | None,
    cpu_offload: bool,
) -> None:
    """FSDP2-shard ``model`` in place over ``group``: each block, then the root.

    Mixed precision casts the blocks only (bf16 parameters, fp32 gradient reduction): the
    root's embeddings and heads stay float32, so policies that feed float32 tensors into a
    head (``.float()`` on hidden states) keep working and log-probs are computed in fp32.
    Gradients are SUMMED over the group (no division), as ``sync_and_clip`` does for DDP:
    the losses are already normalised by global counts.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    mesh = DeviceMesh.from_group(group, device_type)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    block_mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=block_mp, offload_policy=offload)
        if dtype is not None:
            # FSDP2 casts a block's floating-point inputs in its forward pre-hook, which it
            # skips while a checkpointed block is recomputed in backward: the float32 rotary
            # cos/sin of the root then met bf16 values in attention (CUDA, torch 2.11).
            block.register_forward_pre_hook(
                functools.partial(cast_inputs, dtype=dtype), with_kwargs=True
            )
    # Explicitly True: by default FSDP2 keeps the root unsharded after forward until backward,
    # so after a forward-only pass (log-probs, values, rollout) an optimizer step would update
    # the shards while later passes kept using the stale gathered root parameters.
    fully_shard(model, mesh=mesh, offload_policy=offload, reshard_after_forward=True)
    for method in FORWARD_METHODS:
        if callable(getattr(model, method, None)):
            register_fsdp_forward_method(model, method)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no AVG / PREMUL_SUM


def cast_inputs(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A forward pre-hook: every floating-point tensor in ``args``/``kwargs`` (nested too) in
    ``dtype``, as FSDP2's ``cast_forward_inputs`` does (a no-op on inputs already in it)."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        return value

    return tree_map(cast, (args, kwargs))


def autocast_methods(model: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run the policy's forward methods under ``torch.autocast`` (mixed precision for DDP)."""

    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def autocast_method(*args: Any, **kwargs: Any) -> Any:
            with torch.autocast(device_type, dtype=dtype):
                return method(*args, **kwargs)

        return autocast_method

    for name in ("forward", *FORWARD_METHODS):
        method = getattr(model, name, None)
        if callable(method):
            object.__setattr__(model, name, wrap(method))


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` was sharded with FSDP2 (every forward pass is then a collective)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_tensor(value: Any) -> Any:
    """A DTensor's full tensor (an all-gather over its mesh); other values as they are.

    A CPU-offloaded shard is moved to the mesh's device first: NCCL/HCCL gather device
    memory only.
    """
    if not isinstance(value, DTensor):
        return value
    if value.device.type != value.device_mesh.device_type:
        value = value.to(value.device_mesh.device_type)
    return value.full_tensor()


def gather_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict[str, Any] | None:
    """The optimizer's plain ``state_dict`` with every DTensor gathered to a full CPU tensor.

    A collective over the shards' group: every rank gathers in the same order (parameter
    index, then state key); only ranks with ``keep`` build the result.
    """
    raw = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for index in sorted(raw["state"]):
        entry = {}
        for key in sorted(raw["state"][index]):
            value = full_tensor(raw["state"][index][key])
            entry[key] = value.cpu() if isinstance(value, torch.Tensor) else value
        state[index] = entry
    return {"state": state, "param_groups": raw["param_groups"]} if keep else None


@torch.no_grad()
def _copy_full_into(target: torch.Tensor, full: torch.Tensor, what: str) -> None:
    """Copy ``full`` into ``target`` (a DTensor shard takes its own piece of it)."""
    if isinstance(target, DTensor):
        if tuple(full.shape) != tuple(target.shape):
            raise ValueError(f"{what}: checkpoint shape {tuple(full.shape)}, model {target.shape}")
        mesh = target.device_mesh
        # src_data_rank=None: every rank holds the full tensor and slices it, no collective.
        piece = distribute_tensor(
            full.to(mesh.device_type), mesh, target.placements, src_data_rank=None
        ).to_local()
        target.to_local().copy_(piece)
    else:
        target.copy_(full)


def load_full_into_sharded(model: torch.nn.Module, full: Mapping[str, torch.Tensor]) -> None:
    """Load a full (plain) state dict into an FSDP model; every rank passes the full one."""
    local = model.state_dict()
    missing, unexpected = sorted(set(local) - set(full)), sorted(set(full) - set(local))
    if missing or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    for key, target in local.items():
        _copy_full_into(target, full[key], key)


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, full: Mapping[str, Any]) -> None:
    """Load a plain (full-tensor) optimizer state into the optimizer of an FSDP model.

    Each full moment tensor is sliced like its parameter, then ``load_state_dict`` takes the
    plain format as usual (parameters are matched by their index in the optimizer).
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for index, entry in full["state"].items():
        param = params[int(index)]
        state[index] = {
            key: _shard_like(param, value) if _is_moment(param, value) else value
            for key, value in entry.items()
        }
    optimizer.load_state_dict({"state": state, "param_groups": full["param_groups"]})


def _is_moment(param: torch.Tensor, value: Any) -> bool:
    return isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(param.shape)


def _shard_like(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` (the full shape of ``param``) as a DTensor sharded like ``param``."""
    if not isinstance(param, DTensor):
        return value
    mesh = param.device_mesh
    sharded = distribute_tensor(
        value.to(mesh.device_type), mesh, param.placements, src_data_rank=None
    )
    return sharded.to(param.device) if param.device != sharded.device else sharded


# ------------------------------------------------------------ equal passes for FSDP models
def fsdp_pass_count(ctx: NodeContext, model: torch.nn.Module, local: int) -> int:
    """How many forward passes this rank must run on ``model``: ``local``, or for an FSDP
    model the largest ``local`` over the dp group, since each pass all-gathers parameters
    with every rank of the group and a rank that stops early would leave the others hanging."""
    if not is_fsdp(model) or ctx.dp_group is None or ctx.dp_size == 1:
        return local
    count = torch.tensor([local], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=ctx.dp_group)
    return int(count.item())


def filler_rows(batch: TensorDict) -> TensorDict:
    """One row to run a pass whose result is thrown away: the first row, or zeros (same keys,
    shapes and dtypes, tensor fields only) when this rank has no rows."""
    if batch_len(batch) > 0:
        return batch[:1]
    return batch.apply(
        lambda t: torch.zeros((1, *t.shape[1:]), dtype=t.dtype, device=t.device), batch_size=[1]
    )


@contextlib.contextmanager
def discarded_metrics(ctx: NodeContext) -> Iterator[None]:
    """Metrics logged inside go to a throw-away sink (filler passes must not count)."""
    kept, ctx.metrics = ctx.metrics, MetricSink()
    try:
        yield
    finally:
        ctx.metrics = kept


def chunked_forward(
    ctx: NodeContext,
    model: torch.nn.Module,
    batch: TensorDict,
    micro_batch_size: int,
    forward: Callable[[TensorDict], torch.Tensor],
) -> list[torch.Tensor]:
    """``forward`` over this rank's rows, ``micro_batch_size`` rows at a time.

    For an FSDP model every rank of the dp group runs the same number of passes: a rank with
    fewer chunks runs ``forward`` on :func:`filler_rows` and drops the output.

    Returns:
        One output per chunk of real rows, in row order (empty when the batch is).
    """
    chunks = torch.arange(batch_len(batch)).split(micro_batch_size)
    passes = fsdp_pass_count(ctx, model, len(chunks))  # before any pass: each is a collective
    outputs = [forward(batch[rows]) for rows in chunks]
    with discarded_metrics(ctx):
        for _ in range(passes - len(chunks)):
            forward(filler_rows(batch))
    return outputs


@contextlib.contextmanager
def gathered_for_inference(model: torch.nn.Module) -> Iterator[None]:
    """Inside, ``model``'s forward passes run no collective; a no-op for unsharded models.

    Every FSDP unit all-gathers its parameters once on entry (the same collectives, in the
    same order, on every rank) and keeps them until exit, so the ranks may then run different
    numbers of passes: generation stops at different lengths, episodes end at different
    steps. It costs the full parameters' memory for the duration, as an inference engine
    would; training must happen outside (the gathered parameters are not the shards the
    optimizer updates).
    """
    from torch.distributed.fsdp import FSDPModule

    if not is_fsdp(model):
        yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)
