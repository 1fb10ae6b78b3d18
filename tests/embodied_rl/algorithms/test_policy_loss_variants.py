"""GSPO, GSPO-token, dual-clip, clip-higher, CPGD and Dr. GRPO aggregation by hand."""

from __future__ import annotations

import math

import pytest
import torch

from embodied_rl.algorithms.losses import (
    ClipSpec,
    GlobalCounts,
    aggregate,
    importance_ratio,
    policy_loss,
)
from embodied_rl.dag.node_type import NodeConfigError
from embodied_rl.nodes.actor import ActorTrainConfig
from embodied_rl.registry import NODE_TYPES

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def gspo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Row 0: token ratios 1.2 and 0.8 (third token masked, garbage 5.0) -> s_0 = sqrt(0.96).
    # Row 1: one valid token with ratio 1.5 -> s_1 = 1.5.
    new = torch.log(torch.tensor([[1.2, 0.8, 5.0], [1.5, 3.0, 3.0]]))
    old = torch.zeros(2, 3)
    # Row 0's advantages vary per token: the sequence advantage is their valid mean, -1.
    adv = torch.tensor([[-0.5, -1.5, 99.0], [2.0, 7.0, 7.0]])
    return new, old, adv


def test_gspo_sequence_ratio_and_clip_by_hand():
    new, old, adv = gspo_inputs()
    s0 = math.sqrt(1.2 * 0.8)  # exp((log 1.2 + log 0.8) / 2) = 0.979796
    wide = policy_loss(new, old, adv, MASK, ClipSpec(0.2, 0.2, ratio_level="sequence"))
    assert torch.allclose(wide.ratio, torch.tensor([[s0] * 3, [1.5] * 3]))
    # Row 0: A = -1, s_0 inside [0.8, 1.2] -> loss s_0. Row 1: A = 2, s_1 = 1.5 -> 2 * 1.2.
    assert torch.allclose(wide.loss[0], torch.full((3,), s0))
    assert torch.allclose(wide.loss[1], torch.full((3,), -2.4))
    assert wide.clipped.tolist() == [[False] * 3, [True] * 3]
    # A narrow range clips row 0 too: s_0 < 0.99 with A < 0 -> loss -(-1) * 0.99.
    narrow = policy_loss(new, old, adv, MASK, ClipSpec(0.01, 0.01, ratio_level="sequence"))
    assert torch.allclose(narrow.loss[0], torch.full((3,), 0.99))
    assert torch.allclose(narrow.loss[1], torch.full((3,), -2.02))
    # GSPO objective = mean over sequences: seq-mean-token-mean of the broadcast losses.
    counts = GlobalCounts(tokens=3.0, sequences=2.0)
    gspo = aggregate(wide.loss, MASK, "seq-mean-token-mean", counts)
    assert gspo.item() == pytest.approx((s0 - 2.4) / 2)
    # token-mean weighs each sequence by its length: (2 * s0 - 2.4) / 3.
    assert aggregate(wide.loss, MASK, "token-mean", counts).item() == pytest.approx(
        (2 * s0 - 2.4) / 3
    )


def test_sequence_ratio_gradients_by_hand():
    # d s_i / d log pi_t = s_i / |y_i| for the sequence ratio (valid t), 0 for masked t.
    # d s_{i,t'} / d log pi_t = s_i * [t == t'] for GSPO-token (sg semantics).
    new, old, _ = gspo_inputs()
    s0 = math.sqrt(0.96)
    for level, expected in (
        ("sequence", [s0 / 2, s0 / 2, 0.0]),
        ("sequence_token", [0.0, s0, 0.0]),
    ):
        logp = new.clone().requires_grad_(True)
        ratio = importance_ratio(logp, old, MASK, level)
        assert ratio[0, 1].item() == pytest.approx(s0)  # the value is s_0 at every level
        ratio[0, 1].backward()
        assert torch.allclose(logp.grad[0], torch.tensor(expected), atol=1e-6)
        assert torch.all(logp.grad[1] == 0)


