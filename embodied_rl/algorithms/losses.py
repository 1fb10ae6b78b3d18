"""The clipped policy-gradient core and its aggregation (docs/ALGORITHMS.md, "Policy losses").

One clipped surrogate, :func:`clipped_surrogate`, serves every variant; the variants only
choose what is clipped and how the per-token losses are reduced:

* ``ppo``: the token ratio ``r_t = pi/pi_old`` (PPO, Schulman et al. 2017), with an
  asymmetric range ``[1-eps_low, 1+eps_high]`` (clip-higher, DAPO arXiv 2503.14476) and an
  optional dual clip (Ye et al. 2020, arXiv 1912.09729).
* ``sequence`` / ``sequence_token`` ratio: GSPO (arXiv 2507.18071) clips the length-normalised
  sequence ratio ``s_i``; GSPO-token has the value of ``s_i`` on each token but the gradient of
  that token's own log-probability.
* ``cpgd``: CPGD (arXiv 2505.12504) clips the log-ratio and adds a policy-drift KL term.

Aggregation divides by GLOBAL counts (tokens or sequences over all data-parallel ranks and
micro-batches of one mini-batch), so a mini-batch's loss and gradient do not depend on how it
is split; gradients are then SUMMED across ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embodied_rl.checks import check_range

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# A sequence ratio gives one loss per sequence; only these reductions weigh it sensibly.
SEQUENCE_RATIO_AGG_MODES = ("seq-mean-token-mean", "token-mean")
RATIO_LEVELS = ("token", "sequence", "sequence_token")
POLICY_LOSSES = ("ppo", "cpgd")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOG_RATIO_LIMIT = 20.0  # clamp before exp so a stale sample cannot overflow the ratio


@dataclass(frozen=True)
class GlobalCounts:
    """Normalisers of one mini-batch over every rank.

    Attributes:
        tokens: valid response tokens.
        sequences: samples (rows).
        width: the response width ``L_max`` used by ``seq-mean-token-sum-norm``; ``None``
            takes the width ``R`` of the values being aggregated.
    """

    tokens: float
    sequences: float
    width: float | None = None


@dataclass(frozen=True)
class ClipSpec:
    """Which clipped objective :func:`policy_loss` computes.

    Attributes:
        clip_low / clip_high: ``eps_low`` / ``eps_high``; the range is ``[1-low, 1+high]``
            for ratios and ``[log(1-low), log(1+high)]`` for the CPGD log-ratio.
        ratio_level: ``token``, ``sequence`` (GSPO) or ``sequence_token`` (GSPO-token).
        dual_clip_c: for ``A < 0`` bound the per-token loss by ``-c*A`` (``c > 1``); ``None``
            disables it.
        policy_loss: ``ppo`` (ratio clip) or ``cpgd`` (log-ratio clip).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_level: str = "token"
    dual_clip_c: float | None = None
    policy_loss: str = "ppo"

    def __post_init__(self) -> None:
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"ratio_level must be one of {RATIO_LEVELS}, got {self.ratio_level!r}")
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"policy_loss must be one of {POLICY_LOSSES}, got {self.policy_loss!r}"
            )
        if not 0.0 <= self.clip_low < 1.0 or self.clip_high < 0.0:
            raise ValueError(
                f"need 0 <= clip_ratio_low < 1 and clip_ratio_high >= 0, got "
                f"{self.clip_low} and {self.clip_high}"
            )
        check_range("dual_clip_c", self.dual_clip_c, 1, low_open=True, note=" (3 is typical)")
        if self.policy_loss == "cpgd" and self.ratio_level != "token":
            raise ValueError(
                "policy_loss 'cpgd' clips per-token log-ratios; it needs ratio_level 'token', "
                f"got {self.ratio_level!r}"
            )
        if self.policy_loss == "cpgd" and self.dual_clip_c is not None:
            raise ValueError(
                "dual_clip_c bounds the ratio loss of policy_loss 'ppo'; the CPGD loss is linear "
                "in the clipped log-ratio and needs no dual clip: set dual_clip_c to null"
            )


