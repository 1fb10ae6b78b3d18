"""GAE and global whitening against hand-computed numbers (docs/ALGORITHMS.md, "GAE (PPO)")."""

from __future__ import annotations

import pytest
import torch

from embodied_rl.algorithms.advantages import (
    masked_moments,
    place_on_last_token,
    whiten_with_moments,
)
from embodied_rl.algorithms.gae import clipped_value_loss, gae


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, t(expected), atol=atol, rtol=0.0)


def test_gamma_lam_one_gives_return_minus_value():
    # delta = [0 + 0.2 - 0.5, 0 + 0.8 - 0.2, 1 + 0 - 0.8] = [-0.3, 0.6, 0.2]
    # A = suffix sums = [0.5, 0.8, 0.2] = R - V with R = 1 everywhere.
    adv, ret = gae(t([[0, 0, 1]]), t([[0.5, 0.2, 0.8]]), t([[1, 1, 1]]), gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.8, 0.2]])
    close(ret, [[1.0, 1.0, 1.0]])


def test_gamma_lam_one_matches_suffix_reward_sum_minus_value():
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    lengths = [6, 4, 1, 0]
    mask = t([[1.0] * n + [0.0] * (6 - n) for n in lengths])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    for row, n in enumerate(lengths):
        for col in range(6):
            if col < n:
                expected = rewards[row, col:n].sum() - values[row, col]
                assert adv[row, col].item() == pytest.approx(expected.item(), abs=1e-5)
                assert ret[row, col].item() == pytest.approx(
                    rewards[row, col:n].sum().item(), abs=1e-5
                )
            else:
                assert adv[row, col].item() == 0.0 and ret[row, col].item() == 0.0