def test_gspo_token_gradient_equals_gspo_gradient():
    # With A_{i,t} = A_i and seq-mean-token-mean, both objectives have, for valid t,
    # d loss / d log pi_{i,t} = -A_i * s_i / (|y_i| * G) when s_i is inside the clip range
    # and 0 when the clipped term is chosen.
    torch.manual_seed(0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    old = torch.randn(3, 4) * mask
    new = old + torch.tensor([[0.1, -0.05, 0.02, 4.0], [0.5, 0.4, 0.0, 0.0], [0.0] * 4]) * mask
    adv = torch.tensor([[1.5], [2.0], [-0.7]]) * mask
    counts = GlobalCounts(tokens=mask.sum().item(), sequences=3.0)
    grads, values = {}, {}
    for level in ("sequence", "sequence_token"):
        logp = new.clone().requires_grad_(True)
        terms = policy_loss(logp, old, adv, mask, ClipSpec(0.2, 0.2, ratio_level=level))
        loss = aggregate(terms.loss, mask, "seq-mean-token-mean", counts)
        loss.backward()
        grads[level], values[level] = logp.grad, loss.item()
    assert values["sequence"] == pytest.approx(values["sequence_token"], abs=1e-7)
    assert torch.allclose(grads["sequence"], grads["sequence_token"], atol=1e-7)
    lengths = mask.sum(-1)
    s = torch.exp(((new - old) * mask).sum(-1) / lengths)
    # Row 1: mean log-ratio 0.45 -> s_1 = 1.57 > 1.2 with A > 0: clipped, no gradient.
    inside = torch.tensor([1.0, 0.0, 1.0])
    expected = (-adv[:, :1] * (s * inside / (lengths * 3))[:, None]) * mask
    assert torch.allclose(grads["sequence"], expected, atol=1e-7)


def test_dual_clip_by_hand():
    ratio = torch.tensor([[3.0, 1.5, 5.0, 0.5]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, -2.0]])
    mask = torch.ones(1, 4)
    logp = torch.log(ratio).requires_grad_(True)
    terms = policy_loss(logp, torch.zeros(1, 4), adv, mask, ClipSpec(0.2, 0.2, dual_clip_c=2.0))
    # r=3, A=-1: PPO loss max(3, 1.2) = 3 > c*|A| = 2 -> 2 (dual-clipped).
    # r=1.5, A=-1: max(1.5, 1.2) = 1.5 <= 2 -> 1.5.  r=5, A=+1: max(-5, -1.2) = -1.2 (A > 0).
    # r=0.5, A=-2: max(1.0, 1.6) = 1.6 <= 4 -> 1.6 (clipped at 1 - 0.2).
    assert torch.allclose(terms.loss, torch.tensor([[2.0, 1.5, -1.2, 1.6]]))
    assert terms.dual_clipped.tolist() == [[True, False, False, False]]
    assert terms.clipped.tolist() == [[False, False, True, True]]
    terms.loss.sum().backward()
    # d(-r*A)/d log r = -A*r on the unclipped token; the bounds have no gradient.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 1.5, 0.0, 0.0]]))


