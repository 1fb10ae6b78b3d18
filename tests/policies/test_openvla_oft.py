"""OpenVLA-OFT on the tiny preset: one forward per chunk, act/evaluate invariants, heads."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import json
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tensordict import TensorDict

import policies  # noqa: F401  (registers the policies)
from embodied_rl import keys as K
from embodied_rl.registry import POLICIES
from policies.openvla.loading import load_weights
from policies.openvla.vision import center_crop_resize, images_to_float
from policies.openvla_oft import OpenVLAOFTPolicy, build_openvla_oft
from tests.policies.bins import check_bin_logprobs

CPU = torch.device("cpu")
INSTRUCTIONS = [
    "put both the alphabet soup and the tomato sauce in the basket",
    "turn on the stove",
]
STATS = {
    "libero_10_no_noops": {
        "action": {
            "q01": [-0.5] * 6 + [0.0],
            "q99": [0.5] * 6 + [1.0],
            "mask": [True] * 6 + [False],
        },
        "proprio": {"q01": [-1.0] * 8, "q99": [1.0] * 8},
    }
}


@pytest.fixture(scope="module")
def discrete() -> OpenVLAOFTPolicy:
    return build_openvla_oft({"seed": 0, "micro_batch_size": 2}, CPU)


@pytest.fixture(scope="module")
def continuous() -> OpenVLAOFTPolicy:
    options = {"seed": 0, "use_continuous_head": True, "use_proprio": True, "chunk": 4}
    return build_openvla_oft(options, CPU)


def images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 40, 40, 3), dtype=np.uint8)


def states(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)


def trajectories(obs: np.ndarray, state: np.ndarray, key: str, stored: torch.Tensor) -> TensorDict:
    """B=2 trajectories of T=3 steps: obs 0, 1 | 2, 3 at steps 0, 1; step 2 masked."""
    image = torch.zeros(2, 3, *obs.shape[1:], dtype=torch.uint8)
    proprio = torch.zeros(2, 3, state.shape[1])
    targets = torch.zeros(2, 3, stored.shape[1], dtype=stored.dtype)
    for i in range(4):
        image[i // 2, i % 2] = torch.from_numpy(obs[i])
        proprio[i // 2, i % 2] = torch.from_numpy(state[i])
        targets[i // 2, i % 2] = stored[i]
    batch = TensorDict(
        {
            K.OBS_IMAGE: image,
            K.OBS_STATE: proprio,
            key: targets,
            K.STEP_MASK: torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
        },
        batch_size=[2],
    )
    batch[K.PROMPT_TEXT] = INSTRUCTIONS
    return batch


def prompts() -> list[str]:
    return [INSTRUCTIONS[0]] * 2 + [INSTRUCTIONS[1]] * 2


def test_registered_and_options_validated() -> None:
    assert POLICIES.get("openvla_oft") is build_openvla_oft
    with pytest.raises(ValueError, match=r"openvla_oft policy: unknown option\(s\) \['chunks'\]"):
        build_openvla_oft({"chunks": 8}, CPU)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        build_openvla_oft({"chunk": 0}, CPU)


def test_whole_chunk_in_one_forward_pass(discrete: OpenVLAOFTPolicy) -> None:
    calls = []
    hook = discrete.vla.language_model.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        out = discrete.act(images(3, 0), INSTRUCTIONS + [""], None, temperature=1.6, do_sample=True)
    finally:
        hook.remove()
    assert len(calls) == 1
    tok = discrete.vla.action_tokenizer
    assert discrete.tokens_per_step == 56
    assert out.actions.shape == (3, 8, 7) and out.tokens.shape == out.logprobs.shape == (3, 56)
    assert int(out.tokens.min()) >= tok.first_id and int(out.tokens.max()) < tok.vocab_size
    # Chunk-major: token 7 s + d is dimension d of chunk step s.
    assert np.allclose(out.actions, tok.decode(out.tokens).reshape(3, 8, 7).numpy())


def test_evaluate_reproduces_act_logprobs(discrete: OpenVLAOFTPolicy) -> None:
    obs = images(4, 1)
    torch.manual_seed(0)
    out = discrete.act(obs, prompts(), None, temperature=1.6, do_sample=True)
    batch = trajectories(obs, states(4, 0), K.ACTION_TOKENS, out.tokens)
    logprobs, entropy = discrete.evaluate(batch, 1.6)
    assert logprobs.shape == entropy.shape == (2, 3 * 56)
    steps = logprobs.reshape(2, 3, 56)
    assert torch.allclose(steps[:, :2].reshape(4, 56), out.logprobs, atol=1e-5)
    assert bool((steps[:, 2] == 0).all()) and bool((entropy.reshape(2, 3, 56)[:, 2] == 0).all())
    assert bool((entropy.reshape(2, 3, 56)[:, :2] > 0).all())


def test_bin_logprobs_are_evaluate_before_the_gather(
    discrete: OpenVLAOFTPolicy, continuous: OpenVLAOFTPolicy
) -> None:
    obs = images(4, 2)
    torch.manual_seed(2)
    out = discrete.act(obs, prompts(), None, temperature=1.0, do_sample=True)
    check_bin_logprobs(discrete, trajectories(obs, states(4, 0), K.ACTION_TOKENS, out.tokens), 256)
    raw = torch.zeros(4, continuous.tokens_per_step)
    with pytest.raises(ValueError, match="continuous head .* no action bins.*action_head: false"):
        continuous.bin_logprobs(trajectories(obs, states(4, 0), K.RAW_ACTIONS, raw))


def test_logits_read_before_each_action_slot(discrete: OpenVLAOFTPolicy) -> None:
    """Direct computation: [BOS, image, prompt, 56 zero slots, STOP] through the whole LM."""
    obs, temperature = images(1, 8), 1.2
    tokens = discrete.act(obs, INSTRUCTIONS[:1], None, temperature=1.0, do_sample=True).tokens
    vla = discrete.vla
    with torch.no_grad():
        text = torch.tensor([discrete.prompts.text_ids(INSTRUCTIONS[0])])
        image_tokens = vla.image_tokens(discrete.pixel_values(obs))
        start = vla.embed_tokens(torch.tensor([[discrete.prompts.start_id]]))
        stop = vla.embed_tokens(torch.tensor([[discrete.tokenizer.eos_token_id]]))
        embeds = torch.cat(
            [start, image_tokens, vla.embed_tokens(text), torch.zeros(1, 56, 64), stop], 1
        )
        logits = vla.language_model(inputs_embeds=embeds).logits[0]
    first_slot = 1 + image_tokens.shape[1] + text.shape[1]
    action_logits = logits[first_slot - 1 : first_slot + 55, vla.action_tokenizer.logit_slice]
    expected = torch.log_softmax(action_logits / temperature, dim=-1).gather(
        -1, (tokens[0] - vla.action_tokenizer.first_id)[:, None]
    )[:, 0]
    batch = TensorDict(
        {
            K.OBS_IMAGE: torch.from_numpy(obs)[:, None],
            K.ACTION_TOKENS: tokens[:, None],
            K.STEP_MASK: torch.ones(1, 1),
        },
        batch_size=[1],
    )
    batch[K.PROMPT_TEXT] = INSTRUCTIONS[:1]
    assert torch.allclose(discrete.evaluate(batch, temperature)[0][0], expected, atol=1e-5)


def test_attention_is_bidirectional_and_padding_free(discrete: OpenVLAOFTPolicy) -> None:
    obs = images(2, 2)
    with torch.no_grad():
        both = discrete.action_hidden(obs, INSTRUCTIONS, None)
        alone = discrete.action_hidden(obs[1:], INSTRUCTIONS[1:], None)  # shorter prompt, unpadded
        stop = discrete.stop_id
        discrete.stop_id = stop - 1  # the stop token comes after every action slot
        try:
            other_stop = discrete.action_hidden(obs, INSTRUCTIONS, None)
        finally:
            discrete.stop_id = stop
    assert torch.allclose(both[1], alone[0], atol=1e-5)
    # Under causal attention no slot could see the stop token.
    assert not torch.allclose(both[:, 0], other_stop[:, 0], atol=1e-4)


def test_center_crop_is_applied(discrete: OpenVLAOFTPolicy) -> None:
    obs = images(1, 3)
    x = center_crop_resize(images_to_float(torch.from_numpy(obs), 32))
    expected = discrete.vla.vision_backbone.normalize(x)
    assert torch.allclose(discrete.pixel_values(obs), expected)
    assert discrete.options.center_crop


def test_continuous_head_logprob_invariant(continuous: OpenVLAOFTPolicy) -> None:
    obs, state, temperature = images(4, 4), states(4, 1), 1.6
    torch.manual_seed(1)
    out = continuous.act(obs, prompts(), state, temperature=temperature, do_sample=True)
    assert out.tokens is None and out.raw_actions.shape == out.logprobs.shape == (4, 28)
    assert out.actions.shape == (4, 4, 7)
    assert np.allclose(out.actions, out.raw_actions.clamp(-1, 1).reshape(4, 4, 7).numpy())
    logprobs, entropy = continuous.evaluate(
        trajectories(obs, state, K.RAW_ACTIONS, out.raw_actions), temperature
    )
    assert torch.allclose(logprobs.reshape(2, 3, 28)[:, :2].reshape(4, 28), out.logprobs, atol=1e-5)
    std = continuous.action_log_std.detach().exp() * math.sqrt(temperature)
    by_hand = 0.5 * math.log(2 * math.pi * math.e) + std.log()
    assert torch.allclose(entropy.reshape(2, 3, 4, 7)[:, :2], by_hand.expand(2, 2, 4, 7), atol=1e-5)
    assert bool((entropy.reshape(2, 3, 28)[:, 2] == 0).all())
    greedy = continuous.act(obs, prompts(), state, temperature=temperature, do_sample=False)
    peak = -(std.log() + 0.5 * math.log(2 * math.pi)).repeat(4)
    assert torch.allclose(greedy.logprobs, peak.expand(4, 28), atol=1e-5)  # the mean


def test_continuous_evaluate_trains_head_and_log_std(continuous: OpenVLAOFTPolicy) -> None:
    obs, state = images(4, 5), states(4, 2)
    out = continuous.act(obs, prompts(), state, temperature=1.0, do_sample=True)
    continuous.zero_grad()
    logprobs, _ = continuous.evaluate(trajectories(obs, state, K.RAW_ACTIONS, out.raw_actions), 1.0)
    logprobs.sum().backward()
    for param in (
        continuous.action_log_std,
        continuous.action_head.fc_in.weight,
        continuous.proprio_projector.fc1.weight,
        continuous.vla.language_model.model.layers[1].mlp.up_proj.weight,
    ):
        assert param.grad is not None and float(param.grad.abs().sum()) > 0
    continuous.zero_grad()


def test_proprio_token(continuous: OpenVLAOFTPolicy) -> None:
    obs = images(2, 6)
    a = continuous.act(obs, INSTRUCTIONS, states(2, 3), temperature=1.0, do_sample=False)
    b = continuous.act(obs, INSTRUCTIONS, states(2, 4), temperature=1.0, do_sample=False)
    assert not np.allclose(a.actions, b.actions)
    with pytest.raises(ValueError, match="needs states"):
        continuous.act(obs, INSTRUCTIONS, None, temperature=1.0, do_sample=False)


def test_checkpoint_round_trip_with_heads(
    continuous: OpenVLAOFTPolicy, discrete: OpenVLAOFTPolicy, tmp_path
) -> None:
    without = {k: v.clone() for k, v in continuous.normalizer.state_dict().items()}
    continuous.set_statistics(STATS["libero_10_no_noops"])
    continuous.statistics_name = "libero_10_no_noops"
    try:  # the statistics go to dataset_statistics.json
        folder = continuous.save_pretrained(tmp_path / "oft")
    finally:
        continuous.normalizer.load_state_dict(without)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    assert {"proprio_projector.fc1.weight", "action_head.fc_in.weight", "action_log_std"} <= names
    assert not any(name.startswith("normalizer.") for name in names)
    saved = json.loads((folder / "dataset_statistics.json").read_text())["libero_10_no_noops"]
    assert saved["action"]["q01"] == STATS["libero_10_no_noops"]["action"]["q01"]
    assert saved["proprio"]["mask"] == [True] * 8
    assert "vision_backbone.featurizer.blocks.2.ls2.scale_factor" in names
    options = {"preset": None, "path": str(folder), "use_continuous_head": True}
    loaded = build_openvla_oft({**options, "use_proprio": True, "chunk": 4}, CPU)
    obs, state = images(2, 7), states(2, 5)
    a = continuous.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    b = loaded.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    # The proprio state is normalised with the checkpoint's q01/q99 (here [-1, 1]: clipping).
    clipped = continuous.act(obs, INSTRUCTIONS, state.clip(-1, 1), temperature=1.0, do_sample=False)
    assert torch.allclose(b.raw_actions, clipped.raw_actions, atol=1e-5)
    assert not torch.allclose(a.raw_actions, b.raw_actions, atol=1e-4)
    raw = clipped.raw_actions.clamp(-1, 1).reshape(2, 4, 7).numpy()
    assert np.allclose(b.actions[..., :6], 0.5 * (raw[..., :6] + 1) - 0.5, atol=1e-5)
    with pytest.raises(ValueError, match=r"unexpected \['action_head"):
        load_weights(discrete, folder)  # no heads: options must match the checkpoint


def test_seed_gives_identical_weights(discrete: OpenVLAOFTPolicy) -> None:
    again = build_openvla_oft({"seed": 0}, CPU).state_dict()
    assert all(torch.equal(v, again[k]) for k, v in discrete.state_dict().items())


# ----------------------------------------------------------------------------- value head
def test_value_head_values_shapes_masked_zeros_gradient_and_seed() -> None:
    options = {"seed": 0, "micro_batch_size": 3, "chunk": 2, "value_head": True}
    critic = build_openvla_oft(options, CPU)
    obs, state = images(4, seed=5), states(4, seed=6)
    stored = torch.zeros(4, critic.tokens_per_step, dtype=torch.long)
    batch = trajectories(obs, state, K.ACTION_TOKENS, stored)
    critic.train()
    values = critic.values(batch)
    assert values.shape == (2, 3) and values.dtype == torch.float32
    assert values[:, 2].abs().sum() == 0.0  # masked steps
    with torch.no_grad():  # each step's value is that observation's V(s)
        direct = critic.observation_values(obs, prompts(), None)
    assert torch.allclose(values[:, :2].reshape(-1), direct, atol=1e-5)
    assert values.abs().max() < 0.1  # small init
    values.sum().backward()
    assert critic.value_head.weight.grad.abs().sum() > 0
    assert critic.vla.projector.fc1.weight.grad.abs().sum() > 0  # reaches the backbone too
    again = build_openvla_oft(options, CPU)
    assert torch.equal(again.value_head.weight, critic.value_head.weight)
    plain = build_openvla_oft({"seed": 0, "chunk": 2}, CPU)
    assert plain.value_head is None
    assert torch.equal(plain.vla.projector.fc1.weight, again.vla.projector.fc1.weight)
    with pytest.raises(ValueError, match="no value head"):
        plain.values(batch)


def test_bc_targets_and_mode_match_greedy_act(
    discrete: OpenVLAOFTPolicy, continuous: OpenVLAOFTPolicy
) -> None:
    obs, state = images(4, 9), states(4, 9)
    actions = torch.rand(4, 4, 7) * 2 - 1
    key, targets = continuous.action_targets(actions)
    expected = continuous.normalizer.from_env(actions).reshape(4, 28)
    assert key == K.RAW_ACTIONS and torch.equal(targets, expected)
    key, tokens = discrete.action_targets(torch.rand(1, 8, 7))
    assert key == K.ACTION_TOKENS and tokens.shape == (1, 56)
    for policy, stored in ((discrete, K.ACTION_TOKENS), (continuous, K.RAW_ACTIONS)):
        greedy = policy.act(obs, prompts(), state, temperature=1.0, do_sample=False)
        best = greedy.tokens.float() if stored == K.ACTION_TOKENS else greedy.raw_actions
        placeholder = torch.zeros(4, policy.tokens_per_step, dtype=best.dtype)
        with torch.no_grad():
            mode = policy.action_mode(trajectories(obs, state, stored, placeholder))
        steps = mode.view(2, 3, -1)
        assert torch.allclose(steps[:, :2].reshape(4, -1), best, atol=1e-5)
        assert bool((steps[:, 2] == 0).all())
