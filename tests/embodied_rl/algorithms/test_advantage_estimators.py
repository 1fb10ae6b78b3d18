"""RLOO, REINFORCE++ (+ baseline), token rewards with KL, global whitening: by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.algorithms.advantages import (
    discounted_returns,
    place_on_last_token,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten_global,
)
from embodied_rl.data.batch import make_batch
from embodied_rl.data.layout import Layout
from embodied_rl.nodes import advantage as _registers_advantage_nodes  # noqa: F401
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.context import MetricSink, NodeContext


def make_ctx(node_type: str, **options) -> NodeContext:
    node = NODE_TYPES.get(node_type)
    return NodeContext(
        cfg=None,
        node_id="node",
        node_config=node.build_config(options),
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models={},
        state={},
        step=0,
        metrics=MetricSink(),
        device=torch.device("cpu"),
        run_dir=Path("."),
    )


def run_node(node_type: str, fields: dict, **options):
    ctx = make_ctx(node_type, **options)
    return NODE_TYPES.get(node_type).fn(ctx, make_batch(fields)), ctx


def test_rloo_by_hand():
    # group 7: rewards 1, 0, 0 -> A = 1 - 0, 0 - 0.5, 0 - 0.5
    # group 9: rewards 0.5, 2.5 -> A = 0.5 - 2.5, 2.5 - 0.5
    # group 4: one sample -> no other sample, baseline 0, A = 0.25
    rewards = torch.tensor([1.0, 0.5, 0.0, 2.5, 0.0, 0.25])
    groups = torch.tensor([7, 9, 7, 9, 7, 4])
    adv = rloo_advantages(rewards, groups)
    assert torch.allclose(adv, torch.tensor([1.0, -2.0, -0.5, 2.0, -0.5, 0.25]))


def test_rloo_matches_a_leave_one_out_loop():
    gen = torch.Generator().manual_seed(3)
    rewards = torch.rand(40, generator=gen)
    groups = torch.randint(0, 9, (40,), generator=gen)
    expected = []
    for i in range(40):
        others = [rewards[j].item() for j in range(40) if groups[j] == groups[i] and j != i]
        expected.append(rewards[i].item() - (sum(others) / len(others) if others else 0.0))
    assert torch.allclose(rloo_advantages(rewards, groups), torch.tensor(expected), atol=1e-6)


def test_rloo_node_broadcasts_over_valid_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    out, ctx = run_node(
        "advantage.rloo",
        {K.REWARDS: torch.tensor([1.0, 0.0, 3.0]), K.GROUP_ID: torch.tensor([0, 0, 1]),
         K.RESPONSE_MASK: mask},
    )  # fmt: skip
    # group 0: 1 - 0 = 1, 0 - 1 = -1; group 1 alone: 3.
    expected = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [3.0, 3.0, 3.0]])
    assert torch.allclose(out[K.ADVANTAGES], expected)
    assert ctx.metrics.pop()["advantage/groups_with_signal"][0] == pytest.approx(0.5)


def test_place_on_last_token_and_token_rewards_node():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    rewards = torch.tensor([2.0, 3.0, 5.0])
    expected = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]])
    assert torch.equal(place_on_last_token(rewards, mask), expected)
    out, _ = run_node("reward.token_rewards", {K.REWARDS: rewards, K.RESPONSE_MASK: mask})
    assert torch.equal(out[K.TOKEN_REWARDS], expected)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalty_reward_by_hand(estimator):
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.1, 0.1]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.3, 0.5, 0.5]]))

    def kl(p: float, q: float) -> float:  # log pi_old = log p, log pi_ref = log q
        return math.log(p / q) if estimator == "k1" else q / p - math.log(q / p) - 1

    beta = 0.1
    out, ctx = run_node(
        "reward.kl_penalty",
        {K.REWARDS: torch.tensor([1.0, -2.0]), K.RESPONSE_MASK: mask, K.OLD_LOGPROBS: old,
         K.REF_LOGPROBS: ref},
        beta=beta, estimator=estimator,
    )  # fmt: skip
    expected = torch.tensor(
        [
            [-beta * kl(0.5, 0.25), 1.0 - beta * kl(0.2, 0.5), 0.0],
            [-2.0 - beta * kl(0.3, 0.3), 0.0, 0.0],
        ]
    )
    assert torch.allclose(out[K.TOKEN_REWARDS], expected, atol=1e-6)
    mean_kl = (kl(0.5, 0.25) + kl(0.2, 0.5) + kl(0.3, 0.3)) / 3
    assert ctx.metrics.pop()["reward/kl_per_token"][0] == pytest.approx(mean_kl, rel=1e-5)


def test_discounted_returns_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 7.0], [0.0, 4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # gamma 0.5: row 0: G_2 = 2, G_1 = 0 + 0.5*2 = 1, G_0 = 1 + 0.5*1 = 1.5 (the masked 7
    # is not a reward); row 1: G_1 = 4, G_0 = 2.
    expected = torch.tensor([[1.5, 1.0, 2.0, 0.0], [2.0, 4.0, 0.0, 0.0]])
    assert torch.allclose(discounted_returns(rewards, mask, 0.5), expected)


def test_whiten_global_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # valid 1, 2, 3: mean 2, unbiased var 1.
    out = whiten_global(values, mask, eps=0.0)
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    scaled = whiten_global(values, mask, shift_mean=False, eps=0.0)
    assert torch.allclose(scaled, torch.tensor([[1.0, 2.0, 3.0, 0.0]]))


def test_whiten_global_uses_the_reduced_statistics():
    # Two "ranks": each whitens its half with the other half's [sum, sum_sq, count] added by
    # all_reduce_sum; the result equals whitening the whole batch at once.
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    whole = whiten_global(values, mask)

    def stats(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        x = v.double() * m.double()
        return torch.stack([x.sum(), (x * x).sum(), m.double().sum()])

    top = whiten_global(values[:2], mask[:2], lambda t: t + stats(values[2:], mask[2:]))
    bottom = whiten_global(values[2:], mask[2:], lambda t: t + stats(values[:2], mask[:2]))
    assert torch.allclose(torch.cat([top, bottom]), whole, atol=1e-6)
    # And the whole-batch result against a direct mean / std of the valid values.
    valid = values[mask > 0].double()
    reference = (values.double() - valid.mean()) / valid.std() * mask
    assert torch.allclose(whole.double(), reference, atol=1e-6)


def test_reinforce_pp_by_hand():
    token_rewards = torch.tensor([[0.0, -0.5, 2.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # gamma 1: returns row 0 = [1.5, 1.5, 2.0], row 1 = [1.0]; valid values 1.5, 1.5, 2, 1:
    # mean 1.5, unbiased var (0 + 0 + 0.25 + 0.25) / 3 = 1/6.
    std = math.sqrt(1 / 6)
    adv = reinforce_pp_advantages(token_rewards, mask, gamma=1.0, eps=0.0)
    expected = torch.tensor([[0.0, 0.0, 0.5 / std], [-0.5 / std, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_reinforce_pp_node_with_group_baseline_by_hand():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    # Scalar rewards 3, 1 (group 0, mean 2) and 5 (group 1 alone: baseline 0) on last tokens,
    # plus a per-token KL term -0.5 on row 0's first token.
    token_rewards = torch.tensor([[-0.5, 3.0], [1.0, 0.0], [0.0, 5.0]])
    fields = {
        K.TOKEN_REWARDS: token_rewards,
        K.RESPONSE_MASK: mask,
        K.REWARDS: torch.tensor([3.0, 1.0, 5.0]),
        K.GROUP_ID: torch.tensor([0, 0, 1]),
    }
    out, _ = run_node("advantage.reinforce_pp", fields, gamma=0.5, baseline=True, eps=0.0)
    # Shifted rewards: row 0 [-0.5, 1], row 1 [-1], row 2 [0, 5].
    # gamma 0.5 returns: row 0 [-0.5 + 0.5, 1] = [0, 1], row 1 [-1], row 2 [2.5, 5].
    returns = [0.0, 1.0, -1.0, 2.5, 5.0]
    mean = sum(returns) / 5
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / 4)
    w = [(g - mean) / std for g in returns]
    expected = torch.tensor([[w[0], w[1]], [w[2], 0.0], [w[3], w[4]]])
    assert torch.allclose(out[K.ADVANTAGES], expected, atol=1e-6)
    plain, _ = run_node("advantage.reinforce_pp", fields, gamma=0.5, eps=0.0)
    # Without the baseline: returns [1, 3], [1], [2.5, 5].
    r = [1.0, 3.0, 1.0, 2.5, 5.0]
    m = sum(r) / 5
    s = math.sqrt(sum((g - m) ** 2 for g in r) / 4)
    assert plain[K.ADVANTAGES][0, 1].item() == pytest.approx((3.0 - m) / s, rel=1e-5)
    assert plain[K.ADVANTAGES][1, 1].item() == 0.0


def test_reinforce_pp_reads_rewards_only_with_baseline():
    node = NODE_TYPES.get("advantage.reinforce_pp")
    assert set(node.read_keys(node.build_config({}))) == {K.TOKEN_REWARDS, K.RESPONSE_MASK}
    with_baseline = node.read_keys(node.build_config({"baseline": True}))
    assert {K.REWARDS, K.GROUP_ID} <= set(with_baseline)
    with pytest.raises(ValueError, match="gamma"):
        node.build_config({"gamma": 1.5})