def test_clip_higher_is_asymmetric():
    ratio = torch.tensor([[1.25, 1.25, 0.75, 0.75]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    spec = ClipSpec(clip_low=0.2, clip_high=0.28)
    terms = policy_loss(torch.log(ratio), torch.zeros(1, 4), adv, torch.ones(1, 4), spec)
    # 1.25 < 1.28 is inside the upper range (a symmetric 0.2 clip would give -1.2);
    # 0.75 < 0.8 with A=-1: max(0.75, 0.8) = 0.8; with A=+1: max(-0.75, -0.8) = -0.75.
    assert torch.allclose(terms.loss, torch.tensor([[-1.25, 1.25, 0.8, -0.75]]))
    symmetric = policy_loss(
        torch.log(ratio), torch.zeros(1, 4), adv, torch.ones(1, 4), ClipSpec(0.2, 0.2)
    )
    assert symmetric.loss[0, 0].item() == pytest.approx(-1.2)


def test_cpgd_log_ratio_clip_and_drift_by_hand():
    log_ratio = torch.tensor([[0.3, -0.3, 0.1, 0.5]])
    adv = torch.tensor([[1.0, -1.0, -2.0, -1.0]])
    logp = log_ratio.clone().requires_grad_(True)
    terms = policy_loss(
        logp, torch.zeros(1, 4), adv, torch.ones(1, 4), ClipSpec(policy_loss="cpgd")
    )
    hi, lo = math.log(1.2), math.log(0.8)
    # l=0.3, A=1: -min(0.3, log 1.2).  l=-0.3, A=-1: -min(0.3, -log 0.8).
    # l=0.1, A=-2: inside -> 0.2.  l=0.5, A=-1: -min(-0.5, -log 1.2) = 0.5 (unclipped).
    assert torch.allclose(terms.loss, torch.tensor([[-hi, lo, 0.2, 0.5]]), atol=1e-6)
    assert terms.clipped.tolist() == [[True, True, False, False]]
    assert torch.allclose(terms.ratio, torch.exp(log_ratio))
    # drift = rho - 1 - log rho with rho = pi/pi_old = exp(l).
    expected_drift = torch.exp(log_ratio) - 1 - log_ratio
    assert torch.allclose(terms.drift, expected_drift)
    (terms.loss.sum() + terms.drift.sum()).backward()
    # loss gradient -A on unclipped tokens; drift gradient rho - 1.
    expected_grad = torch.tensor([[0.0, 0.0, 2.0, 1.0]]) + torch.exp(log_ratio) - 1
    assert torch.allclose(logp.grad, expected_grad, atol=1e-6)


def test_cpgd_drift_expectation_is_kl_old_to_new():
    # Over every token y of a categorical distribution, weighted by pi_old(y), the drift
    # estimate averages to KL(pi_old || pi) exactly.
    old = torch.log_softmax(torch.tensor([[0.3, -1.0, 2.0, 0.5]]), dim=-1)
    new = torch.log_softmax(torch.tensor([[1.0, 0.2, 1.5, -0.4]]), dim=-1)
    terms = policy_loss(new, old, torch.zeros(1, 4), torch.ones(1, 4), ClipSpec(policy_loss="cpgd"))
    expectation = (old.exp() * terms.drift).sum()
    kl = (old.exp() * (old - new)).sum()
    assert expectation.item() == pytest.approx(kl.item(), rel=1e-5)


def test_seq_mean_token_sum_norm_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    # Per-sequence sums 3 and 4; 4 sequences globally; L_max = R = 3 or the given width 5.
    counts = GlobalCounts(tokens=6.0, sequences=4.0)
    assert aggregate(values, MASK, "seq-mean-token-sum-norm", counts).item() == pytest.approx(
        7 / 12
    )
    wide = GlobalCounts(tokens=6.0, sequences=4.0, width=5.0)
    assert aggregate(values, MASK, "seq-mean-token-sum-norm", wide).item() == pytest.approx(7 / 20)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"ratio_level": "sequence", "loss_agg_mode": "seq-mean-token-sum"}, "sums per-token"),
        ({"ratio_level": "sequence_token", "loss_agg_mode": "seq-mean-token-sum-norm"}, "GSPO"),
        ({"ratio_level": "seq"}, "ratio_level must be one of"),
        ({"dual_clip_c": 1.0}, "dual_clip_c must be > 1"),
        ({"policy_loss": "cpgd", "ratio_level": "sequence"}, "needs ratio_level 'token'"),
        ({"policy_loss": "cpgd", "dual_clip_c": 3.0}, "no dual clip"),
        ({"cpgd_drift_coef": 0.1}, "set policy_loss: cpgd"),
        ({"policy_loss": "grpo"}, "policy_loss must be one of"),
        ({"clip_ratio_low": 1.0}, "clip_ratio_low < 1"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode must be one of"),
    ],
)
def test_bad_option_combinations_are_config_errors(options, match):
    with pytest.raises(ValueError, match=match):
        ActorTrainConfig(**options)
    with pytest.raises(NodeConfigError, match=match):
        NODE_TYPES.get("actor.train").build_config(options)


def test_valid_option_combinations():
    ActorTrainConfig(ratio_level="sequence", loss_agg_mode="seq-mean-token-mean")
    ActorTrainConfig(ratio_level="sequence_token", loss_agg_mode="token-mean", dual_clip_c=3.0)
    ActorTrainConfig(policy_loss="cpgd", cpgd_drift_coef=0.1, loss_agg_mode="seq-mean-token-sum")
    ActorTrainConfig(
        clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-sum-norm"
    )