def test_discounted_with_padding_at_the_end():
    # gamma = 0.9, lam = 0.5, gamma*lam = 0.45.
    rewards = t([[0.0, 1.0, 5.0, 7.0], [0.5, 0.0, 0.0, 1.0]])
    values = t([[0.4, 0.6, 3.0, 9.0], [0.1, 0.2, 0.3, 0.4]])
    mask = t([[1, 1, 0, 0], [1, 1, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # Row 0 (the padded rewards 5, 7 and values 3, 9 must not leak in):
    #   delta1 = 1 + 0.9*0 - 0.6 = 0.4;  delta0 = 0 + 0.9*0.6 - 0.4 = 0.14
    #   A1 = 0.4;  A0 = 0.14 + 0.45*0.4 = 0.32
    # Row 1:
    #   delta = [0.5 + 0.18 - 0.1, 0.27 - 0.2, 0.36 - 0.3, 1 - 0.4] = [0.58, 0.07, 0.06, 0.6]
    #   A3 = 0.6; A2 = 0.06 + 0.45*0.6 = 0.33; A1 = 0.07 + 0.45*0.33 = 0.2185
    #   A0 = 0.58 + 0.45*0.2185 = 0.678325
    close(adv[0], [0.32, 0.4, 0.0, 0.0])
    close(adv[1], [0.678325, 0.2185, 0.33, 0.6])
    close(ret[0], [0.72, 1.0, 0.0, 0.0])
    close(ret[1], [0.778325, 0.4185, 0.63, 1.0])


def test_lam_zero_is_one_step_td():
    # A_t = delta_t = r_t + 0.5 * V_{t+1} - V_t, V_3 = 0:
    # [1 + 0.75 - 0.5, 2 + 1.25 - 1.5, 3 + 0 - 2.5] = [1.25, 1.75, 0.5]
    rewards, values, mask = t([[1, 2, 3]]), t([[0.5, 1.5, 2.5]]), t([[1, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    close(adv, [[1.25, 1.75, 0.5]])
    close(ret, [[1.75, 3.25, 3.0]])  # r_t + gamma * V_{t+1}


def test_hole_inside_a_sequence_is_skipped():
    # Position 1 is masked: token 2 follows token 0 directly.
    # delta2 = 1 - 0.5 = 0.5;  delta0 = 0 + 0.9*0.5 - 0.2 = 0.25;  A0 = 0.25 + 0.45*0.5 = 0.475
    adv, ret = gae(t([[0, 9, 1]]), t([[0.2, 7, 0.5]]), t([[1, 0, 1]]), gamma=0.9, lam=0.5)
    close(adv, [[0.475, 0.0, 0.5]])
    close(ret, [[0.675, 0.0, 1.0]])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="one shape"):
        gae(t([[0, 1]]), t([[0, 1, 2]]), t([[1, 1]]), gamma=1.0, lam=1.0)


def test_whiten_uses_masked_unbiased_moments():
    x = t([[1, 2, 3], [4, 100, -100]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    moments = masked_moments(x, mask)
    assert moments.tolist() == [10.0, 30.0, 4.0]  # 1+2+3+4, 1+4+9+16, four valid entries
    # mean 2.5, unbiased var (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    scale = (5.0 / 3.0) ** 0.5
    out = whiten_with_moments(x, mask, moments, eps=0.0)
    expected = [[-1.5 / scale, -0.5 / scale, 0.5 / scale], [1.5 / scale, 0.0, 0.0]]
    close(out, expected)


def test_whiten_with_moments_summed_over_shards_equals_whole_batch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    whole = whiten_with_moments(x, mask, masked_moments(x, mask))
    shards = [(x[:2], mask[:2]), (x[2:], mask[2:])]  # two "ranks"
    summed = sum(masked_moments(xs, ms) for xs, ms in shards)
    parts = torch.cat([whiten_with_moments(xs, ms, summed) for xs, ms in shards])
    assert torch.allclose(parts, whole, atol=1e-6)
    valid = mask > 0
    assert whole[valid].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whole[valid].std().item() == pytest.approx(1.0, abs=1e-5)


def test_whiten_of_an_empty_batch_is_zero():
    x, mask = t([[1, 2]]), t([[0, 0]])
    assert whiten_with_moments(x, mask, masked_moments(x, mask)).tolist() == [[0.0, 0.0]]


def test_last_token_rewards_by_hand():
    rewards = t([2.0, 3.0, 4.0, 5.0])
    mask = t([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 0, 1]])
    close(place_on_last_token(rewards, mask), [[0, 2, 0], [0, 0, 0], [0, 0, 4], [0, 0, 5]])


def test_clipped_value_loss_by_hand():
    # c = 0.2, V_old = 0.5 everywhere, so V_clip = clamp(V, 0.3, 0.7):
    #   V=1.0, R=0.0: (1.0)^2 = 1    vs (0.7)^2 = 0.49 -> 0.5 * 1    = 0.5
    #   V=0.0, R=1.0: (1.0)^2 = 1    vs (0.7)^2 = 0.49 -> 0.5 * 1    = 0.5
    #   V=0.9, R=1.0: (0.1)^2 = 0.01 vs (0.3)^2 = 0.09 -> 0.5 * 0.09 = 0.045 (clipped term)
    #   V=0.5, R=0.6: (0.1)^2 = 0.01 vs (0.1)^2 = 0.01 -> 0.5 * 0.01 = 0.005
    values, old = t([[1.0, 0.0, 0.9, 0.5]]), t([[0.5, 0.5, 0.5, 0.5]])
    returns = t([[0.0, 1.0, 1.0, 0.6]])
    loss, clipped = clipped_value_loss(values, old, returns, clip=0.2)
    close(loss, [[0.5, 0.5, 0.045, 0.005]])
    assert clipped.tolist() == [[False, False, True, False]]


def test_clipped_value_loss_gradient_stops_where_clipped():
    values = t([[0.9, 0.6]]).requires_grad_()
    loss, _ = clipped_value_loss(values, t([[0.5, 0.5]]), t([[1.0, 1.0]]), clip=0.2)
    loss.sum().backward()
    # token 0: the clipped term (constant in V) wins -> 0; token 1: d/dV 0.5 (V-R)^2 = V - R
    close(values.grad, [[0.0, -0.4]])
