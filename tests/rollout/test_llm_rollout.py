"""rollout.llm node with a real tiny causal-LM policy and a real NodeContext."""

from __future__ import annotations

import importlib.util

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import dataclasses
from pathlib import Path

import pytest
import torch

import embodied_rl.nodes  # noqa: F401  (registers reward.arithmetic)
import policies  # noqa: F401  (registers the causal_lm policy)
import rollout  # noqa: F401  (registers rollout.llm)
from embodied_rl import keys as K
from embodied_rl.dag.node_type import NodeConfigError
from embodied_rl.data.batch import batch_len, make_batch, strings
from embodied_rl.data.layout import Layout
from embodied_rl.registry import NODE_TYPES, POLICIES
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, score
from rollout.llm import LLMRolloutConfig, llm_rollout
from rollout.vllm_engine import VLLMOptions, engine_memory_args

CPU = torch.device("cpu")
OUTPUT_KEYS = (
    K.PROMPT_IDS,
    K.PROMPT_MASK,
    K.RESPONSE_IDS,
    K.RESPONSE_MASK,
    K.RESPONSE_TEXT,
    K.OLD_LOGPROBS,
    K.GROUP_ID,
    K.SAMPLE_ID,
)


@pytest.fixture(scope="module")
def policy():
    return POLICIES.get("causal_lm")({"seed": 0}, CPU)


@pytest.fixture(scope="module")
def digits_policy():
    digits = [str(d) for d in range(10)]
    return POLICIES.get("causal_lm")({"seed": 0, "allowed_response_tokens": digits}, CPU)


def make_ctx(policy, seed: int = 1234, **options) -> NodeContext:
    return NodeContext(
        cfg=None,
        node_id="rollout",
        node_config=LLMRolloutConfig(**options),
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models={"actor": policy},
        state={},
        step=0,
        metrics=MetricSink(),
        device=CPU,
        run_dir=Path("."),
        seed_fn=lambda tag: seed,
    )


def prompt_batch():
    return make_batch(
        {
            K.PROMPT_TEXT: ["12+7=", "3-1=", "40+25="],
            K.ANSWER_TEXT: ["19", "2", "65"],
            K.SAMPLE_ID: torch.tensor([10, 11, 12]),
        }
    )


