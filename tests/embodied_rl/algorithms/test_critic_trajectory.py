"""Trajectory mode of the critic nodes: per-step values expanded to the token layout, GAE on it
by hand, and critic.values / critic.train with an MLP value head."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import embodied_rl.nodes  # noqa: F401  (registers critic.values, advantage.gae, critic.train)
import policies  # noqa: F401  (registers the mlp policy)
from embodied_rl import keys as K
from embodied_rl.algorithms.gae import gae
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.critic import step_values_to_tokens
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.runtime.models import ModelStore

CPU = torch.device("cpu")
CRITIC_SPEC = {
    "critic": {
        "policy": "mlp",
        "options": {"state_dim": 3, "action_dim": 2, "hidden": [8], "value_head": True},
        "optimizer": {"lr": 1e-2, "grad_clip": 1.0},
    }
}


def make_ctx(node_type: str, config: dict, models: ModelStore | None = None) -> NodeContext:
    return NodeContext(
        cfg=None,
        node_id=node_type,
        node_config=NODE_TYPES.get(node_type).build_config(config),
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models=models,
        state={},
        step=0,
        metrics=MetricSink(),
        device=CPU,
        run_dir=Path("."),
    )


def trajectory_batch() -> TensorDict:
    """B=2 trajectories, T=3 steps, K=2 tokens: row 0 has 3 valid steps, row 1 has 2."""
    step_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    states = torch.arange(18, dtype=torch.float32).reshape(2, 3, 3) / 10.0
    return TensorDict(
        {
            K.STEP_MASK: step_mask,
            K.RESPONSE_MASK: step_mask.repeat_interleave(2, dim=1),
            K.OBS_STATE: states * step_mask.unsqueeze(-1),
            K.RAW_ACTIONS: torch.zeros(2, 3, 2),
            K.TOKEN_REWARDS: torch.tensor([[0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0.5, 0, 0]]),
        },
        batch_size=[2],
    )


def test_step_values_repeat_over_each_steps_tokens_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    expected = torch.tensor([[1.0, 1.0, 2.0, 2.0, 3.0, 3.0], [4.0, 4.0, 5.0, 5.0, 0.0, 0.0]])
    assert torch.equal(step_values_to_tokens(values, mask), expected)
    three = step_values_to_tokens(values[:1, :2], torch.ones(1, 6))  # K = 3
    assert torch.equal(three, torch.tensor([[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]]))
    with pytest.raises(ValueError, match="do not tile"):
        step_values_to_tokens(values, torch.ones(2, 7))


def test_token_gae_on_repeated_values_is_step_gae_with_lam_to_the_k():
    # One trajectory, T=2 steps, K=2 tokens, V = (0.2, 0.6), success 1 on the last token.
    values = step_values_to_tokens(torch.tensor([[0.2, 0.6]]), torch.ones(1, 4))
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    lam = 0.5
    adv, ret = gae(rewards, values, torch.ones(1, 4), gamma=1.0, lam=lam)
    # Step deltas: d1 = 1 - 0.6 = 0.4, d0 = 0 + 0.6 - 0.2 = 0.4; inner deltas are 0.
    step1, step0 = 0.4, 0.4 + lam**2 * 0.4  # step-level GAE with lam_step = lam^K = 0.25
    assert torch.allclose(adv, torch.tensor([[lam * step0, step0, lam * step1, step1]]))
    assert torch.allclose(ret, adv + values)
    # lam = 1: every token of a step gets the Monte-Carlo return minus V(s_t).
    adv1, _ = gae(rewards, values, torch.ones(1, 4), gamma=1.0, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[0.8, 0.8, 0.4, 0.4]]))


def test_critic_values_node_expands_the_mlp_value_head():
    models = ModelStore(CRITIC_SPEC, CPU)
    batch = trajectory_batch()
    ctx = make_ctx("critic.values", {"inputs": "trajectory", "micro_batch_size": 1}, models)
    out = NODE_TYPES.get("critic.values").fn(ctx, batch.clone())
    with torch.no_grad():
        steps = models["critic"].values(batch)
    assert steps.shape == (2, 3) and steps[1, 2] == 0.0
    assert torch.equal(out[K.VALUES], steps.repeat_interleave(2, dim=1))
    assert out[K.VALUES][1, 4:].abs().sum() == 0.0


def test_critic_train_trajectory_matches_a_per_step_reference():
    models = ModelStore(CRITIC_SPEC, CPU)
    reference = ModelStore(CRITIC_SPEC, CPU)["critic"]
    batch = trajectory_batch()
    values_ctx = make_ctx("critic.values", {"inputs": "trajectory"}, models)
    batch = NODE_TYPES.get("critic.values").fn(values_ctx, batch)
    gae_ctx = make_ctx("advantage.gae", {"gamma": 1.0, "lam": 1.0, "whiten": False})
    batch = NODE_TYPES.get("advantage.gae").fn(gae_ctx, batch)
    config = {"inputs": "trajectory", "cliprange_value": 10.0}
    train_ctx = make_ctx("critic.train", config, models)
    NODE_TYPES.get("critic.train").fn(train_ctx, batch)
    # Reference: per-step regression onto the per-step returns (the first token of each step),
    # mean over valid steps = token-mean over the K-fold repeated tokens.
    step_mask = batch[K.STEP_MASK]
    step_returns = batch[K.RETURNS][:, ::2]
    loss = 0.5 * ((reference.values(batch) - step_returns) ** 2 * step_mask).sum() / step_mask.sum()
    assert train_ctx.metrics.records["critic/value_loss"][0] == pytest.approx(loss.item(), rel=1e-5)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.0).step()
    trained = dict(models["critic"].named_parameters())
    for name, param in reference.named_parameters():
        assert torch.allclose(param, trained[name], atol=1e-6), name


def test_trajectory_reads_and_bad_inputs():
    assert NODE_TYPES.get("critic.values").reads(
        NODE_TYPES.get("critic.values").build_config({"inputs": "trajectory"})
    ) == (K.STEP_MASK, K.RESPONSE_MASK)
    with pytest.raises(ValueError, match="inputs"):
        NODE_TYPES.get("critic.train").build_config({"inputs": "pixels"})
