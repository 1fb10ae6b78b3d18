"""Numerical faults: a NaN/inf loss or gradient skips the update on every rank, and too many
bad steps in a row stop the run with the last good checkpoint kept.

Unit tests run the real ``actor.train`` / ``critic.train`` nodes on a tiny MLP policy in one
process; the run tests launch the real GRPO job on 2 Ray workers with a ``fault.inject`` node
in ``poison`` mode that writes NaN into one rank's advantages at chosen steps.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict
from tensordict import TensorDict

import embodied_rl.nodes  # noqa: F401  (registers the train, critic and fault nodes)
import policies  # noqa: F401  (registers the mlp policy)
from embodied_rl import keys as K
from embodied_rl.checkpoint import check_weights_only_safe, latest_checkpoint, load_rank_shard
from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.nodes.fault import FaultConfig, poison
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.models import ModelStore, OptimizerConfig
from embodied_rl.training.guard import (
    BAD_STEPS_STATE,
    BadStepCounter,
    NonFiniteTrainingError,
    count_bad_steps,
    guarded_step,
)

CPU = torch.device("cpu")
MLP = {"state_dim": 3, "action_dim": 2, "hidden": [8], "seed": 0}


# --------------------------------------------------------------------------- unit level
def make_ctx(node_type: str, config: dict, models: ModelStore | None, step: int = 0):
    return NodeContext.single_process(
        "train",
        NODE_TYPES.get(node_type).build_config(config),
        models=models,
        step=step,
        device=CPU,
    )


def run_step(node_type: str, ctx: NodeContext, batch: TensorDict, step: int) -> dict[str, float]:
    """One step of a train node on a copy of ``batch``; returns the metrics it logged."""
    ctx.step = step
    NODE_TYPES.get(node_type).fn(ctx, batch.clone())
    return {name: value for name, (value, _, _) in ctx.metrics.pop().items()}


def trajectory_batch(policy: torch.nn.Module) -> TensorDict:
    """B=4 trajectories of T=3 steps with 2 action dims; the policy's own log-probs, offset."""
    gen = torch.Generator().manual_seed(0)
    step_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    batch = TensorDict(
        {
            K.STEP_MASK: step_mask,
            K.RESPONSE_MASK: step_mask.repeat_interleave(2, dim=1),
            K.OBS_STATE: torch.randn(4, 3, 3, generator=gen),
            K.RAW_ACTIONS: torch.randn(4, 3, 2, generator=gen),
        },
        batch_size=[4],
    )
    with torch.no_grad():
        logprobs = policy.evaluate(batch)[0]
    mask = batch[K.RESPONSE_MASK]
    batch[K.OLD_LOGPROBS] = (logprobs - 0.1 * torch.randn(4, 6, generator=gen)) * mask
    batch[K.ADVANTAGES] = torch.randn(4, 6, generator=gen) * mask
    batch[K.VALUES] = torch.zeros(4, 6)
    batch[K.RETURNS] = torch.randn(4, 6, generator=gen) * mask
    return batch


def snapshot(store: ModelStore, name: str) -> tuple[dict, dict]:
    """Deep copies of a model's weights and its optimizer state."""
    return (
        copy.deepcopy(store[name].state_dict()),
        copy.deepcopy(store.optimizer(name).state_dict()),
    )