def test_rollout_shapes_grouping_and_ids(policy):
    ctx = make_ctx(policy, n=4, max_prompt_length=8, max_response_length=6)
    out = llm_rollout(ctx, prompt_batch())
    assert batch_len(out) == 12
    assert set(OUTPUT_KEYS) <= set(out.keys())
    assert out[K.PROMPT_IDS].shape == out[K.PROMPT_MASK].shape == (12, 8)
    assert out[K.RESPONSE_IDS].shape == out[K.RESPONSE_MASK].shape == (12, 6)
    assert out[K.OLD_LOGPROBS].shape == (12, 6) and out[K.OLD_LOGPROBS].dtype == torch.float32
    assert out[K.GROUP_ID].tolist() == [10] * 4 + [11] * 4 + [12] * 4
    assert out[K.SAMPLE_ID].tolist() == [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
    # Other input fields travel with their prompt.
    assert strings(out, K.ANSWER_TEXT) == ["19"] * 4 + ["2"] * 4 + ["65"] * 4
    tokenizer = policy.tokenizer
    for row in range(12):
        mask = out[K.PROMPT_MASK][row]
        n_prompt = int(mask.sum())
        # Left padding: pads first, then the real tokens.
        assert mask.tolist() == [0] * (8 - n_prompt) + [1] * n_prompt
        text = tokenizer.decode(out[K.PROMPT_IDS][row, 8 - n_prompt :])
        assert text == strings(out, K.PROMPT_TEXT)[row]
        n_response = int(out[K.RESPONSE_MASK][row].sum())
        valid = out[K.RESPONSE_IDS][row, :n_response]
        assert strings(out, K.RESPONSE_TEXT)[row] == tokenizer.decode(
            valid, skip_special_tokens=True
        )
    assert torch.equal(out[K.PROMPT_IDS][0], torch.tensor([151643] * 3 + [16, 17, 10, 22, 28]))


def test_old_logprobs_equal_policy_evaluate(policy):
    ctx = make_ctx(policy, n=3, max_prompt_length=8, max_response_length=5, temperature=0.8)
    out = llm_rollout(ctx, prompt_batch())
    with torch.no_grad():
        expected, _ = policy.evaluate(out, temperature=0.8)
    torch.testing.assert_close(out[K.OLD_LOGPROBS], expected, atol=1e-6, rtol=0)
    assert torch.all(out[K.OLD_LOGPROBS][out[K.RESPONSE_MASK] == 0] == 0)
    assert torch.all(out[K.OLD_LOGPROBS][out[K.RESPONSE_MASK] == 1] < 0)


def test_micro_batches_cover_every_sample(digits_policy):
    # 3 prompts x 3 samples in chunks of 4 (4 + 4 + 1): log-probs still line up per row.
    ctx = make_ctx(
        digits_policy, n=3, max_prompt_length=8, max_response_length=4, micro_batch_size=4
    )
    out = llm_rollout(ctx, prompt_batch())
    with torch.no_grad():
        expected, _ = digits_policy.evaluate(out, temperature=1.0)
    torch.testing.assert_close(out[K.OLD_LOGPROBS], expected, atol=1e-6, rtol=0)
    # Constrained to digits: every response reads as digits (possibly empty: EOS first).
    texts = strings(out, K.RESPONSE_TEXT)
    assert all(text.isdigit() or text == "" for text in texts)
    # The output feeds the arithmetic reward node directly.
    reward_ctx = dataclasses.replace(ctx, node_config=ArithmeticRewardConfig())
    rewarded = NODE_TYPES.get("reward.arithmetic").fn(reward_ctx, out)
    expected_rewards = [score(t, a) for t, a in zip(texts, strings(out, K.ANSWER_TEXT))]
    assert rewarded[K.REWARDS].tolist() == pytest.approx(expected_rewards)


def test_same_seed_same_rollout(policy):
    options = {"n": 2, "max_prompt_length": 8, "max_response_length": 4}
    first = llm_rollout(make_ctx(policy, seed=5, **options), prompt_batch())
    again = llm_rollout(make_ctx(policy, seed=5, **options), prompt_batch())
    other = llm_rollout(make_ctx(policy, seed=6, **options), prompt_batch())
    assert torch.equal(first[K.RESPONSE_IDS], again[K.RESPONSE_IDS])
    assert strings(first, K.RESPONSE_TEXT) == strings(again, K.RESPONSE_TEXT)
    assert not torch.equal(first[K.RESPONSE_IDS], other[K.RESPONSE_IDS])


def test_metrics_logged_with_sample_weight(policy):
    ctx = make_ctx(policy, n=2, max_prompt_length=8, max_response_length=4)
    out = llm_rollout(ctx, prompt_batch())
    value, weight, reduce = ctx.metrics.records["rollout/response_length"]
    assert weight == 6 and reduce == "mean"
    assert value == pytest.approx(out[K.RESPONSE_MASK].sum(1).mean().item())


def test_long_prompt_error_names_sample_and_fix(policy):
    ctx = make_ctx(policy, n=2, max_prompt_length=4)
    with pytest.raises(ValueError, match="sample 10 has 5 tokens.*max_prompt_length"):
        llm_rollout(ctx, prompt_batch())


def test_empty_batch_gives_empty_output_with_all_keys(policy):
    ctx = make_ctx(policy, n=3, max_prompt_length=8, max_response_length=5)
    empty = make_batch(
        {K.PROMPT_TEXT: [], K.ANSWER_TEXT: [], K.SAMPLE_ID: torch.zeros(0, dtype=torch.long)},
        batch_size=0,
    )
    out = llm_rollout(ctx, empty)
    assert batch_len(out) == 0
    assert set(OUTPUT_KEYS) <= set(out.keys())
    assert out[K.PROMPT_IDS].shape == (0, 8) and out[K.RESPONSE_IDS].shape == (0, 5)
    assert strings(out, K.RESPONSE_TEXT) == []


def test_node_registration_and_config_validation():
    node = NODE_TYPES.get("rollout.llm")
    config = node.build_config({"n": 8, "max_response_length": 4})
    assert node.factor(config) == 8
    assert set(node.write_keys(config)) == set(OUTPUT_KEYS)
    assert node.read_keys(config) == (K.PROMPT_TEXT, K.SAMPLE_ID)
    vllm = node.build_config({"backend": "vllm", "vllm": {"memory_fraction": 0.2}})
    assert vllm.vllm.memory_fraction == 0.2 and vllm.vllm.sleep == "auto"
    with pytest.raises(NodeConfigError, match=r"unknown key config.vllm.memory"):
        node.build_config({"backend": "vllm", "vllm": {"memory": 0.2}})
    with pytest.raises(NodeConfigError, match=r"memory_fraction must be in \(0, 1\]"):
        node.build_config({"backend": "vllm", "vllm": {"memory_fraction": 2.0}})
    with pytest.raises(NodeConfigError, match=r"kv_cache_gib must be > 0"):
        node.build_config({"backend": "vllm", "vllm": {"kv_cache_gib": 0}})
    with pytest.raises(NodeConfigError, match="unknown rollout backend 'sglang'"):
        node.build_config({"backend": "sglang"})
    with pytest.raises(NodeConfigError, match="n must be >= 1"):
        node.build_config({"n": 0})
    with pytest.raises(NodeConfigError, match="top_p"):
        node.build_config({"top_p": 0.0})


def test_vllm_memory_args_fix_the_cpu_kv_cache_unless_a_share_is_asked_for():
    # On CPU vLLM's share rule (share of a NUMA node minus the engine's own ~0.75 GiB) left a
    # negative KV cache on a CI machine with 12 GiB nodes, so CPU gets a fixed size.
    gib = 2**30
    assert engine_memory_args(VLLMOptions(), on_cpu=True) == {"kv_cache_memory_bytes": gib}
    assert engine_memory_args(VLLMOptions(), on_cpu=False) == {"gpu_memory_utilization": 0.5}
    share = VLLMOptions(memory_fraction=0.3)
    assert engine_memory_args(share, on_cpu=True) == {"gpu_memory_utilization": 0.3}
    assert engine_memory_args(share, on_cpu=False) == {"gpu_memory_utilization": 0.3}
    explicit = VLLMOptions(memory_fraction=0.3, kv_cache_gib=0.25)
    assert engine_memory_args(explicit, on_cpu=False) == {"kv_cache_memory_bytes": gib // 4}


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv"
)
def test_vllm_backend_without_vllm_names_the_install_script(policy):
    ctx = make_ctx(policy, n=2, max_prompt_length=8, max_response_length=3, backend="vllm")
    with pytest.raises(RuntimeError, match=r"bash scripts/install_vllm.sh.*rollout.backend=hf"):
        NODE_TYPES.get("rollout.llm").setup(ctx)
