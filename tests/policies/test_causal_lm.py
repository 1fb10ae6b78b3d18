"""Causal-LM policy: Qwen2.5 tokenizer, tiny preset, generate/evaluate, constrained decoding."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import pytest
import torch
from tensordict import TensorDict

import policies  # noqa: F401  (registers the causal_lm policy)
from embodied_rl import keys as K
from embodied_rl.registry import POLICIES
from policies.causal_lm import (
    CausalLMConfig,
    CausalLMPolicy,
    build_causal_lm,
    build_qwen2_tokenizer,
    build_tiny_qwen2,
)
from policies.causal_lm.tokenizer import default_cache_root

CPU = torch.device("cpu")
EOS = 151643
DIGITS = [str(d) for d in range(10)]
DIGIT_IDS = list(range(15, 25))  # Qwen2.5 ids of "0".."9"


@pytest.fixture(scope="module")
def policy() -> CausalLMPolicy:
    return build_causal_lm({"seed": 0}, CPU)


@pytest.fixture(scope="module")
def digits_policy() -> CausalLMPolicy:
    return build_causal_lm({"seed": 0, "allowed_response_tokens": DIGITS}, CPU)


def left_pad(
    rows: list[list[int]], length: int, pad: int = EOS
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), length), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, length - len(row) :] = torch.tensor(row)
        mask[i, length - len(row) :] = 1
    return ids, mask


def scored_batch(prompt_ids, prompt_mask, response_ids, response_mask) -> TensorDict:
    return TensorDict(
        {
            K.PROMPT_IDS: prompt_ids,
            K.PROMPT_MASK: prompt_mask,
            K.RESPONSE_IDS: response_ids,
            K.RESPONSE_MASK: response_mask,
        },
        batch_size=[prompt_ids.shape[0]],
    )


def example_batch() -> TensorDict:
    """Three left-padded prompts of lengths 2, 5, 3; responses of 4 tokens with EOS inside."""
    prompts = [[40, 41], [1000, 17, 10, 22, 28], [5, 6, 7]]
    prompt_ids, prompt_mask = left_pad(prompts, 6)
    response_ids = torch.tensor([[17, 18, EOS, EOS], [300, 301, 302, 303], [16, EOS, EOS, EOS]])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)
    return scored_batch(prompt_ids, prompt_mask, response_ids, response_mask)


def reference_logits(policy: CausalLMPolicy, batch: TensorDict, row: int) -> torch.Tensor:
    """Logits (n_valid, V) predicting row ``row``'s valid response tokens, no padding at all."""
    prompt = batch[K.PROMPT_IDS][row][batch[K.PROMPT_MASK][row].bool()]
    n_valid = int(batch[K.RESPONSE_MASK][row].sum())
    response = batch[K.RESPONSE_IDS][row][:n_valid]
    ids = torch.cat([prompt, response]).unsqueeze(0)
    logits = policy.model(input_ids=ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + n_valid]


# --- tokenizer --------------------------------------------------------------------------


def test_qwen2_tokenizer_ids_and_cache(tmp_path):
    folder = tmp_path / "tok"
    tokenizer = build_qwen2_tokenizer(folder)
    assert tokenizer("What is 12+7?")["input_ids"] == [3838, 374, 220, 16, 17, 10, 22, 30]
    assert tokenizer.encode("12+7=") == [16, 17, 10, 22, 28]
    assert tokenizer.eos_token_id == EOS and tokenizer.pad_token_id == EOS
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [151644, 151645]
    assert len(tokenizer) == 151646
    text = "héllo wörld 日本語\n\n  x = 3.14;"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # Saved atomically: the complete folder exists, no temp folder is left beside it.
    assert (folder / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]
    assert build_qwen2_tokenizer(folder) is tokenizer  # memoised in-process


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("EMBODIED_RL_CACHE", str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv("EMBODIED_RL_CACHE")
    assert default_cache_root().parts[-2:] == (".cache", "embodied_rl")


# --- model building ---------------------------------------------------------------------


def test_registered_builder():
    assert POLICIES.get("causal_lm") is build_causal_lm


def test_same_seed_same_weights_and_global_rng_untouched(policy):
    state = torch.get_rng_state()
    first = build_tiny_qwen2(len(policy.tokenizer), policy.tokenizer, seed=3)
    second = build_tiny_qwen2(len(policy.tokenizer), policy.tokenizer, seed=3)
    other = build_tiny_qwen2(len(policy.tokenizer), policy.tokenizer, seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)


def test_tiny_preset_shape(policy):
    config = policy.model.config
    assert (config.hidden_size, config.num_hidden_layers) == (64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)
    # vLLM's attention kernels take head sizes of 32 and up (the vLLM backend runs this preset).
    assert config.hidden_size // config.num_attention_heads == 32
    assert config.vocab_size == len(policy.tokenizer) == 151646
    # Tied embeddings: the output layer is the input embedding.
    assert (
        policy.model.lm_head.weight.data_ptr() == policy.model.model.embed_tokens.weight.data_ptr()
    )


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="preset: null"):
        CausalLMConfig(path="/some/dir")
    with pytest.raises(ValueError, match="needs a preset"):
        CausalLMConfig(preset=None)
    with pytest.raises(ValueError, match="tiny_qwen2"):
        CausalLMConfig(preset="huge")
    with pytest.raises(ValueError, match="dtype"):
        CausalLMConfig(dtype="float64")
    with pytest.raises(ValueError, match="list"):
        CausalLMConfig(allowed_response_tokens="0123")
    with pytest.raises(ValueError, match="valid options: .*allowed_response_tokens"):
        build_causal_lm({"sead": 1}, CPU)
    with pytest.raises(FileNotFoundError, match="local HF checkpoint"):
        build_causal_lm({"preset": None, "path": "/nonexistent/ckpt"}, CPU)


