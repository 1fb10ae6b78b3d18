"""The real ``actor.train`` node on a tiny causal LM: logged losses against a loop reference.

The old log-probs are the policy's own minus chosen offsets, so every token's ratio is known
exactly (``r = exp(offset)``); the reference below recomputes each loss token by token from
the formulas in docs/ALGORITHMS.md ("Policy losses").
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.layout import Layout
from embodied_rl.nodes import actor as _registers_train_node  # noqa: F401
from embodied_rl.registry import NODE_TYPES, POLICIES, load_plugins
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.runtime.models import ModelStore

OFFSETS = [[0.5, -0.5, 0.1], [1.2, 0.05, 0.0], [-0.4, 0.3, -1.0], [0.2, 0.0, 0.0]]
ADVANTAGES = [[1.0, -1.0, 2.0], [-1.0, 0.5, 0.0], [-2.0, -0.5, 1.0], [0.7, 0.0, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]]


@pytest.fixture(scope="module")
def setup():
    load_plugins(["policies"])
    assert "causal_lm" in POLICIES
    digits = [str(d) for d in range(10)]
    spec = {"policy": "causal_lm", "options": {"seed": 0, "allowed_response_tokens": digits}}
    store = ModelStore({"actor": {**spec, "optimizer": {"lr": 1e-2}}}, torch.device("cpu"))
    policy = store["actor"]
    policy.model.get_input_embeddings().weight.requires_grad_(False)  # speed (see dp test)
    initial = copy.deepcopy(store.state_dict())
    prompts = [policy.tokenizer(p)["input_ids"] for p in ["1+1=", "2+3=", "7-2=", "4+4="]]
    width = max(len(p) for p in prompts)
    pad = policy.pad_token_id
    mask = torch.tensor(MASK, dtype=torch.float32)
    digit_ids = policy.allowed_ids[:-1]
    responses = torch.where(mask > 0, digit_ids[torch.tensor([[1, 2, 3]] * 4)], pad)
    batch = make_batch(
        {
            K.PROMPT_IDS: torch.tensor([[pad] * (width - len(p)) + p for p in prompts]),
            K.PROMPT_MASK: torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
            K.RESPONSE_IDS: responses,
            K.RESPONSE_MASK: mask,
        }
    )
    with torch.no_grad():
        logprobs = policy.evaluate(batch)[0]
    batch[K.OLD_LOGPROBS] = (logprobs - torch.tensor(OFFSETS)) * mask
    batch[K.ADVANTAGES] = torch.tensor(ADVANTAGES) * mask
    return store, initial, batch


def train_metrics(setup, **options) -> dict[str, float]:
    store, initial, batch = setup
    store.load_state_dict(initial)
    node = NODE_TYPES.get("actor.train")
    ctx = NodeContext(
        cfg=None,
        node_id="train",
        node_config=node.build_config({"micro_batch_size": 2, **options}),
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models=store,
        state={},
        step=0,
        metrics=MetricSink(),
        device=torch.device("cpu"),
        run_dir=Path("."),
    )
    node.fn(ctx, batch.clone())
    return {name: value for name, (value, _, _) in ctx.metrics.pop().items()}


def valid_tokens():
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                yield i, t


def test_ppo_clip_higher_dual_clip_metrics_match_a_token_loop(setup):
    metrics = train_metrics(
        setup, clip_ratio_low=0.2, clip_ratio_high=0.28, dual_clip_c=2.0, loss_agg_mode="token-mean"
    )
    losses, ratios, clipped, dual = [], [], 0, 0
    for i, t in valid_tokens():
        r, a = math.exp(OFFSETS[i][t]), ADVANTAGES[i][t]
        unclipped, clip = -r * a, -min(max(r, 0.8), 1.28) * a
        loss = max(unclipped, clip)
        clipped += clip > unclipped
        if a < 0 and loss > -2.0 * a:
            loss, dual = -2.0 * a, dual + 1
        losses.append(loss)
        ratios.append(r)
    n = len(losses)
    assert dual == 1  # r = e^1.2 = 3.32 with A = -1
    assert metrics["loss/policy"] == pytest.approx(sum(losses) / n, rel=1e-5)
    assert metrics["actor/ratio_mean"] == pytest.approx(sum(ratios) / n, rel=1e-5)
    assert metrics["actor/clip_fraction"] == pytest.approx(clipped / n)
    assert metrics["actor/dual_clip_fraction"] == pytest.approx(dual / n)
    assert metrics["actor/updates"] == 1


def test_gspo_metrics_match_a_sequence_loop(setup):
    metrics = train_metrics(
        setup,
        ratio_level="sequence",
        loss_agg_mode="seq-mean-token-mean",
        clip_ratio_low=0.1,
        clip_ratio_high=0.1,
    )
    losses, ratio_sum = [], 0.0
    for i, row in enumerate(MASK):
        valid = [t for t, m in enumerate(row) if m]
        s = math.exp(sum(OFFSETS[i][t] for t in valid) / len(valid))
        a = sum(ADVANTAGES[i][t] for t in valid) / len(valid)
        losses.append(max(-s * a, -min(max(s, 0.9), 1.1) * a))
        ratio_sum += s * len(valid)
    assert metrics["loss/policy"] == pytest.approx(sum(losses) / len(MASK), rel=1e-5)
    assert metrics["actor/ratio_mean"] == pytest.approx(ratio_sum / 9, rel=1e-5)  # 9 tokens


def test_cpgd_and_dr_grpo_norm_metrics_match_a_token_loop(setup):
    metrics = train_metrics(
        setup, policy_loss="cpgd", cpgd_drift_coef=0.5, loss_agg_mode="seq-mean-token-sum-norm"
    )
    lo, hi = math.log(0.8), math.log(1.2)
    loss_sum = drift_sum = 0.0
    for i, t in valid_tokens():
        log_r, a = OFFSETS[i][t], ADVANTAGES[i][t]
        loss_sum += -min(a * log_r, a * min(max(log_r, lo), hi))
        drift_sum += math.exp(log_r) - 1 - log_r
    # Dr. GRPO: token sums / (4 sequences * R = 3).
    assert metrics["loss/policy"] == pytest.approx(loss_sum / 12, rel=1e-5)
    assert metrics["loss/cpgd_drift"] == pytest.approx(drift_sum / 12, rel=1e-5)
