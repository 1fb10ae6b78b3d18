"""MLP policy: act and evaluate agree, head semantics, shapes and masks."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from policies.mlp import build_mlp_policy
from policies.mlp.modeling import gaussian_entropy
from tests.policies.bins import check_bin_logprobs

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
    with pytest.raises(ValueError, match=r"mlp policy: unknown option\(s\) "):
        build_mlp_policy({"state_dims": 3}, CPU)
    with pytest.raises(ValueError, match="needs an input"):
        build_mlp_policy({"state_dim": 0}, CPU)


# ------------------------------------------------------------------ LIBERO-style options
LIBERO = {
    "state_dim": 8,
    "image_size": 16,
    "action_dim": 7,
    "chunk": 3,
    "instruction_buckets": 64,
    "gripper_convention": "libero",
}
STATS = {
    "action": {"q01": [-0.5] * 6 + [-1.0], "q99": [1.5] * 6 + [1.0], "mask": [True] * 6 + [False]},
    "proprio": {"q01": [0.0] * 8, "q99": [2.0] * 8, "mask": [True] * 8},
}


def _libero_batch(states, images, instructions, stored, key, mask):
    """(B=2, T=2) trajectories from 4 observations, instructions per trajectory."""
    fields = {
        K.OBS_STATE: torch.as_tensor(states).view(2, 2, -1),
        K.OBS_IMAGE: torch.as_tensor(images).view(2, 2, *images.shape[1:]),
        K.STEP_MASK: torch.as_tensor(mask, dtype=torch.float32),
        key: stored.view(2, 2, -1),
        K.PROMPT_TEXT: instructions,
    }
    return make_batch(fields)


@pytest.mark.parametrize("head", ["gaussian", "discrete"])
def test_chunk_act_and_evaluate_agree(head):
    policy = build_mlp_policy({**LIBERO, "head": head}, CPU)
    policy.set_statistics(STATS)
    rng = np.random.default_rng(1)
    states = rng.uniform(0, 2, (4, 8)).astype(np.float32)
    images = rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    instructions = ["open the drawer", "open the drawer", "pick the bowl", "pick the bowl"]
    out = policy.act(images, instructions, states, temperature=1.4, do_sample=True)
    assert policy.tokens_per_step == 21
    assert out.actions.shape == (4, 3, 7) and out.logprobs.shape == (4, 21)
    stored, key = (
        (out.tokens, K.ACTION_TOKENS) if head == "discrete" else (out.raw_actions, K.RAW_ACTIONS)
    )
    assert stored.shape == (4, 21)
    mask = [[1, 1], [1, 0]]
    batch = _libero_batch(states, images, ["open the drawer", "pick the bowl"], stored, key, mask)
    logprobs, _ = policy.evaluate(batch, 1.4)
    expected = out.logprobs.clone()
    expected[3] = 0.0  # masked step
    assert torch.allclose(logprobs.view(4, 21), expected, atol=1e-5)
    # The env actions are the normalised outputs through the statistics and the gripper.
    normalized = (
        policy.bin_centres[out.tokens] if head == "discrete" else out.raw_actions.clamp(-1, 1)
    ).view(4, 3, 7)
    assert np.allclose(out.actions[..., :6], (normalized[..., :6] + 1).numpy() - 0.5, atol=1e-6)
    assert np.array_equal(out.actions[..., 6], -np.sign(2 * normalized[..., 6].numpy() - 1))


def test_discrete_bin_logprobs_and_the_gaussian_head_has_none():
    policy = build_mlp_policy({**LIBERO, "head": "discrete", "num_bins": 9}, CPU)
    rng = np.random.default_rng(2)
    states = rng.uniform(0, 2, (4, 8)).astype(np.float32)
    images = rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    tokens = torch.as_tensor(rng.integers(0, 9, (4, 21)))
    instructions = ["open the drawer", "pick the bowl"]
    batch = _libero_batch(states, images, instructions, tokens, K.ACTION_TOKENS, [[1, 1], [1, 0]])
    check_bin_logprobs(policy, batch, 9)
    gaussian = build_mlp_policy({**LIBERO, "head": "gaussian"}, CPU)
    raw = _libero_batch(
        states, images, instructions, torch.zeros(4, 21), K.RAW_ACTIONS, [[1, 1]] * 2
    )
    with pytest.raises(ValueError, match="Gaussian head has no action bins.*head: discrete"):
        gaussian.bin_logprobs(raw)


def test_instruction_conditioning_is_a_deterministic_hashed_bag_of_words():
    from policies.observation import instruction_buckets

    # crc32 of the lower-cased words, modulo the buckets (the same in every process).
    assert instruction_buckets("Open the DRAWER!", 1000) == [
        zlib.crc32(b"open") % 1000,
        zlib.crc32(b"the") % 1000,
        zlib.crc32(b"drawer") % 1000,
    ]
    policy = build_mlp_policy({**LIBERO, "head": "gaussian", "init_log_std": 0.0}, CPU)
    with torch.no_grad():
        policy.head.weight.normal_()  # a visible mean
    states = np.zeros((2, 8), np.float32)
    images = np.zeros((2, 16, 16, 3), np.uint8)
    a = policy.act(images, ["open the drawer", "pick the bowl"], states, do_sample=False)
    b = policy.act(images, ["the drawer open", "pick the bowl"], states, do_sample=False)
    assert not np.allclose(a.actions[0], a.actions[1])  # only the instruction differs
    assert np.allclose(a.actions, b.actions)  # a bag: word order does not matter
    plain = build_mlp_policy({**LIBERO, "instruction_buckets": 0}, CPU)
    assert plain.instruction is None
    out = plain.act(images, ["open the drawer", "pick the bowl"], states, do_sample=False)
    assert np.allclose(out.actions[0], out.actions[1])


def test_proprio_is_normalised_by_the_statistics():
    policy = build_mlp_policy({"state_dim": 2, "action_dim": 2, "hidden": [4]}, CPU)
    policy.set_statistics(
        {
            "action": {"q01": [0.0, 0.0], "q99": [1.0, 1.0]},
            "proprio": {"q01": [0.0, 10.0], "q99": [2.0, 30.0]},
        }
    )
    raw = np.array([[1.0, 20.0], [5.0, 0.0]], np.float32)
    seen = []
    hook = policy.trunk.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    try:
        policy.act(None, ["", ""], raw, do_sample=False)
    finally:
        hook.remove()
    # 2 (s - q01) / (q99 - q01) - 1, clipped to [-1, 1]
    assert torch.allclose(seen[0], torch.tensor([[0.0, 0.0], [1.0, -1.0]]), atol=1e-6)


@pytest.mark.parametrize("head", ["gaussian", "discrete"])
def test_action_targets_and_mode(head):
    policy = build_mlp_policy({**LIBERO, "head": head, "num_bins": 5}, CPU)
    policy.set_statistics(STATS)
    actions = torch.tensor([[[-0.5, 0.5, 1.5, 0.0, 0.5, 1.0, 1.0]] * 3], dtype=torch.float32)
    key, targets = policy.action_targets(actions)
    # 2 (a + 0.5) / 2 - 1 = a - 0.5 on dims 0-5; gripper +1 (close) -> 1 - 1 = 0.
    normalized = torch.tensor([-1.0, 0.0, 1.0, -0.5, 0.0, 0.5, 0.0]).repeat(3)
    if head == "gaussian":
        assert key == K.RAW_ACTIONS and torch.allclose(targets[0], normalized)
    else:  # nearest of the 5 bin centres -1, -0.5, 0, 0.5, 1
        assert key == K.ACTION_TOKENS
        assert targets[0].tolist() == [0, 2, 4, 1, 2, 3, 2] * 3
    with pytest.raises(ValueError, match="set the demonstrations' chunk to 3"):
        policy.action_targets(torch.zeros(1, 2, 7))
    rng = np.random.default_rng(2)
    states = rng.uniform(0, 2, (4, 8)).astype(np.float32)
    images = rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    batch = _libero_batch(
        states, images, ["a", "b"], torch.zeros(4, 21), K.RAW_ACTIONS, [[1, 1], [1, 0]]
    )
    mode = policy.action_mode(batch).view(4, 21)
    greedy = policy.act(images, ["a", "a", "b", "b"], states, do_sample=False)
    expected = greedy.tokens.float() if head == "discrete" else greedy.raw_actions
    assert torch.allclose(mode[:3], expected[:3], atol=1e-6) and bool((mode[3] == 0).all())
