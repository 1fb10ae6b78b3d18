"""The flow-matching VLA policy: its stochastic denoising chain, scores and SFT loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from policies.flow_vla.configuration import FlowVLAConfig
from policies.flow_vla.denoising import gaussian_logprob, sde_sigma, sde_step, step_times
from policies.flow_vla.modeling import build_flow_vla_policy
from policies.observation import observation_features

TINY = {
    "image_size": 16, "action_dim": 3, "chunk": 2, "prefix_hidden": [32], "expert_width": 16,
    "expert_layers": 1, "expert_heads": 2, "denoise_steps": 3, "instruction_buckets": 16,
    "instruction_dim": 8, "gripper_convention": "none",
}  # fmt: skip


def _observations(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)
    states = rng.normal(size=(n, 8)).astype(np.float32)
    instructions = [f"pick up object {i % 2}" for i in range(n)]
    return images, instructions, states


def _batch(images, instructions, states, raw):
    """Trajectories of one step (T = 1), as the rollout stores them."""
    n = len(images)
    return make_batch(
        {
            K.OBS_IMAGE: torch.from_numpy(images)[:, None],
            K.OBS_STATE: torch.from_numpy(states)[:, None],
            K.PROMPT_TEXT: instructions,
            K.RAW_ACTIONS: raw[:, None],
            K.STEP_MASK: torch.ones(n, 1),
        }
    )


def test_two_sde_steps_by_hand():
    """S = 2 (delta 0.5), a = 0.5. Step 0 (tau 0, t 1; sigma from t capped at 0.5):
    sigma = 0.5 sqrt(0.5 / 0.5) = 0.5, mean = 0.5 + 0.5 - 0.5 * 0.25 / 2 * 0.5 = 0.96875.
    Step 1 (tau 0.5, t 0.5): sigma = 0.5, mean = 0.9 + 0.1 - 0.5 * 0.25 / 1 * (0.9 - 0.1)
    = 0.9. Both std = 0.5 sqrt(0.5)."""
    x0, u0 = torch.tensor([[0.5]]), torch.tensor([[1.0]])
    mean0, std0 = sde_step(x0, u0, torch.tensor([0.0]), 0.5, 0.5)
    x1, u1 = torch.tensor([[0.9]]), torch.tensor([[0.2]])
    mean1, std1 = sde_step(x1, u1, torch.tensor([0.5]), 0.5, 0.5)
    assert mean0.item() == pytest.approx(0.96875) and mean1.item() == pytest.approx(0.9)
    assert std0.item() == pytest.approx(0.5 * math.sqrt(0.5)) == std1.item()
    # The chain's log-prob is the sum of its steps' Gaussian log-probs.
    s = 0.5 * math.sqrt(0.5)
    by_hand = sum(
        -((v - m) ** 2) / (2 * s * s) - math.log(s) - 0.5 * math.log(2 * math.pi)
        for v, m in [(1.0, 0.96875), (0.8, 0.9)]
    )
    total = gaussian_logprob(torch.tensor([1.0, 0.8]), torch.tensor([0.96875, 0.9]), std0.flatten())
    assert total.sum().item() == pytest.approx(by_hand)
    assert sde_sigma(torch.tensor([0.0, 0.75]), 0.25, 1.0).tolist() == pytest.approx(
        [math.sqrt(3.0), math.sqrt(1 / 3)]
    )


def test_flow_sde_keeps_the_flow_s_marginals():
    """Actions a ~ N(0.3, 0.2^2) have an exact velocity field on the path x = (1 - tau) eps
    + tau a: x ~ N(m, v) with m = 0.3 tau, v = (1 - tau)^2 + 0.04 tau^2, and
    u = E[a - eps | x] = 0.3 + (0.04 tau - (1 - tau)) / v (x - m). Flow-SDE with it must
    still end at N(0.3, 0.2^2); the same noise without the drift correction inflates it."""
    torch.manual_seed(0)
    steps, a = 20, 0.7
    delta = 1.0 / steps

    def velocity(x: torch.Tensor, tau: float) -> torch.Tensor:
        v = (1 - tau) ** 2 + 0.04 * tau**2
        return 0.3 + (0.04 * tau - (1 - tau)) / v * (x - 0.3 * tau)

    x = torch.randn(20000, 1)
    naive = x.clone()
    for tau in step_times(steps).tolist():
        times = torch.full((len(x),), tau)
        mean, std = sde_step(x, velocity(x, tau), times, delta, a)
        x = mean + std * torch.randn_like(x)
        naive = naive + delta * velocity(naive, tau) + std * torch.randn_like(naive)
    assert x.mean().item() == pytest.approx(0.3, abs=0.01)
    assert x.std().item() == pytest.approx(0.2, abs=0.015)  # measured 0.193
    assert naive.std().item() > 0.3  # measured 0.378


@pytest.mark.parametrize("method", ["sde", "noise_net"])
def test_evaluate_recomputes_the_log_probs_act_recorded(method):
    policy = build_flow_vla_policy({**TINY, "logprob_method": method}, torch.device("cpu"))
    images, instructions, states = _observations(5)
    out = policy.act(images, instructions, states, temperature=0.8, do_sample=True)
    config = policy.config
    assert out.actions.shape == (5, config.chunk, config.action_dim)
    assert out.raw_actions.shape == (
        5,
        (config.denoise_steps + 1) * config.chunk * config.action_dim,
    )
    assert out.logprobs.shape == (5, config.denoise_steps * config.chunk * config.action_dim)
    batch = _batch(images, instructions, states, out.raw_actions)
    logprobs, entropy = policy.evaluate(batch, temperature=0.8)
    torch.testing.assert_close(logprobs, out.logprobs, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(entropy).all()
    # Another temperature scores the same chain differently: the scale is not ignored.
    assert not torch.allclose(policy.evaluate(batch, temperature=1.0)[0], out.logprobs)
    # The final chain value is the action (normalised; identity without statistics).
    chain = out.raw_actions.view(5, config.denoise_steps + 1, config.chunk, config.action_dim)
    np.testing.assert_allclose(out.actions, chain[:, -1].clamp(-1, 1).numpy(), rtol=1e-6)


def test_log_prob_gradients_reach_the_expert_and_the_noise_network():
    policy = build_flow_vla_policy({**TINY, "logprob_method": "noise_net"}, torch.device("cpu"))
    images, instructions, states = _observations(3)
    out = policy.act(images, instructions, states, temperature=1.0, do_sample=True)
    logprobs, _ = policy.evaluate(_batch(images, instructions, states, out.raw_actions), 1.0)
    logprobs.sum().backward()
    for name in ("expert.velocity_out.weight", "expert.log_std_out.weight", "trunk.0.weight"):
        grad = dict(policy.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_greedy_act_integrates_the_ode_from_zero():
    policy = build_flow_vla_policy(TINY, torch.device("cpu"))
    images, instructions, states = _observations(4)
    first = policy.act(images, instructions, states, temperature=1.0, do_sample=False)
    second = policy.act(images, instructions, states, temperature=1.0, do_sample=False)
    np.testing.assert_array_equal(first.actions, second.actions)
    chain = first.raw_actions.view(4, 4, 2, 3)
    assert (chain[:, 0] == 0).all()
    # Each step is the Euler step x + u / S, u the expert's velocity at that step's time.
    prefix = observation_features(
        policy, torch.from_numpy(images), torch.from_numpy(states), instructions
    )
    with torch.no_grad():
        for k, tau in enumerate(step_times(3).tolist()):
            u, _ = policy.expert(chain[:, k], torch.full((4,), tau), prefix)
            torch.testing.assert_close(chain[:, k + 1], chain[:, k] + u / 3)
    mode = policy.action_mode(_batch(images, instructions, states, first.raw_actions))
    torch.testing.assert_close(mode.view(4, 2, 3), chain[:, -1])


def test_a_chain_of_another_step_count_is_refused():
    sampler = build_flow_vla_policy(TINY, torch.device("cpu"))
    scorer = build_flow_vla_policy({**TINY, "denoise_steps": 2}, torch.device("cpu"))
    images, instructions, states = _observations(2)
    out = sampler.act(images, instructions, states, temperature=1.0, do_sample=True)
    with pytest.raises(ValueError, match=r"recorded chains have 24 values .* have 18 .*Fix"):
        scorer.evaluate(_batch(images, instructions, states, out.raw_actions), 1.0)


@pytest.mark.parametrize(
    "option, value, words",
    [
        ("denoise_steps", 0, "denoise_steps=0: must be in \\[1, 64\\]"),
        ("noise_level", 0.0, "noise_level=0.0: must be in \\(0, 2\\]"),
        ("logprob_method", "ddim", "logprob_method='ddim'"),
        ("noise_log_std_range", [-1.0, -3.0], "need low < high"),
    ],
)
def test_bad_options_are_refused_naming_the_key(option, value, words):
    with pytest.raises(ValueError, match=words):
        FlowVLAConfig.from_options({**TINY, option: value})


def test_flow_matching_sft_learns_a_chunk_per_instruction():
    """Two observations, two demonstrated chunks: after SFT on the flow-matching loss the
    greedy chain lands near each one (random init does not)."""
    torch.manual_seed(0)
    policy = build_flow_vla_policy({**TINY, "denoise_steps": 4}, torch.device("cpu"))
    images, instructions, states = _observations(2)
    targets = torch.tensor([[0.8, -0.5, 0.3, 0.6, -0.2, -0.9], [-0.7, 0.4, -0.3, 0.1, 0.9, 0.5]])

    def error() -> float:
        greedy = policy.act(images, instructions, states, temperature=1.0, do_sample=False)
        return (torch.from_numpy(greedy.actions).reshape(2, -1) - targets).abs().mean().item()

    before = error()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    rows = _batch(
        np.concatenate([images] * 16), instructions * 16, np.concatenate([states] * 16),
        torch.zeros(32, 30),
    )  # fmt: skip
    for _ in range(300):
        loss = policy.flow_matching_loss(rows, torch.cat([targets] * 16)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert before > 0.3 and error() < 0.1, (before, error())
