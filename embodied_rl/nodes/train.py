"""Policy nodes that use only the policy interface: reference log-probs and the actor update.

``policy.evaluate(batch, temperature) -> (logprobs (B, R), entropy (B, R))`` is all these
nodes need, so they serve every policy that implements it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.losses import (
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    GlobalCounts,
    aggregate,
    kl_penalty,
    ppo_clip_loss,
)
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len
from embodied_rl.runtime.context import NodeContext

EVALUATE_KEYS = (K.PROMPT_IDS, K.PROMPT_MASK, K.RESPONSE_IDS, K.RESPONSE_MASK)


@dataclass
class RefLogprobConfig:
    """Options of ``ref.logprobs``: which model, sampling temperature, rows per forward."""

    model: str = "reference"
    temperature: float = 1.0
    micro_batch_size: int = 16


@register_node(
    "ref.logprobs", reads=EVALUATE_KEYS, writes=(K.REF_LOGPROBS,), config=RefLogprobConfig
)
def ref_logprobs_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REF_LOGPROBS (B, R) of the frozen reference policy."""
    cfg: RefLogprobConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    chunks = []
    with torch.no_grad():
        for rows in torch.arange(batch_len(batch)).split(max(cfg.micro_batch_size, 1)):
            chunks.append(policy.evaluate(batch[rows], cfg.temperature)[0])
    width = batch[K.RESPONSE_IDS].shape[-1]
    batch[K.REF_LOGPROBS] = torch.cat(chunks) if chunks else torch.zeros(0, width)
    return batch


@dataclass
class ActorTrainConfig:
    """Options of ``actor.train`` (ALGORITHMS.md, "Policy losses").

    Attributes:
        model: the trainable model to update (its optimizer comes from ``models.<name>``).
        ppo_epochs: passes over the batch per step.
        num_mini_batches: optimizer steps per epoch; each rank splits its shard into this many.
        micro_batch_size: rows per forward/backward (gradient accumulation; no effect on math).
        clip_ratio_low / clip_ratio_high: PPO clip range ``[1-low, 1+high]``.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-sum`` or ``seq-mean-token-mean``.
        kl_coef / kl_estimator: KL-to-reference loss term (needs REF_LOGPROBS when > 0).
        entropy_coef: entropy bonus (subtracted from the loss).
        temperature: must equal the rollout's sampling temperature.
    """

    model: str = "actor"
    ppo_epochs: int = 1
    num_mini_batches: int = 1
    micro_batch_size: int = 16
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        if min(self.ppo_epochs, self.num_mini_batches, self.micro_batch_size) < 1:
            raise ValueError("ppo_epochs, num_mini_batches and micro_batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def _train_reads(cfg: ActorTrainConfig) -> tuple[str, ...]:
    extra = (K.REF_LOGPROBS,) if cfg.kl_coef > 0 else ()
    return EVALUATE_KEYS + (K.OLD_LOGPROBS, K.ADVANTAGES) + extra


@register_node("actor.train", reads=_train_reads, writes=(), config=ActorTrainConfig)
def actor_train_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Clipped policy-gradient update with gradients summed over the dp group."""
    cfg: ActorTrainConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    optimizer = ctx.models.optimizer(cfg.model)
    policy.train()
    updates = 0
    for _ in range(cfg.ppo_epochs):
        for rows in torch.arange(batch_len(batch)).tensor_split(cfg.num_mini_batches):
            mini = batch[rows]
            counts = _global_counts(ctx, mini)
            optimizer.zero_grad(set_to_none=False)
            for micro_rows in rows.new_tensor(range(len(rows))).split(cfg.micro_batch_size):
                loss = _micro_batch_loss(ctx, policy, mini[micro_rows], counts, cfg)
                loss.backward()
            grad_norm = _sync_and_clip(ctx, policy, ctx.models.grad_clip(cfg.model))
            optimizer.step()
            updates += 1
            ctx.metrics.log("actor/grad_norm", grad_norm, reduce="max")
    ctx.metrics.log("actor/updates", updates, reduce="max")
    return batch


def _global_counts(ctx: NodeContext, mini: TensorDict) -> GlobalCounts:
    """Valid tokens and sequences of this mini-batch over the whole dp group."""
    mask = mini[K.RESPONSE_MASK].float()
    local = torch.tensor([mask.sum().item(), float(batch_len(mini))], dtype=torch.float64)
    tokens, sequences = ctx.all_reduce_sum(local).tolist()
    return GlobalCounts(tokens=tokens, sequences=sequences)


def _micro_batch_loss(
    ctx: NodeContext,
    policy: torch.nn.Module,
    micro: TensorDict,
    counts: GlobalCounts,
    cfg: ActorTrainConfig,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss; logs its metric shares."""
    logprobs, entropy = policy.evaluate(micro, cfg.temperature)
    mask = micro[K.RESPONSE_MASK].float()
    pg, clipped = ppo_clip_loss(
        logprobs,
        micro[K.OLD_LOGPROBS],
        micro[K.ADVANTAGES],
        cfg.clip_ratio_low,
        cfg.clip_ratio_high,
    )
    loss = aggregate(pg, mask, cfg.loss_agg_mode, counts)
    metrics = {"loss/policy": loss.detach()}
    if cfg.kl_coef > 0:
        kl = aggregate(
            kl_penalty(logprobs, micro[K.REF_LOGPROBS], cfg.kl_estimator),
            mask,
            cfg.loss_agg_mode,
            counts,
        )
        loss = loss + cfg.kl_coef * kl
        metrics["loss/kl"] = kl.detach()
    entropy_term = aggregate(entropy, mask, cfg.loss_agg_mode, counts)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * entropy_term
    metrics["actor/entropy"] = entropy_term.detach()
    metrics["actor/clip_fraction"] = aggregate(clipped.float(), mask, "token-mean", counts).detach()
    if ctx.tp_rank == 0:  # tp members hold the same rows: count them once
        for name, value in metrics.items():
            # Shares of a global mean add up over ranks and micro-batches; averaged over updates.
            ctx.metrics.log(name, value.item() / _updates_per_step(cfg), reduce="sum")
    return loss


def _updates_per_step(cfg: ActorTrainConfig) -> int:
    return cfg.ppo_epochs * cfg.num_mini_batches


def _sync_and_clip(ctx: NodeContext, policy: torch.nn.Module, max_norm: float | None) -> float:
    """Sum gradients over the dp group in one flat all-reduce, then clip; returns the norm."""
    params = [p for p in policy.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if ctx.dp_group is not None and ctx.dp_size > 1:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=ctx.dp_group)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else float("inf"))
    return float(norm)