def check_aggregation(ratio_level: str, loss_agg_mode: str) -> None:
    """Reject aggregation modes that make no sense for the ratio level.

    A sequence ratio yields one loss ``l_i`` per sequence, carried by each of its valid
    tokens. ``seq-mean-token-mean`` is then GSPO's ``(1/G) sum_i l_i``; ``token-mean`` is
    ``sum_i |y_i| l_i / sum_i |y_i|``, the sequences weighted by their lengths. The token-sum
    modes would multiply ``l_i``, already length-normalised through ``s_i``, by ``|y_i|``
    again, so they are refused.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if ratio_level != "token" and loss_agg_mode not in SEQUENCE_RATIO_AGG_MODES:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} sums per-token losses, but ratio_level "
            f"{ratio_level!r} gives one length-normalised loss per sequence; use one of "
            f"{SEQUENCE_RATIO_AGG_MODES} (seq-mean-token-mean is GSPO's sequence mean)"
        )


@dataclass
class PolicyLossTerms:
    """Per-token outputs of :func:`policy_loss`, all (B, R).

    Attributes:
        loss: the clipped loss (before aggregation; no drift, KL or entropy term).
        ratio: detached value of the clipped quantity as a ratio: ``r_t``, ``s_i`` (broadcast)
            or, for CPGD, ``exp(l_t)``.
        clipped: bool, the clipped term was the larger loss.
        dual_clipped: bool, the dual-clip bound was the loss.
        drift: CPGD's per-token estimate of ``KL(pi_old || pi)``; ``None`` for ``ppo``.
    """

    loss: torch.Tensor
    ratio: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor
    drift: torch.Tensor | None = None


def clipped_surrogate(
    x: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped core ``-min(x*A, clip(x, low, high)*A) = max(-x*A, -clip(x)*A)``.

    Args:
        x: (B, R) the ratio (PPO, GSPO) or the log-ratio (CPGD).
        advantages: (B, R).
        low, high: the clip range of ``x``.

    Returns:
        loss: (B, R); clipped: (B, R) bool, where the clipped term was chosen.
    """
    unclipped = -advantages * x
    clipped = -advantages * x.clamp(low, high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def dual_clip(
    loss: torch.Tensor, advantages: torch.Tensor, c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dual-clip PPO (Ye et al. 2020, arXiv 1912.09729): for ``A < 0`` the loss is ``min(loss, -c*A)``.

    Args:
        loss: (B, R) the clipped PPO loss ``max(-r*A, -clip(r)*A)``.
        advantages: (B, R).
        c: the bound (> 1).

    Returns:
        loss: (B, R); bounded: (B, R) bool, where ``-c*A`` was the loss.
    """
    bound = -c * advantages
    bounded = (advantages < 0) & (loss > bound)
    return torch.where(bounded, bound, loss), bounded


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-min(r*A, clip(r, 1-eps_low, 1+eps_high)*A)`` with the token ratio.

    Args:
        logprobs, old_logprobs, advantages: (B, R).

    Returns:
        loss: (B, R) per-token loss; clipped: (B, R) bool, where the clipped term was chosen.
    """
    ratio = importance_ratio(logprobs, old_logprobs, torch.ones_like(logprobs), "token")
    return clipped_surrogate(ratio, advantages, 1.0 - clip_low, 1.0 + clip_high)


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's ``log s_i = (1/|y_i|) sum_t log r_{i,t}`` over valid tokens; (B, R) -> (B,).

    A row without valid tokens gets 0 (ratio 1); its loss is masked out anyway.
    """
    mask = mask.to(logprobs.dtype)
    total = ((logprobs - old_logprobs) * mask).sum(-1)
    return total / mask.sum(-1).clamp(min=1.0)


def importance_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """The importance ratio on each token (B, R), differentiable in ``logprobs``.

    ``token``: ``r_t = exp(log pi_t - log pi_old_t)``.
    ``sequence``: GSPO's ``s_i = exp(mean_t log r_{i,t})`` broadcast over the row.
    ``sequence_token``: GSPO-token's ``s_{i,t} = sg[s_i] * pi_t / sg[pi_t]`` (GSPO, arXiv 2507.18071):
    its value is ``s_i`` and its gradient w.r.t. ``log pi_t`` is ``s_i``.
    Log-ratios are clamped to +-LOG_RATIO_LIMIT before ``exp``.
    """
    if level == "token":
        log_ratio = logprobs - old_logprobs
    elif level == "sequence":
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)[:, None].expand_as(logprobs)
    elif level == "sequence_token":
        log_seq = sequence_log_ratio(logprobs, old_logprobs, mask).detach()[:, None]
        log_ratio = log_seq + logprobs - logprobs.detach()
    else:
        raise ValueError(f"unknown ratio_level {level!r}; use one of {RATIO_LEVELS}")
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def sequence_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``A_i``: the mean advantage over the valid tokens of each row, broadcast; (B, R).

    Equals the scalar for broadcast advantages (GRPO, RLOO); GSPO's sequence objective
    needs one advantage per sequence.
    """
    mask = mask.to(advantages.dtype)
    per_seq = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq[:, None].expand_as(advantages)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: ClipSpec,
) -> PolicyLossTerms:
    """The per-token clipped loss of ``spec`` (docs/ALGORITHMS.md, "Policy losses").

    Args:
        logprobs: (B, R) ``log pi`` under the current weights (differentiable).
        old_logprobs: (B, R) ``log pi_old`` of the rollout.
        advantages: (B, R).
        mask: (B, R) 1 = valid response token.
        spec: the objective.

    Returns:
        the per-token terms; reduce ``loss`` (and ``drift``) with :func:`aggregate`.
    """
    if spec.policy_loss == "cpgd":
        # CPGD (arXiv 2505.12504): -min(A*l, A*clip(l, log(1-eps), log(1+eps))), l = log pi - log pi_old.
        log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        low, high = math.log(1.0 - spec.clip_low), math.log1p(spec.clip_high)
        loss, clipped = clipped_surrogate(log_ratio, advantages, low, high)
        # Policy drift KL(pi_old || pi), estimated on the sampled tokens y ~ pi_old with
        # Schulman's k3: rho - 1 - log rho, rho = pi/pi_old. E_old[rho] = 1, so it is unbiased
        # for E_old[-log rho] = KL(pi_old || pi) like k1, but never negative and of lower
        # variance; its gradient (rho - 1) pulls each token back towards pi_old.
        drift = kl_penalty(old_logprobs, logprobs, "k3")
        ratio = torch.exp(log_ratio.detach())
        return PolicyLossTerms(loss, ratio, clipped, torch.zeros_like(clipped), drift)
    ratio = importance_ratio(logprobs, old_logprobs, mask, spec.ratio_level)
    if spec.ratio_level == "sequence":
        advantages = sequence_advantages(advantages, mask)
    loss, clipped = clipped_surrogate(ratio, advantages, 1.0 - spec.clip_low, 1.0 + spec.clip_high)
    dual_clipped = torch.zeros_like(clipped)
    if spec.dual_clip_c is not None:
        loss, dual_clipped = dual_clip(loss, advantages, spec.dual_clip_c)
    return PolicyLossTerms(loss, ratio.detach(), clipped, dual_clipped)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from tokens sampled from pi: k1, k2 or k3 (Schulman)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        neg = (-log_ratio).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; use one of {KL_ESTIMATORS}")


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str, counts: GlobalCounts
) -> torch.Tensor:
    """Reduce per-token ``values`` (B, R) to this rank's share of the global loss.

    ``token-mean``: sum over all valid tokens / global token count (DAPO).
    ``seq-mean-token-sum``: per-sequence token sum, summed / global sequence count.
    ``seq-mean-token-mean``: per-sequence token mean, summed / global sequence count.
    ``seq-mean-token-sum-norm``: per-sequence token sum, summed / (global sequence count *
    ``L_max``), ``L_max = counts.width`` or ``R`` (Dr. GRPO, arXiv 2503.20783).
    Summing the results of every rank and micro-batch gives the mini-batch loss.
    """
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        return (values * mask).sum() / max(counts.tokens, 1.0)
    per_seq = (values * mask).sum(-1)
    sequences = max(counts.sequences, 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        width = counts.width if counts.width is not None else values.shape[-1]
        return per_seq.sum() / (sequences * max(float(width), 1.0))
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}; use one of {LOSS_AGG_MODES}")
    return per_seq.sum() / sequences
