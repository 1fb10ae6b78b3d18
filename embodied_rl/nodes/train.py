"""Policy nodes that use only the policy interface: reference log-probs and the actor update.

``policy.evaluate(batch, temperature) -> (logprobs (B, R), entropy (B, R))`` is all these
nodes need, so they serve every policy that implements it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.losses import (
    KL_ESTIMATORS,
    ClipSpec,
    GlobalCounts,
    aggregate,
    check_aggregation,
    kl_penalty,
    policy_loss,
)
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len
from embodied_rl.data.mini_batches import global_mini_batches
from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.fsdp import (
    chunked_forward,
    discarded_metrics,
    filler_rows,
    fsdp_pass_count,
    is_fsdp,
)

logger = logging.getLogger(__name__)

# What ``policy.evaluate`` reads, by the kind of data the policy scores (interfaces.py).
EVALUATE_KEYS = {
    "text": (K.PROMPT_IDS, K.PROMPT_MASK, K.RESPONSE_IDS, K.RESPONSE_MASK),
    "trajectory": (K.STEP_MASK, K.RESPONSE_MASK),
}


def evaluate_keys(inputs: str) -> tuple[str, ...]:
    """Batch keys a policy's ``evaluate`` needs: ``text`` (LLM) or ``trajectory`` (embodied).

    A trajectory policy also reads its own observation and action keys (OBS_STATE and/or
    OBS_IMAGE, ACTION_TOKENS or RAW_ACTIONS), which depend on the policy and are checked by it.
    """
    if inputs not in EVALUATE_KEYS:
        raise ValueError(f"inputs must be one of {sorted(EVALUATE_KEYS)}, got {inputs!r}")
    return EVALUATE_KEYS[inputs]


@dataclass
class RefLogprobConfig:
    """Options of ``ref.logprobs``: which model, sampling temperature, rows per forward."""

    model: str = "reference"
    temperature: float = 1.0
    micro_batch_size: int = 16
    inputs: str = "text"

    def __post_init__(self) -> None:
        evaluate_keys(self.inputs)


@register_node(
    "ref.logprobs",
    reads=lambda c: evaluate_keys(c.inputs),
    writes=(K.REF_LOGPROBS,),
    config=RefLogprobConfig,
)
def ref_logprobs_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REF_LOGPROBS (B, R) of the frozen reference policy."""
    cfg: RefLogprobConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    with torch.no_grad():
        chunks = chunked_forward(
            ctx,
            policy,
            batch,
            max(cfg.micro_batch_size, 1),
            lambda rows: policy.evaluate(rows, cfg.temperature)[0],
        )
    width = batch[K.RESPONSE_MASK].shape[-1]
    batch[K.REF_LOGPROBS] = torch.cat(chunks) if chunks else torch.zeros(0, width)
    return batch


@dataclass
class ActorTrainConfig:
    """Options of ``actor.train`` (ALGORITHMS.md, "Policy losses").

    Attributes:
        model: the trainable model to update (its optimizer comes from ``models.<name>``).
        ppo_epochs: passes over the batch per step.
        num_mini_batches: optimizer steps per epoch: the global batch is cut into this many
            pieces by ``SAMPLE_ID``, the same for any number of workers
            (:mod:`embodied_rl.data.mini_batches`).
        micro_batch_size: rows per forward/backward (gradient accumulation; no effect on math).
        clip_ratio_low / clip_ratio_high: clip range ``[1-low, 1+high]``; equal values are the
            symmetric PPO clip, 0.2 / 0.28 is DAPO's clip-higher, GSPO uses 3e-4 / 4e-4.
        ratio_level: ``token`` (PPO), ``sequence`` (GSPO: ``s_i = exp(mean_t log r_t)`` and
            one advantage per sequence, the masked token mean of ADVANTAGES) or
            ``sequence_token`` (GSPO-token: value ``s_i``, gradient through each token).
            Sequence levels need ``loss_agg_mode`` ``seq-mean-token-mean`` (GSPO's mean over
            sequences) or ``token-mean`` (sequences weighted by their lengths).
        dual_clip_c: dual-clip bound ``c > 1``: for ``A < 0`` the loss is at most ``-c*A``;
            ``None`` disables it (``ppo`` only).
        policy_loss: ``ppo`` (clip the ratio) or ``cpgd`` (clip the log-ratio to
            ``[log(1-low), log(1+high)]``, token level only).
        cpgd_drift_coef: weight of CPGD's policy-drift term ``KL(pi_old || pi)``.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` or
            ``seq-mean-token-sum-norm`` (Dr. GRPO: sequence sums / (sequences * R)).
        kl_coef / kl_estimator: KL-to-reference loss term (needs REF_LOGPROBS when > 0).
        entropy_coef: entropy bonus (subtracted from the loss).
        temperature: must equal the rollout's sampling temperature.
        inputs: what the policy scores: ``text`` (LLM responses) or ``trajectory``
            (embodied episodes, see ``embodied_rl/interfaces.py``).
        max_bad_steps: stop the run after this many consecutive steps with a skipped
            (non-finite loss or gradient) update; 0 never stops (see :func:`guarded_step`).
    """

    model: str = "actor"
    inputs: str = "text"
    ppo_epochs: int = 1
    num_mini_batches: int = 1
    micro_batch_size: int = 16
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    ratio_level: str = "token"
    dual_clip_c: float | None = None
    policy_loss: str = "ppo"
    cpgd_drift_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    temperature: float = 1.0
    max_bad_steps: int = 3

    def __post_init__(self) -> None:
        evaluate_keys(self.inputs)
        check_max_bad_steps(self.max_bad_steps)
        self.clip_spec()  # raises on a bad clip / ratio / policy-loss combination
        check_aggregation(self.ratio_level, self.loss_agg_mode)
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        if self.cpgd_drift_coef < 0:
            raise ValueError(f"cpgd_drift_coef must be >= 0, got {self.cpgd_drift_coef}")
        if self.cpgd_drift_coef and self.policy_loss != "cpgd":
            raise ValueError(
                "cpgd_drift_coef is CPGD's policy-drift weight; set policy_loss: cpgd or "
                "cpgd_drift_coef: 0"
            )
        if min(self.ppo_epochs, self.num_mini_batches, self.micro_batch_size) < 1:
            raise ValueError("ppo_epochs, num_mini_batches and micro_batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")

    def clip_spec(self) -> ClipSpec:
        """The clipped objective these options select."""
        return ClipSpec(
            clip_low=self.clip_ratio_low,
            clip_high=self.clip_ratio_high,
            ratio_level=self.ratio_level,
            dual_clip_c=self.dual_clip_c,
            policy_loss=self.policy_loss,
        )