def test_multi_token_allowed_entry_is_rejected(policy):
    # Qwen splits digits, so "12" is two tokens.
    with pytest.raises(ValueError, match="'12' is 2 tokens"):
        CausalLMPolicy(policy.model, policy.tokenizer, ["1", "12"])


def test_load_from_local_directory(policy, tmp_path):
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    loaded = build_causal_lm({"preset": None, "path": str(tmp_path)}, CPU)
    assert loaded.tokenizer.encode("12+7=") == [16, 17, 10, 22, 28]
    batch = example_batch()
    expected, _ = policy.evaluate(batch)
    got, _ = loaded.evaluate(batch)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


# --- evaluate -----------------------------------------------------------------------------


def test_evaluate_matches_unpadded_reference(policy):
    batch = example_batch()
    temperature = 0.7
    with torch.no_grad():
        logprobs, entropy = policy.evaluate(batch, temperature=temperature)
    assert logprobs.shape == entropy.shape == (3, 4)
    for row in range(3):
        n_valid = int(batch[K.RESPONSE_MASK][row].sum())
        with torch.no_grad():
            ref = torch.log_softmax(reference_logits(policy, batch, row) / temperature, dim=-1)
        tokens = batch[K.RESPONSE_IDS][row][:n_valid]
        ref_logprobs = ref.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        ref_entropy = -(ref.exp() * ref).sum(-1)
        torch.testing.assert_close(logprobs[row, :n_valid], ref_logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(entropy[row, :n_valid], ref_entropy, atol=1e-5, rtol=0)
        assert torch.all(logprobs[row, n_valid:] == 0) and torch.all(entropy[row, n_valid:] == 0)


def test_reference_detects_attended_padding(policy):
    """Guard for the test above: the pads of example_batch change logits unless masked.

    (Qwen2's rotary positions are relative, so a constant position offset from left padding
    is invisible; the attention mask is what must be right.)
    """
    batch = example_batch()
    ids = torch.cat([batch[K.PROMPT_IDS], batch[K.RESPONSE_IDS]], dim=1)
    with torch.no_grad():
        unmasked = policy.model(input_ids=ids).logits[0, 5:7].float()
        ref = reference_logits(policy, batch, 0)[:2]
    assert (unmasked - ref).abs().max() > 1e-3


def test_evaluate_is_differentiable(policy):
    policy.model.zero_grad()
    batch = example_batch()
    logprobs, entropy = policy.evaluate(batch)
    (logprobs.sum() + 0.1 * entropy.sum()).backward()
    embed = policy.model.model.embed_tokens.weight.grad
    layer = policy.model.model.layers[0].self_attn.q_proj.weight.grad
    assert embed is not None and layer is not None
    assert torch.isfinite(embed).all() and layer.abs().sum() > 0
    policy.model.zero_grad()


# --- generate -----------------------------------------------------------------------------


def test_response_mask_stops_after_first_eos(policy):
    ids = torch.tensor([[5, EOS, 7, EOS], [5, 6, 7, 8], [EOS, EOS, 1, 1]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(policy.response_mask(ids), expected)


def test_generate_shapes_mask_and_seed(policy):
    prompt_ids, prompt_mask = left_pad([[16, 17, 10, 22, 28], [18, 11, 16, 28]], 7)
    torch.manual_seed(7)
    response, mask = policy.generate(prompt_ids, prompt_mask, max_new_tokens=5, temperature=1.0)
    assert response.shape == mask.shape == (2, 5)
    assert response.dtype == torch.long and mask.dtype == torch.float32
    assert torch.equal(mask, policy.response_mask(response))
    torch.manual_seed(7)
    again, _ = policy.generate(prompt_ids, prompt_mask, max_new_tokens=5, temperature=1.0)
    assert torch.equal(response, again)
    assert policy.model.training is False


def test_generate_pads_to_exact_length_after_early_stop(policy):
    # Allowed = {"0", EOS}: every row ends with EOS within a few steps, generate() stops
    # early, and the policy must still return exactly max_new_tokens columns.
    zero_or_eos = CausalLMPolicy(policy.model, policy.tokenizer, ["0"])
    prompt_ids, prompt_mask = left_pad([[16, 17, 10, 22, 28]] * 8, 5)
    torch.manual_seed(0)
    response, mask = zero_or_eos.generate(prompt_ids, prompt_mask, max_new_tokens=16)
    assert response.shape == (8, 16)
    assert set(response.unique().tolist()) <= {15, EOS}
    lengths = mask.sum(1).long()
    assert lengths.max() < 16  # all rows stopped early (p(EOS) ~ 1/2 per step)
    for row, length in zip(response, lengths):
        assert row[length - 1] == EOS and torch.all(row[length:] == EOS)
        assert torch.all(row[: length - 1] == 15)


# --- constrained decoding -----------------------------------------------------------------


def test_restricted_generation_only_emits_allowed_tokens(digits_policy):
    assert digits_policy.allowed_ids.tolist() == DIGIT_IDS + [EOS]
    prompt_ids, prompt_mask = left_pad([[16, 17, 10, 22, 28], [19, 11, 16, 28]] * 8, 5)
    torch.manual_seed(1)
    response, mask = digits_policy.generate(prompt_ids, prompt_mask, max_new_tokens=6)
    assert set(response.unique().tolist()) <= set(DIGIT_IDS) | {EOS}
    valid_text = digits_policy.tokenizer.batch_decode(
        [r[: int(m.sum())] for r, m in zip(response.tolist(), mask)], skip_special_tokens=True
    )
    assert all(text.isdigit() or text == "" for text in valid_text)


def restricted_first_token_logprobs(policy: CausalLMPolicy, prompt: list[int], temperature: float):
    """log pi(t | prompt) for every allowed token t, via evaluate on 1-token responses."""
    allowed = policy.allowed_ids
    prompt_ids, prompt_mask = left_pad([prompt] * len(allowed), len(prompt))
    batch = scored_batch(prompt_ids, prompt_mask, allowed.unsqueeze(1), torch.ones(len(allowed), 1))
    with torch.no_grad():
        logprobs, entropy = policy.evaluate(batch, temperature=temperature)
    return logprobs[:, 0], entropy[:, 0]


def test_restricted_evaluate_is_renormalised_over_the_set(digits_policy):
    prompt = [16, 17, 10, 22, 28]
    logprobs, entropy = restricted_first_token_logprobs(digits_policy, prompt, temperature=0.5)
    assert torch.isclose(logprobs.exp().sum(), torch.tensor(1.0), atol=1e-5)
    # Same as masking all other logits to -inf in a full-vocabulary softmax.
    with torch.no_grad():
        logits = digits_policy.model(input_ids=torch.tensor([prompt])).logits[0, -1] / 0.5
    masked = torch.full_like(logits, float("-inf"))
    masked[digits_policy.allowed_ids] = logits[digits_policy.allowed_ids]
    expected = torch.log_softmax(masked, -1)[digits_policy.allowed_ids]
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[0], -(expected.exp() * expected).sum(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="outside allowed_response_tokens"):
        digits_policy.evaluate(
            scored_batch(*left_pad([prompt], 5), torch.tensor([[3838]]), torch.ones(1, 1))
        )


def test_top_p_applies_to_the_restricted_distribution(digits_policy):
    """Nucleus sampling after the restriction: only the nucleus of evaluate's distribution."""
    prompt = [16, 17, 10, 22, 28]
    embed = digits_policy.model.model.embed_tokens.weight
    saved = embed.detach().clone()
    with torch.no_grad():  # sharpen the random model so that the nucleus is a strict subset
        embed.mul_(40.0)
    try:
        logprobs, _ = restricted_first_token_logprobs(digits_policy, prompt, temperature=1.0)
        probs, order = logprobs.exp().sort(descending=True)
        top_p = 0.5
        keep = int((probs.cumsum(0) < top_p).sum()) + 1
        nucleus = set(digits_policy.allowed_ids[order[:keep]].tolist())
        assert keep < len(probs)
        prompt_ids, prompt_mask = left_pad([prompt] * 64, 5)
        torch.manual_seed(0)
        response, _ = digits_policy.generate(prompt_ids, prompt_mask, max_new_tokens=1, top_p=top_p)
        assert set(response[:, 0].tolist()) <= nucleus
    finally:
        with torch.no_grad():
            embed.copy_(saved)


def test_inspect_describes_a_causal_lm_folder(tmp_path, capsys):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from embodied_rl.cli import main

    config = Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    count = sum(p.numel() for p in model.parameters()) - model.lm_head.weight.numel() * int(
        config.tie_word_embeddings
    )
    assert "Qwen2ForCausalLM (a Hugging Face causal LM)" in out and f"{count / 1e3:.2f} k" in out
    assert "models.actor.policy=causal_lm ++models.actor.options.preset=null" in out
