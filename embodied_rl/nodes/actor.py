"""``actor.train``: the clipped policy-gradient update (PPO, GRPO, DAPO, GSPO, CPGD losses).

Uses only the policy interface, ``policy.evaluate(batch, temperature) -> (logprobs (B, R),
entropy (B, R))``, so it serves every policy that implements it; the loop, gradient sync and
non-finite guard are the update engine's (:mod:`embodied_rl.training`). Formulas:
docs/ALGORITHMS.md, "Policy losses".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
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
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext
from embodied_rl.training.guard import check_max_bad_steps, create_bad_step_counter
from embodied_rl.training.inputs import evaluate_keys
from embodied_rl.training.updates import run_updates


@dataclass
class ActorTrainConfig:
    """Options of ``actor.train`` (docs/ALGORITHMS.md, "Policy losses").

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
            (non-finite loss or gradient) update; 0 never stops
            (:mod:`embodied_rl.training.guard`).
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
        check_range("cpgd_drift_coef", self.cpgd_drift_coef, 0)
        if self.cpgd_drift_coef and self.policy_loss != "cpgd":
            raise ValueError(
                "cpgd_drift_coef is CPGD's policy-drift weight; set policy_loss: cpgd or "
                "cpgd_drift_coef: 0"
            )
        check_fields(self, ("ppo_epochs", "num_mini_batches", "micro_batch_size"), 1)
        check_range("temperature", self.temperature, 0, low_open=True)
        check_range("kl_coef", self.kl_coef, 0, note=" (0: no KL term)")

    def clip_spec(self) -> ClipSpec:
        """The clipped objective these options select."""
        return ClipSpec(
            clip_low=self.clip_ratio_low,
            clip_high=self.clip_ratio_high,
            ratio_level=self.ratio_level,
            dual_clip_c=self.dual_clip_c,
            policy_loss=self.policy_loss,
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
    :mod:`embodied_rl.training.guard`); ``max_bad_steps`` such steps in a row stop the run.
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
    for name, value in metrics.items():
        # Shares of a global mean add up over ranks and micro-batches; averaged over updates.
        ctx.log_share(name, value.item() / _updates_per_step(cfg))
    return loss


def _updates_per_step(cfg: ActorTrainConfig) -> int:
    return cfg.ppo_epochs * cfg.num_mini_batches
