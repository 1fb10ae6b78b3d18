"""MLP policy: act and evaluate agree, head semantics, shapes and masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from policies.mlp import build_mlp_policy
from policies.mlp.modeling import gaussian_entropy

CPU = torch.device("cpu")


def _trajectory(policy, states, images, out, mask):
    """A (B=1, T) batch holding the steps ``act`` produced."""
    fields = {
        K.OBS_STATE: torch.as_tensor(states)[None],
        K.STEP_MASK: torch.as_tensor(mask, dtype=torch.float32)[None],
    }
    if images is not None:
        fields[K.OBS_IMAGE] = torch.as_tensor(images)[None]
    if out.tokens is not None:
        fields[K.ACTION_TOKENS] = out.tokens[None]
    else:
        fields[K.RAW_ACTIONS] = out.raw_actions[None]
    return make_batch(fields)


@pytest.mark.parametrize("head", ["gaussian", "discrete"])
@pytest.mark.parametrize("image_size", [0, 16])
def test_evaluate_scores_what_act_sampled(head, image_size):
    policy = build_mlp_policy(
        {"state_dim": 4, "action_dim": 3, "head": head, "image_size": image_size}, CPU
    )
    rng = np.random.default_rng(0)
    states = rng.normal(size=(5, 4)).astype(np.float32)
    images = rng.integers(0, 255, size=(5, 16, 16, 3), dtype=np.uint8) if image_size else None
    out = policy.act(images, ["x"] * 5, states, temperature=1.3, do_sample=True)
    assert out.actions.shape == (5, 1, 3) and out.actions.dtype == np.float32
    assert out.logprobs.shape == (5, 3)
    assert np.all(np.abs(out.actions) <= 1.0)
    mask = [1, 1, 1, 1, 0]  # the last step is after the episode ended
    logprobs, entropy = policy.evaluate(_trajectory(policy, states, images, out, mask), 1.3)
    assert logprobs.shape == (1, 15)
    expected = out.logprobs.clone()
    expected[4] = 0.0
    assert torch.allclose(logprobs.view(5, 3), expected, atol=1e-5)
    assert torch.all(entropy.view(5, 3)[4] == 0)


def test_gaussian_entropy_and_temperature():
    policy = build_mlp_policy({"state_dim": 2, "action_dim": 2, "init_log_std": -0.5}, CPU)
    batch = make_batch(
        {
            K.OBS_STATE: torch.zeros(1, 1, 2),
            K.STEP_MASK: torch.ones(1, 1),
            K.RAW_ACTIONS: torch.zeros(1, 1, 2),
        }
    )
    _, entropy = policy.evaluate(batch, temperature=2.0)
    # std * 2 -> log_std + log 2
    expected = gaussian_entropy(torch.tensor(-0.5 + math.log(2.0)))
    assert torch.allclose(entropy, expected.expand(1, 2), atol=1e-6)


def test_discrete_bins_map_to_centres_and_greedy_is_the_mode():
    policy = build_mlp_policy(
        {"state_dim": 2, "action_dim": 2, "head": "discrete", "num_bins": 5}, CPU
    )
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.copy_(torch.tensor([0, 0, 0, 9.0, 0, 9.0, 0, 0, 0, 0]))
    out = policy.act(None, ["x"], np.zeros((1, 2), np.float32), temperature=1.0, do_sample=False)
    assert out.tokens.tolist() == [[3, 0]]
    assert out.actions[0, 0].tolist() == [0.5, -1.0]  # centres of linspace(-1, 1, 5)


def test_same_seed_same_weights_and_value_head():
    a = build_mlp_policy({"state_dim": 3, "seed": 4, "value_head": True}, CPU)
    b = build_mlp_policy({"state_dim": 3, "seed": 4, "value_head": True}, CPU)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    batch = make_batch(
        {K.OBS_STATE: torch.ones(2, 3, 3), K.STEP_MASK: torch.tensor([[1.0, 1, 0], [1, 0, 0]])}
    )
    values = a.values(batch)
    assert values.shape == (2, 3) and values[0, 2] == 0 and values[1, 1] == 0


def test_bad_options_name_the_fix():
    with pytest.raises(ValueError, match="unknown mlp policy option"):
        build_mlp_policy({"state_dims": 3}, CPU)
    with pytest.raises(ValueError, match="needs an input"):
        build_mlp_policy({"state_dim": 0}, CPU)