# --------------------------------------------------------------------- non-finite updates
BAD_STEPS_STATE = "bad_steps"


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive training steps had a non-finite loss or gradient norm."""


def check_max_bad_steps(max_bad_steps: int) -> None:
    """Validate the ``max_bad_steps`` option of the train nodes."""
    if max_bad_steps < 0:
        raise ValueError(f"max_bad_steps must be >= 0 (0 never stops), got {max_bad_steps}")


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


def _train_reads(cfg: ActorTrainConfig) -> tuple[str, ...]:
    extra = (K.REF_LOGPROBS,) if cfg.kl_coef > 0 else ()
    return evaluate_keys(cfg.inputs) + (K.OLD_LOGPROBS, K.ADVANTAGES) + extra


@register_node(
    "actor.train",
    reads=_train_reads,
    writes=(),
    config=ActorTrainConfig,
    setup=create_bad_step_counter,
)
def actor_train_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Clipped policy-gradient update with gradients summed over the dp group.

    Updates with a non-finite loss or gradient norm are skipped on every rank (see
    :func:`guarded_step`); ``max_bad_steps`` such steps in a row stop the run.
    """
    cfg: ActorTrainConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    policy.train()
    skipped = run_updates(
        ctx,
        batch,
        cfg,
        lambda counts: partial(_micro_batch_loss, ctx, policy, counts=counts, cfg=cfg),
        prefix="actor",
    )
    ctx.metrics.log("actor/updates", _updates_per_step(cfg) - skipped, reduce="max")
    return batch


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
    return global_mini_batches(batch, num_mini_batches, ctx.dp_group, dp_ranks, ctx.rank)


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


def _micro_batch_loss(
    ctx: NodeContext,
    policy: torch.nn.Module,
    micro: TensorDict,
    counts: GlobalCounts,
    cfg: ActorTrainConfig,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch loss; logs its metric shares."""
    logprobs, entropy = policy.evaluate(micro, cfg.temperature)
    device = logprobs.device
    mask = micro[K.RESPONSE_MASK].to(device).float()
    old_logprobs = micro[K.OLD_LOGPROBS].to(device)
    advantages = micro[K.ADVANTAGES].to(device)
    terms = policy_loss(logprobs, old_logprobs, advantages, mask, cfg.clip_spec())

    def agg(values: torch.Tensor, mode: str = cfg.loss_agg_mode) -> torch.Tensor:
        return aggregate(values, mask, mode, counts)

    loss = agg(terms.loss)
    metrics = {"loss/policy": loss.detach()}
    if terms.drift is not None:
        drift = agg(terms.drift)
        loss = loss + cfg.cpgd_drift_coef * drift
        metrics["loss/cpgd_drift"] = drift.detach()
    if cfg.kl_coef > 0:
        kl = agg(kl_penalty(logprobs, micro[K.REF_LOGPROBS].to(device), cfg.kl_estimator))
        loss = loss + cfg.kl_coef * kl
        metrics["loss/kl"] = kl.detach()
    entropy_term = agg(entropy)
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * entropy_term
    metrics["actor/entropy"] = entropy_term.detach()
    # Diagnostics are token means over the valid tokens of the global mini-batch.
    metrics["actor/clip_fraction"] = agg(terms.clipped.float(), "token-mean").detach()
    metrics["actor/ratio_mean"] = agg(terms.ratio, "token-mean").detach()
    if cfg.dual_clip_c is not None:
        metrics["actor/dual_clip_fraction"] = agg(terms.dual_clipped.float(), "token-mean")
    if ctx.tp_rank == 0:  # tp members hold the same rows: count them once
        for name, value in metrics.items():
            # Shares of a global mean add up over ranks and micro-batches; averaged over updates.
            ctx.metrics.log(name, value.item() / _updates_per_step(cfg), reduce="sum")
    return loss


def _updates_per_step(cfg: ActorTrainConfig) -> int:
    return cfg.ppo_epochs * cfg.num_mini_batches


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
