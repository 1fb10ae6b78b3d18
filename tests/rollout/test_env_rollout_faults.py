"""A simulator process killed in the middle of a rollout: the batch is complete and counted."""

from __future__ import annotations

import os
import signal

import torch
from omegaconf import OmegaConf

import embodied_rl.nodes  # noqa: F401
import policies  # noqa: F401
import rollout  # noqa: F401
import simulators  # noqa: F401
from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.registry import NODE_TYPES, POLICIES
from embodied_rl.runtime.context import MetricSink, NodeContext


class KillsAChildOnce:
    """The real MLP policy; on its 10th ``act`` it SIGKILLs one simulator process."""

    def __init__(self, policy, env):
        self.policy, self.env, self.calls = policy, env, 0

    def act(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 10:
            os.kill(self.env.child_pids()[1], signal.SIGKILL)
        return self.policy.act(*args, **kwargs)


def _rollout(kill: bool):
    node = NODE_TYPES.get("rollout.env")
    cfg = node.build_config(
        {"simulator": "reach", "group_size": 2, "num_envs": 4, "processes": 2, "keep_frames": False}
    )
    policy = POLICIES.get("mlp")({"state_dim": 8, "action_dim": 2}, torch.device("cpu"))
    sink = MetricSink()
    ctx = NodeContext.single_process(
        "rollout", cfg, cfg=OmegaConf.create({"seed": 0}), metrics=sink, seed_fn=lambda tag: 7
    )
    node.setup(ctx)
    env = ctx.state["vector_env"]
    ctx.models = {"actor": KillsAChildOnce(policy, env) if kill else policy}
    batch = make_batch(
        {
            K.TASK_ID: torch.tensor([0, 1]),
            K.INIT_STATE_ID: torch.tensor([2, 3]),
            K.SAMPLE_ID: torch.tensor([0, 1]),
        }
    )
    try:
        return node.fn(ctx, batch), sink.pop()
    finally:
        env.close()


def test_killed_simulator_is_restarted_and_the_rollout_is_unchanged():
    clean, clean_metrics = _rollout(kill=False)
    disturbed, metrics = _rollout(kill=True)
    assert len(disturbed) == 4  # the full batch
    for key in (K.OBS_STATE, K.STEP_MASK, K.OLD_LOGPROBS, K.SUCCESS, K.RAW_ACTIONS):
        assert torch.equal(disturbed[key], clean[key]), key
    assert metrics["sim/restarts"][0] == 1 and metrics["sim/crashes"][0] == 1
    assert clean_metrics["sim/restarts"][0] == 0