def assert_same_state(actual, expected) -> None:
    """Recursively equal (tensors bitwise, NaN never equal), e.g. Adam's moments."""
    if isinstance(expected, torch.Tensor):
        assert torch.equal(actual, expected)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_same_state(actual[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same_state(a, e)
    else:
        assert actual == expected


def all_finite(state) -> bool:
    if isinstance(state, torch.Tensor):
        return bool(torch.isfinite(state).all()) if state.is_floating_point() else True
    if isinstance(state, dict):
        return all(all_finite(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return all(all_finite(v) for v in state)
    return True


# (Log-ratios are clamped before exp, so an inf old log-prob alone stays finite; a NaN does not.)
@pytest.mark.parametrize(
    ("key", "value"),
    [(K.ADVANTAGES, math.nan), (K.ADVANTAGES, math.inf), (K.OLD_LOGPROBS, math.nan)],
)
def test_a_skipped_update_leaves_weights_and_adam_state_unchanged(key, value, caplog):
    store = ModelStore({"actor": {"policy": "mlp", "options": MLP}}, CPU)
    batch = trajectory_batch(store["actor"])
    ctx = make_ctx("actor.train", {"inputs": "trajectory", "micro_batch_size": 3}, store)
    clean = run_step("actor.train", ctx, batch, step=0)  # Adam moments are now non-zero
    assert clean["actor/skipped_updates"] == 0 and clean["actor/updates"] == 1
    weights, optim = snapshot(store, "actor")
    assert optim["state"][0]["exp_avg"].abs().sum() > 0

    with caplog.at_level(logging.WARNING, logger="embodied_rl.training.guard"):
        bad = run_step("actor.train", ctx, poison(batch.clone(), key, value), step=1)

    assert "step 1, node 'train': skipped an update" in caplog.text
    assert bad["actor/skipped_updates"] == 1 and bad["actor/updates"] == 0
    assert "actor/grad_norm" not in bad  # no update, no norm to report
    assert not math.isfinite(bad["loss/policy"])  # the poison did reach the loss
    assert_same_state(store["actor"].state_dict(), weights)
    assert_same_state(store.optimizer("actor").state_dict(), optim)
    assert all(p.grad.abs().sum() == 0 for p in store["actor"].parameters())
    assert ctx.state[BAD_STEPS_STATE].consecutive == 1

    after = run_step("actor.train", ctx, batch, step=2)  # a clean step trains again

    assert after["actor/skipped_updates"] == 0 and math.isfinite(after["actor/grad_norm"])
    assert ctx.state[BAD_STEPS_STATE].consecutive == 0
    trained, adam = snapshot(store, "actor")
    assert not torch.equal(trained["trunk.0.weight"], weights["trunk.0.weight"])
    assert all_finite(trained) and all_finite(adam)
    assert int(adam["state"][0]["step"]) == 2  # two real updates, the skipped one not counted


def test_a_non_finite_loss_skips_even_when_the_gradient_is_finite():
    """The loss flag alone decides: a NaN can hide behind zero gradients (e.g. a clip)."""
    store = ModelStore({"actor": {"policy": "mlp", "options": MLP}}, CPU)
    policy, optimizer = store["actor"], store.optimizer("actor")
    batch = trajectory_batch(policy)
    policy.evaluate(batch)[0].sum().backward()
    weights, optim = snapshot(store, "actor")
    ctx = make_ctx("actor.train", {}, store, step=7)

    norm, skipped = guarded_step(ctx, policy, optimizer, max_norm=1.0, loss_finite=False)

    assert skipped and math.isfinite(norm) and norm > 0
    assert_same_state(policy.state_dict(), weights)
    assert_same_state(optimizer.state_dict(), optim)
    norm, skipped = guarded_step(ctx, policy, optimizer, max_norm=1.0, loss_finite=True)
    assert not skipped and norm == 0.0  # the skip zeroed the gradients


def test_critic_train_skips_a_nan_return_update():
    options = {**MLP, "value_head": True}
    store = ModelStore({"critic": {"policy": "mlp", "options": options}}, CPU)
    batch = trajectory_batch(store["critic"])
    ctx = make_ctx("critic.train", {"inputs": "trajectory"}, store)
    weights, optim = snapshot(store, "critic")

    bad = run_step("critic.train", ctx, poison(batch.clone(), K.RETURNS, math.nan), step=0)

    assert bad["critic/skipped_updates"] == 1 and "critic/grad_norm" not in bad
    assert_same_state(store["critic"].state_dict(), weights)
    assert_same_state(store.optimizer("critic").state_dict(), optim)
    good = run_step("critic.train", ctx, batch, step=1)
    assert good["critic/skipped_updates"] == 0 and math.isfinite(good["critic/grad_norm"])
    assert ctx.state[BAD_STEPS_STATE].consecutive == 0


def test_consecutive_bad_steps_stop_a_clean_step_resets_and_zero_disables():
    ctx = make_ctx("actor.train", {}, None)
    for step, skipped in enumerate([1, 0, 1]):  # the clean step 1 resets the count
        ctx.step = step
        count_bad_steps(ctx, "actor", skipped, max_bad_steps=2, model="actor")
    assert ctx.state[BAD_STEPS_STATE].consecutive == 1
    ctx.step = 3
    with pytest.raises(NonFiniteTrainingError) as info:
        count_bad_steps(ctx, "actor", 2, max_bad_steps=2, model="actor")
    message = str(info.value)
    assert "node 'train': 2 consecutive training steps (2..3)" in message
    assert "models.actor.optimizer.lr" in message and "max_bad_steps" in message
    never = make_ctx("actor.train", {}, None)
    for step in range(10):
        never.step = step
        count_bad_steps(never, "actor", 1, max_bad_steps=0, model="actor")
    assert never.state[BAD_STEPS_STATE].consecutive == 10
    # The counter is checkpointed node state: weights_only-safe and restorable.
    state = never.state[BAD_STEPS_STATE].state_dict()
    check_weights_only_safe(state)
    restored = BadStepCounter()
    restored.load_state_dict(state)
    assert restored.consecutive == 10
    with pytest.raises(Exception, match="max_bad_steps must be >= 0"):
        NODE_TYPES.get("actor.train").build_config({"max_bad_steps": -1})


def test_fault_config_steps_ranges_and_checks():
    ranged = FaultConfig(mode="poison", step=3, until_step=5, steps=[1])
    assert [s for s in range(8) if ranged.fires_at(s)] == [1, 3, 4, 5]
    assert math.isnan(ranged.value) and FaultConfig(value="-inf").value == -math.inf
    with pytest.raises(ValueError, match="'nan', 'inf'"):
        FaultConfig(value="many")
    assert [s for s in range(8) if FaultConfig(step=2).fires_at(s)] == [2]
    assert not any(FaultConfig().fires_at(s) for s in range(8))  # step -1: disabled
    with pytest.raises(ValueError, match="until_step"):
        FaultConfig(step=4, until_step=2)
    with pytest.raises(ValueError, match="not a batch key"):
        FaultConfig(mode="poison", key="advantage")
    with pytest.raises(TypeError, match="not a float field"):
        poison(TensorDict({K.GROUP_ID: torch.zeros(2, dtype=torch.long)}, [2]), K.GROUP_ID, 0.0)


# --------------------------------------------------------------------------- real runs
SMALL = ["data.batch_size=4", "rollout.n=4", "ray.poll_interval_s=0.2"]


def poisoned_grpo(run_dir: Path, steps: int, fault: dict, *overrides: str):
    """The GRPO job (2 workers) with a ``fault.inject`` poison node between advantage and
    train; ``fault`` holds the node's rank and steps."""
    cfg = compose(
        "grpo_llm", [*SMALL, f"run_dir={run_dir}", f"trainer.total_steps={steps}", *overrides]
    )
    with open_dict(cfg):
        chaos = {"id": "chaos", "type": "fault.inject", "deps": ["advantage"]}
        chaos["config"] = {"mode": "poison", "key": K.ADVANTAGES, **fault}
        cfg.dag.nodes.append(chaos)
        train = next(n for n in cfg.dag.nodes if n.id == "train")
        train.deps = ["chaos"]
    return cfg


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def shard(ckpt: Path, rank: int) -> dict:
    return load_rank_shard(ckpt, rank, world_size=2)


@pytest.mark.ray
def test_nan_on_one_rank_skips_that_update_on_both_ranks(tmp_path):
    cfg = poisoned_grpo(
        tmp_path,
        3,
        {"rank": 1, "step": 1},
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=3",
    )
    lines = metrics(launch(cfg, show_progress=False).run_dir)

    assert [m["actor/skipped_updates"] for m in lines] == [0, 1, 0]
    assert [m["actor/updates"] for m in lines] == [1, 0, 1]
    assert math.isnan(lines[1]["loss/policy"])  # rank 1's loss was NaN, rank 0's was not
    ckpts = {s: tmp_path / "checkpoints" / f"step_{s:06d}" for s in (1, 3)}
    # The checkpoint due after the bad step is held back (the unit tests above show a skipped
    # update changes neither weights nor Adam state); the next clean step saves again.
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_000001", "step_000003"]
    before = [shard(ckpts[1], rank)["models"] for rank in (0, 1)]
    # Both ranks made the same decisions: identical, finite weights at the end.
    final = [shard(ckpts[3], rank)["models"] for rank in (0, 1)]
    assert_same_state(final[1]["model/actor"], final[0]["model/actor"])
    assert all_finite(final[0])
    trained, untrained = final[0]["model/actor"], before[0]["model/actor"]
    assert any(not torch.equal(trained[k], v) for k, v in untrained.items())  # step 2 trained


@pytest.mark.ray
def test_max_bad_steps_in_a_row_stop_the_run_keeping_the_last_good_checkpoint(tmp_path):
    # Step 1 is bad, step 2 clean (the count resets), steps 3, 4, 5 bad: the stop is at 5.
    # A checkpoint is due after every step, but none is written during a streak: with
    # keep_checkpoints=2 those would push the last good one (after step 2) out.
    cfg = poisoned_grpo(
        tmp_path,
        8,
        {"rank": 0, "steps": [1], "step": 3, "until_step": 5},
        "trainer.checkpoint_every=1",
        "trainer.keep_checkpoints=2",
        "algorithm.actor.max_bad_steps=3",
    )
    with pytest.raises(RunFailed) as info:
        launch(cfg, show_progress=False)

    message = str(info.value)
    assert "during node 'train' at step 5" in message
    assert "NonFiniteTrainingError" in message
    assert "3 consecutive training steps (3..5)" in message
    assert "lower the learning rate" in message
    lines = metrics(tmp_path)
    assert [m["actor/skipped_updates"] for m in lines] == [0, 1, 0, 1, 1]
    ckpt = latest_checkpoint(tmp_path / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000003"  # from before the bad streak
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_000001", "step_000003"]  # none after steps 1, 3 and 4
    weights = [shard(ckpt, rank)["models"] for rank in (0, 1)]
    assert all_finite(weights[0]) and all_finite(weights[1])
    assert_same_state(weights[1]["model/actor"], weights[0]["model/actor"])


def test_lr_warmup_scales_the_first_updates_and_ignores_skipped_ones():
    """optimizer.warmup_steps=4: updates 1, 2, 3 use lr/4, 2lr/4, 3lr/4, then lr. Adam's
    first update moves every weight with a gradient by lr_1 * sign(g) (one-sample moments),
    so the largest weight change of update 1 is exactly lr/4; a skipped update does not
    advance the warmup (it counts Adam's own steps)."""
    lr = 1e-2
    spec = {"policy": "mlp", "options": MLP, "optimizer": {"lr": lr, "warmup_steps": 4}}
    store = ModelStore({"actor": spec}, CPU)
    batch = trajectory_batch(store["actor"])
    ctx = make_ctx("actor.train", {"inputs": "trajectory", "micro_batch_size": 3}, store)
    before, _ = snapshot(store, "actor")

    run_step("actor.train", ctx, batch, step=0)

    after = store["actor"].state_dict()
    moved = max((after[k] - v).abs().max() for k, v in before.items() if v.is_floating_point())
    assert float(moved) == pytest.approx(lr / 4, rel=1e-4)
    lrs = [store.optimizer("actor").param_groups[0]["lr"]]
    run_step("actor.train", ctx, poison(batch.clone(), K.ADVANTAGES, math.nan), step=1)
    for step in range(2, 6):
        run_step("actor.train", ctx, batch, step=step)
        lrs.append(store.optimizer("actor").param_groups[0]["lr"])
    assert lrs == pytest.approx([lr / 4, 2 * lr / 4, 3 * lr / 4, lr, lr])


def test_optimizer_config_refuses_a_negative_warmup():
    with pytest.raises(ValueError, match="warmup_steps must be >= 0"):
        OptimizerConfig(warmup_steps=-1)
    with pytest.raises(ValueError, match="decay_steps must be >= 0"):
        OptimizerConfig(decay_steps=-1)
    with pytest.raises(
        ValueError, match=r"min_lr must be in \[0, 0.001\] \(at most optimizer.lr\)"
    ):
        OptimizerConfig(lr=1e-3, min_lr=2e-3)


def test_cosine_decay_after_the_warmup_by_hand():
    """warmup 2, decay 4, lr 1, min_lr 0.2: updates 1-2 rise (0.5, 1), updates 3-6 follow
    0.2 + 0.8 (1 + cos(pi j / 4)) / 2 for j = 1..4, then 0.2 to the end."""
    cfg = OptimizerConfig(lr=1.0, warmup_steps=2, decay_steps=4, min_lr=0.2)
    half_cos = [(1 + math.cos(math.pi * j / 4)) / 2 for j in (1, 2, 3, 4)]  # .854 .5 .146 0
    expected = [0.5, 1.0] + [0.2 + 0.8 * c for c in half_cos] + [0.2, 0.2]
    assert [cfg.lr_at(done) for done in range(8)] == pytest.approx(expected)
    assert expected[3] == pytest.approx(0.6)  # the midpoint of the decay: halfway to min_lr
    assert [OptimizerConfig(lr=1.0).lr_at(done) for done in (0, 100)] == [1.0, 1.0]
