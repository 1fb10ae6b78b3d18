"""PPO with a learned MLP critic on the fast MuJoCo reach task: 2 workers on Ray."""

from __future__ import annotations

import json
import math

import pytest
import torch

from embodied_rl.checkpoint import latest_checkpoint, load_rank_shard
from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import compose
from tests.embodied_rl.runtime.ppo_metrics import (
    ONE_CRITIC_UPDATE,
    assert_value_loss_is_half_the_mean_squared_advantage,
)

pytestmark = pytest.mark.ray


def test_ppo_reach_trains_the_critic_and_keeps_ranks_equal(tmp_path):
    overrides = [
        "trainer.total_steps=2",
        "trainer.checkpoint_every=2",
        "data.batch_size=4",
        "rollout.group_size=4",
        "rollout.num_envs=8",
        "eval.at_end=false",
        "eval.every=0",
        *ONE_CRITIC_UPDATE,  # the actor keeps its 4 epochs x 2 mini-batches
        f"run_dir={tmp_path}",
    ]
    result = launch(compose("ppo_reach", overrides), show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        for key in ("critic/value_loss", "critic/grad_norm", "loss/policy"):
            assert math.isfinite(m[key]), (key, m)
        assert_value_loss_is_half_the_mean_squared_advantage(m)
        # lam < 1: returns mix 0/1 successes with small values (V can be < 0 early on).
        assert abs(m["critic/returns_mean"]) <= 1.0
        assert abs(m["critic/values_mean"]) <= 1.0
    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    shards = [load_rank_shard(ckpt, r, world_size=2)["models"] for r in (0, 1)]
    critic = shards[0]["model/critic"]
    assert "value.weight" in critic
    for name, value in critic.items():  # the gradient all-reduce kept the ranks equal
        assert torch.equal(value, shards[1]["model/critic"][name]), name
