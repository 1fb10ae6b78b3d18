"""Models of one worker, built lazily from ``cfg.models`` through the policy registry.

Trainable models are data-parallel in one of two ways, chosen per model by
``models.<name>.parallel.strategy`` (``auto``: the device's default, see ``devices.py``):

- ``ddp``: every rank holds a full replica; ``training/gradients.py::sync_and_clip`` sums the
  gradients in one flat all-reduce (the CPU default).
- ``fsdp``: FSDP2 ``fully_shard`` over the dp group of the nodes that use the model: each
  repeated transformer block is one unit, the root holds the rest (embeddings, heads). Each
  forward pass all-gathers a unit's parameters and each backward reduce-scatters its
  gradients, so every forward is a collective (see ``runtime/fsdp.py::chunked_forward``).

Checkpoints hold full (unsharded) CPU tensors in the plain ``state_dict`` formats of
``nn.Module`` and ``torch.optim``, whatever the strategy, so a GPU (FSDP) checkpoint resumes
a CPU (DDP) run and back.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from embodied_rl import checkpoint
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import dataclass_problems
from embodied_rl.data.layout import Layout
from embodied_rl.devices import STRATEGIES, device_spec, resolve_dtype, resolve_strategy
from embodied_rl.registry import MODEL_REGISTRIES, model_builder
from embodied_rl.runtime.fsdp import (
    autocast_methods,
    enable_gradient_checkpointing,
    full_tensor,
    gather_optimizer_state,
    load_full_into_sharded,
    load_full_optimizer_state,
    shard_model,
)
from embodied_rl.runtime.init_from import load_init_state

MIXED_PRECISIONS = ("auto", "float32", "bfloat16", "float16")


@dataclass
class OptimizerConfig:
    """AdamW options of a trainable model (``models.<name>.optimizer``).

    ``warmup_steps``: the learning rate rises linearly over the first N optimizer updates
    (update k, counted from 1, uses ``lr * min(1, k / N)``); 0 = the full rate from the first.
    Adam's first update moves every weight by about ``lr`` whatever its gradient (its moment
    estimates are one sample), which can knock an RL run started from an SFT checkpoint off
    its start; a warmup lets the moments settle first. The count is Adam's own step count, so
    it carries across ``resume=true`` with the optimizer state.

    ``decay_steps``: after the warmup, the rate falls from ``lr`` to ``min_lr`` along half a
    cosine over the next N updates (update ``warmup + j`` uses ``min_lr + (lr - min_lr) *
    (1 + cos(pi * j / N)) / 2``), then stays at ``min_lr``; 0 = ``lr`` to the end. Pretraining
    (e.g. the V-JEPA world model) decays so that its last updates refine rather than move.
    """

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        check_range("optimizer.lr", self.lr, 0, low_open=True)
        check_range("optimizer.warmup_steps", self.warmup_steps, 0, note=" (0 = no warmup)")
        check_range("optimizer.decay_steps", self.decay_steps, 0, note=" (0 = no decay)")
        check_range("optimizer.min_lr", self.min_lr, 0, self.lr, note=" (at most optimizer.lr)")
        check_range("optimizer.weight_decay", self.weight_decay, 0)
        check_range("optimizer.eps", self.eps, 0, low_open=True)
        # A negative clip norm scales every gradient by a negative factor: gradient ascent.
        check_range(
            "optimizer.grad_clip", self.grad_clip, 0, low_open=True, note=" or null (no clipping)"
        )

    def lr_at(self, updates_done: int) -> float:
        """The learning rate of the next update after ``updates_done`` updates."""
        update = updates_done + 1
        if update <= self.warmup_steps:
            return self.lr * update / self.warmup_steps
        if self.decay_steps == 0:
            return self.lr
        progress = min(1.0, (update - self.warmup_steps) / self.decay_steps)
        return self.min_lr + (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress)) / 2


@dataclass
class ParallelConfig:
    """Data parallelism of a trainable model (``models.<name>.parallel``).

    Attributes:
        strategy: ``auto`` (the device's default: fsdp on cuda/npu, ddp on cpu), ``ddp`` or
            ``fsdp``.
        cpu_offload: FSDP keeps the parameter shards, gradients and optimizer state in CPU
            memory (``CPUOffloadPolicy``); ignored by ``auto`` resolving to ddp.
        gradient_checkpointing: recompute activations in backward (the policy's
            ``enable_gradient_checkpointing()``, else its ``transformers`` model's).
        mixed_precision: compute dtype: ``auto`` (the device's: bfloat16 on cuda/npu, float32
            on cpu), ``float32`` (off), ``bfloat16`` or ``float16``. FSDP casts the blocks'
            parameters (gradients are reduced in float32); DDP runs under ``torch.autocast``.
            Master weights and optimizer state stay float32 either way.
    """

    strategy: str = "auto"
    cpu_offload: bool = False
    gradient_checkpointing: bool = False
    mixed_precision: str = "auto"

    def __post_init__(self) -> None:
        if self.strategy not in ("auto", *STRATEGIES):
            raise ValueError(
                f"parallel.strategy must be one of {('auto', *STRATEGIES)}, got {self.strategy!r}"
            )
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ValueError(
                f"parallel.mixed_precision must be one of {MIXED_PRECISIONS}, "
                f"got {self.mixed_precision!r}"
            )
        if self.cpu_offload and self.strategy == "ddp":
            raise ValueError("parallel.cpu_offload needs strategy fsdp (or auto on cuda/npu)")


@dataclass
class ModelSpec:
    """One entry of ``cfg.models``: which policy, its options, and whether it trains.

    A reference model is a non-trainable entry with the same options as the actor: policies
    build deterministically from their options (seeded init or the same local weights), so
    it starts identical to the actor (give it the actor's ``init_from`` too).

    ``init_from``: a run directory or one of its ``checkpoints/step_N`` directories whose
    weights (and normalisation statistics) the model starts from, e.g. an SFT run; see
    ``embodied_rl/runtime/init_from.py``.
    """

    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    trainable: bool = True
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    init_from: str | None = None

    @classmethod
    def from_mapping(cls, name: str, raw: Mapping[str, Any]) -> ModelSpec:
        allowed = {"policy", "options", "trainable", "optimizer", "parallel", "init_from"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(
                f"models.{name}: unknown key(s) {unknown}; valid keys: {sorted(allowed)}"
            )
        if "policy" not in raw:
            known = sorted(n for registry in MODEL_REGISTRIES for n in registry.names())
            raise ValueError(f"models.{name}: missing 'policy' (one of {known})")
        optim = dict(raw.get("optimizer") or {})
        bad = sorted(set(optim) - set(OptimizerConfig.__dataclass_fields__))
        if bad:
            raise ValueError(
                f"models.{name}.optimizer: unknown key(s) {bad}; valid keys: "
                f"{sorted(OptimizerConfig.__dataclass_fields__)}"
            )
        parallel = raw.get("parallel") or {}
        problems = dataclass_problems(ParallelConfig, parallel, f"models.{name}.parallel")
        if problems:
            raise ValueError("; ".join(f"{problem} ({fix})" for problem, fix in problems))
        spec = cls(
            policy=str(raw["policy"]),
            options=dict(raw.get("options") or {}),
            trainable=bool(raw.get("trainable", True)),
            optimizer=OptimizerConfig(**optim),
            parallel=ParallelConfig(**parallel),
            init_from=None if raw.get("init_from") is None else str(raw["init_from"]),
        )
        if not spec.trainable and spec.parallel != ParallelConfig():
            raise ValueError(
                f"models.{name}: parallel applies to trainable models only (this one has "
                "trainable: false and is replicated as-is); remove its parallel block"
            )
        return spec


@dataclass(frozen=True)
class ModelUse:
    """A DAG node that names a model in its config (``model: actor``) and its layout."""

    node_id: str
    layout: Layout


def model_uses(dags: Sequence[Any]) -> dict[str, list[ModelUse]]:
    """Every node of ``dags`` (DagSpecs) that names a model, by model name."""
    uses: dict[str, list[ModelUse]] = {}
    for dag in dags:
        for node in dag.nodes:
            name = getattr(node.config, "model", None)
            if name is not None:
                uses.setdefault(name, []).append(ModelUse(node.id, node.layout))
    return uses


class ModelStore:
    """Builds each model on first use and owns the optimizers of trainable ones.

    A worker calls :meth:`set_uses` once its process groups exist; an FSDP model is sharded
    when first built, over the dp group of the nodes that use it.
    """

    def __init__(self, specs: Mapping[str, Mapping[str, Any]], device: torch.device) -> None:
        self.specs = {name: ModelSpec.from_mapping(name, raw) for name, raw in specs.items()}
        self.device = device
        self.device_spec = device_spec(device.type)
        self._models: dict[str, torch.nn.Module] = {}
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        self._uses: dict[str, list[ModelUse]] = {}
        self._groups: Mapping[tuple[int, ...], Any] = {}
        self._fsdp_groups: dict[str, Any] = {}

    def set_uses(
        self, uses: Mapping[str, Sequence[ModelUse]], groups: Mapping[tuple[int, ...], Any]
    ) -> None:
        """The nodes that use each model (all ranks) and the process groups by rank tuple."""
        self._uses = {name: list(u) for name, u in uses.items()}
        self._groups = groups

    def __getitem__(self, name: str) -> torch.nn.Module:
        if name not in self._models:
            self._models[name] = self._build(name)
        return self._models[name]

    def strategy(self, name: str) -> str:
        """``ddp`` or ``fsdp`` for a trainable model; frozen models are plain replicas."""
        spec = self.specs[name]
        if not spec.trainable:
            return "ddp"
        strategy = resolve_strategy(self.device_spec, spec.parallel.strategy)
        if strategy == "fsdp" and not dist.is_initialized():
            if spec.parallel.strategy == "fsdp":
                raise RuntimeError(
                    f"models.{name}.parallel.strategy is fsdp but torch.distributed is not "
                    "initialised (a single-process run); use strategy auto or ddp"
                )
            return "ddp"  # nothing to shard over: one process holds the whole model
        return strategy

    def compute_dtype(self, name: str) -> torch.dtype | None:
        """The mixed-precision dtype of a trainable model, ``None`` for float32."""
        return resolve_dtype(self.device_spec, self.specs[name].parallel.mixed_precision)

    def _build(self, name: str) -> torch.nn.Module:
        if name not in self.specs:
            raise KeyError(f"model {name!r} is not configured; add models.{name} to the config")
        spec = self.specs[name]
        # A layout FSDP cannot serve fails before the (possibly large) model is built.
        group = self._fsdp_group(name) if self.strategy(name) == "fsdp" else None
        model = model_builder(spec.policy)(spec.options, self.device)
        if spec.init_from is not None:  # weights and statistics buffers, before any sharding
            model.load_state_dict(load_init_state(spec.init_from, name))
        if not spec.trainable:
            model.eval()
            model.requires_grad_(False)
            return model
        if spec.parallel.gradient_checkpointing:
            enable_gradient_checkpointing(model, name)
        dtype = self.compute_dtype(name)
        if group is not None:
            shard_model(model, group, self.device_spec.type, dtype, spec.parallel.cpu_offload)
            self._fsdp_groups[name] = group
        elif dtype is not None:
            autocast_methods(model, self.device.type, dtype)
        return model

    def _fsdp_group(self, name: str) -> Any:
        """The dp group FSDP shards ``name`` over: it must hold every rank that holds the
        model, since every forward pass is a collective over it."""
        uses = self._uses.get(name)
        fix = (
            f"give every node with model: {name} the same ranks and no tensor parallelism, "
            f"or set models.{name}.parallel.strategy: ddp"
        )
        if not uses:
            raise RuntimeError(
                f"model {name!r} is sharded with FSDP but no DAG node that uses it is known on "
                f"this worker (ModelStore.set_uses was not called). Fix: {fix}"
            )
        ranks = uses[0].layout.ranks
        for use in uses:
            if set(use.layout.ranks) != set(ranks) or use.layout.tp_size != 1:
                raise RuntimeError(
                    f"model {name!r} is sharded with FSDP over the dp group of node "
                    f"{uses[0].node_id!r} (ranks {list(ranks)}), but node {use.node_id!r} "
                    f"holds it on ranks {list(use.layout.ranks)} with tp {use.layout.tp_size}; "
                    f"FSDP needs the dp group to be every rank that holds the model. Fix: {fix}"
                )
        return self._groups[ranks]

    def is_sharded(self, name: str) -> bool:
        """Whether ``name`` is built and sharded with FSDP."""
        return name in self._fsdp_groups

    def optimizer(self, name: str) -> torch.optim.Optimizer:
        if not self.specs[name].trainable:
            raise ValueError(f"model {name!r} has trainable: false; it cannot be optimised")
        if name not in self._optimizers:
            opt = self.specs[name].optimizer
            # Built after sharding: FSDP replaces the parameters with DTensor shards.
            params = [p for p in self[name].parameters() if p.requires_grad]
            self._optimizers[name] = torch.optim.AdamW(
                params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay, eps=opt.eps
            )
        return self._optimizers[name]

    def grad_clip(self, name: str) -> float | None:
        return self.specs[name].optimizer.grad_clip

    def set_scheduled_lr(self, name: str) -> None:
        """Set the learning rate of ``name``'s next update (``optimizer.warmup_steps``)."""
        optimizer = self.optimizer(name)
        lr = self.specs[name].optimizer.lr_at(adam_updates_done(optimizer))
        for group in optimizer.param_groups:
            group["lr"] = lr

    def built(self) -> list[str]:
        return sorted(self._models)

    def full_weights(self, name: str) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the model's state dict as full (unsharded) tensors.

        For an FSDP model each tensor is all-gathered in turn (on the device, so one full
        tensor at a time is in memory): a collective, every rank of the model's dp group must
        iterate it to the end, in step. Otherwise the plain ``state_dict`` items.
        """
        for key, value in self[name].state_dict().items():
            yield key, full_tensor(value)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Weights of trainable models and optimizer states (frozen models rebuild as-is).

        Full CPU tensors in the plain formats. An FSDP model is gathered (a collective over
        its dp group) and kept by the group's first rank only; the other ranks store a
        reference to that rank's shard (``checkpoint.shard_reference``).
        """
        state: dict[str, Any] = {}
        for name in self.built():
            if not self.specs[name].trainable:
                continue
            model, optimizer = self._models[name], self.optimizer(name)
            if not self.is_sharded(name):
                state[f"model/{name}"] = model.state_dict()
                state[f"optim/{name}"] = optimizer.state_dict()
                continue
            group = self._fsdp_groups[name]
            keep = dist.get_rank(group) == 0
            weights = {}
            for key, value in self.full_weights(name):  # every rank takes part in the gathers
                if keep:
                    weights[key] = value.cpu()
            optim = gather_optimizer_state(optimizer, keep)
            owner = dist.get_global_rank(group, 0)
            state[f"model/{name}"] = weights if keep else checkpoint.shard_reference(owner)
            state[f"optim/{name}"] = optim if keep else checkpoint.shard_reference(owner)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict` output (full tensors; an FSDP model takes its shards)."""
        for key, value in state.items():
            kind, name = key.split("/", 1)
            model = self[name]  # built (and sharded) first
            if kind == "model" and self.is_sharded(name):
                load_full_into_sharded(model, value)
            elif kind == "model":
                model.load_state_dict(value)
            elif self.is_sharded(name):
                load_full_optimizer_state(self.optimizer(name), value)
            else:
                self.optimizer(name).load_state_dict(value)


def adam_updates_done(optimizer: torch.optim.Optimizer) -> int:
    """How many updates an Adam(W) optimizer has made (its per-parameter ``step`` state)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if step is not None:
                return int(step)
    return 0
