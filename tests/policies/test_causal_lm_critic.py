"""Causal-LM critic: values against an unpadded per-sequence reference, gradients, seeding."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import pytest
import torch
from tensordict import TensorDict

import policies  # noqa: F401  (registers the causal_lm_critic policy)
from embodied_rl import keys as K
from embodied_rl.registry import POLICIES
from policies.causal_lm import CausalLMCritic, build_causal_lm_critic

CPU = torch.device("cpu")
EOS = 151643


@pytest.fixture(scope="module")
def critic() -> CausalLMCritic:
    return build_causal_lm_critic({"seed": 0}, CPU)


def padded_batch(prompt_len: int) -> TensorDict:
    """Prompts of 2, 5 and 3 tokens left-padded to ``prompt_len``; 4-token responses."""
    prompts = [[40, 41], [1000, 17, 10, 22, 28], [5, 6, 7]]
    ids = torch.full((3, prompt_len), EOS, dtype=torch.long)
    mask = torch.zeros((3, prompt_len), dtype=torch.long)
    for row, tokens in enumerate(prompts):
        ids[row, prompt_len - len(tokens) :] = torch.tensor(tokens)
        mask[row, prompt_len - len(tokens) :] = 1
    response_ids = torch.tensor([[17, 18, EOS, EOS], [300, 301, 302, 303], [16, EOS, EOS, EOS]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    return TensorDict(
        {
            K.PROMPT_IDS: ids,
            K.PROMPT_MASK: mask,
            K.RESPONSE_IDS: response_ids,
            K.RESPONSE_MASK: response_mask,
        },
        batch_size=[3],
    )


def reference_values(critic: CausalLMCritic, batch: TensorDict, row: int) -> torch.Tensor:
    """V of row ``row``'s valid response tokens from one unpadded sequence, default positions.

    The state before response token t is the hidden state at sequence position
    ``len(prompt) - 1 + t``.
    """
    prompt = batch[K.PROMPT_IDS][row][batch[K.PROMPT_MASK][row].bool()]
    n_valid = int(batch[K.RESPONSE_MASK][row].sum())
    response = batch[K.RESPONSE_IDS][row][:n_valid]
    ids = torch.cat([prompt, response]).unsqueeze(0)
    hidden = critic.backbone(input_ids=ids).last_hidden_state[0].float()
    states = hidden[len(prompt) - 1 : len(prompt) - 1 + n_valid]
    return states @ critic.value_head.weight[0] + critic.value_head.bias[0]


def test_registered_under_causal_lm_critic():
    assert POLICIES.get("causal_lm_critic") is build_causal_lm_critic


@pytest.mark.parametrize("prompt_len", [5, 8])
def test_values_match_unpadded_reference(critic, prompt_len):
    batch = padded_batch(prompt_len)
    with torch.no_grad():
        values = critic.values(batch)
        assert values.shape == (3, 4) and values.dtype == torch.float32
        for row in range(3):
            n_valid = int(batch[K.RESPONSE_MASK][row].sum())
            expected = reference_values(critic, batch, row)
            torch.testing.assert_close(values[row, :n_valid], expected, atol=1e-5, rtol=1e-4)
            assert values[row, n_valid:].abs().sum().item() == 0.0
    # Small init of the head: values start near 0 (std 0.01 * |h| with |h| ~ sqrt(64)).
    assert values.abs().max().item() < 1.0


def test_value_of_a_state_does_not_see_its_own_token(critic):
    batch = padded_batch(5)
    changed = batch.clone()
    changed[K.RESPONSE_IDS][1, 2] = 999  # token 2 of row 1 changes: V(s_0..s_2) must not
    with torch.no_grad():
        before, after = critic.values(batch), critic.values(changed)
    torch.testing.assert_close(after[1, :3], before[1, :3])
    assert after[1, 3].item() != pytest.approx(before[1, 3].item(), abs=1e-7)


def test_gradient_reaches_head_and_backbone():
    critic = build_causal_lm_critic({"seed": 0}, CPU)
    critic.train()
    loss = (critic.values(padded_batch(5)) - 1.0).pow(2).sum()
    loss.backward()
    head_grad = critic.value_head.weight.grad
    assert head_grad is not None and head_grad.abs().sum().item() > 0
    layer = critic.backbone.layers[-1].mlp.down_proj.weight.grad
    assert layer is not None and layer.abs().sum().item() > 0
    assert not hasattr(critic.backbone, "lm_head")


def test_same_seed_same_weights_other_seed_other_head(critic):
    again = build_causal_lm_critic({"seed": 0}, CPU)
    other = build_causal_lm_critic({"seed": 1}, CPU)
    state, again_state = critic.state_dict(), again.state_dict()
    assert state.keys() == again_state.keys()
    for name in state:
        assert torch.equal(state[name], again_state[name]), name
    assert not torch.equal(state["value_head.weight"], other.state_dict()["value_head.weight"])


def test_building_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_causal_lm_critic({"seed": 5}, CPU)
    assert torch.equal(torch.rand(3), expected)


def test_constrained_decoding_option_is_rejected():
    with pytest.raises(ValueError, match="takes no allowed_response_tokens"):
        build_causal_lm_critic({"allowed_response_tokens": ["0", "1"]}, CPU)
