"""GRPO advantages and the clipped loss against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from embodied_rl.algorithms.advantages import group_mean_std, grpo_advantages
from embodied_rl.algorithms.losses import GlobalCounts, aggregate, kl_penalty, ppo_clip_loss


def test_grpo_advantage_by_hand():
    # group 7: rewards 1, 0, 0 -> mean 1/3, unbiased std sqrt(((2/3)^2 + 2*(1/3)^2)/2) = sqrt(1/3)
    # group 9: rewards 0.5, 0.5 -> std 0 -> advantages 0
    # group 4: a single sample -> mean 0, std 1 -> advantage = its reward
    rewards = torch.tensor([1.0, 0.5, 0.0, 0.5, 0.0, 0.25])
    groups = torch.tensor([7, 9, 7, 9, 7, 4])
    adv = grpo_advantages(rewards, groups, eps=0.0)
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, 0.0, (-1 / 3) / s, 0.0, (-1 / 3) / s, 0.25])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_dr_grpo_does_not_divide_by_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0])
    groups = torch.tensor([0, 0, 1, 1])
    adv = grpo_advantages(rewards, groups, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -1.5, 1.5]))


def test_group_stats_do_not_depend_on_sample_order():
    rewards = torch.tensor([3.0, 1.0, 2.0, 5.0])
    groups = torch.tensor([1, 2, 1, 2])
    perm = torch.tensor([3, 0, 2, 1])
    mean, std, count = group_mean_std(rewards, groups)
    pmean, pstd, _ = group_mean_std(rewards[perm], groups[perm])
    assert torch.allclose(mean[perm], pmean) and torch.allclose(std[perm], pstd)
    assert count.tolist() == [2, 2, 2, 2]
    assert mean.tolist() == [2.5, 3.0, 2.5, 3.0]


def test_ppo_clip_by_hand():
    old = torch.zeros(1, 4)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.5]]))
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]])
    loss, clipped = ppo_clip_loss(new, old, adv, clip_low=0.2, clip_high=0.28)
    # ratio 1.5, A=+1: min(1.5, 1.28) -> loss -1.28 (clipped)
    # ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8 -> loss 0.8 (clipped)
    # ratio 1.1, A=+2: inside the range -> loss -2.2
    # ratio 1.5, A=-1: min(-1.5, -1.28) = -1.5 -> loss 1.5 (unclipped)
    assert torch.allclose(loss, torch.tensor([[-1.28, 0.8, -2.2, 1.5]]), atol=1e-6)
    assert clipped.tolist() == [[True, True, False, False]]


def test_aggregation_modes_and_global_counts():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    counts = GlobalCounts(tokens=6.0, sequences=4.0)  # other ranks hold the rest
    assert aggregate(values, mask, "token-mean", counts).item() == pytest.approx(7 / 6)
    assert aggregate(values, mask, "seq-mean-token-sum", counts).item() == pytest.approx(
        (3 + 4) / 4
    )
    assert aggregate(values, mask, "seq-mean-token-mean", counts).item() == pytest.approx(
        (1.5 + 4) / 4
    )


def test_split_shares_sum_to_the_whole_batch_loss():
    torch.manual_seed(0)
    values, mask = torch.randn(6, 5), (torch.rand(6, 5) > 0.3).float()
    whole = GlobalCounts(tokens=mask.sum().item(), sequences=6)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        full = aggregate(values, mask, mode, whole)
        parts = sum(aggregate(values[i : i + 2], mask[i : i + 2], mode, whole) for i in (0, 2, 4))
        assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    d = math.log(2.0)  # log pi - log ref
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(d)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * d * d)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")
