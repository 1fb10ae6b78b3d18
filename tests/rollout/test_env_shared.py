"""A worker's rollout nodes with the same simulator settings share one vector env (the training
and the evaluation rollout: a LIBERO env holds a lot of memory), without changing any episode."""

from __future__ import annotations

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

NODE = NODE_TYPES.get("rollout.env")
SIMULATOR = {"simulator": "reach", "simulator_options": {"image_size": 16, "render_size": 16}}
TRAIN = {**SIMULATOR, "group_size": 2, "num_envs": 4, "max_steps": 6, "temperature": 1.3}
EVAL = {**SIMULATOR, "group_size": 1, "num_envs": 4, "max_steps": 6, "do_sample": False}


def _context(name: str, options: dict, shared: dict) -> NodeContext:
    cfg = NODE.build_config(options)
    ctx = NodeContext.single_process(
        name,
        cfg,
        cfg=OmegaConf.create({"seed": 0}),
        metrics=MetricSink(),
        seed_fn=lambda _: 11,
        shared=shared,
    )
    NODE.setup(ctx)
    ctx.models = {
        "actor": POLICIES.get("mlp")(
            {"state_dim": 8, "action_dim": 2, "image_size": 16}, torch.device("cpu")
        )
    }
    return ctx


def _rows(tasks: list[int], inits: list[int]):
    return make_batch(
        {
            K.TASK_ID: torch.tensor(tasks),
            K.INIT_STATE_ID: torch.tensor(inits),
            K.SAMPLE_ID: torch.arange(len(tasks)),
        }
    )


def test_training_and_evaluation_rollouts_share_one_env_and_episodes_stay_the_same():
    shared: dict = {}
    train = _context("rollout", TRAIN, shared)
    evaluation = _context("eval_rollout", EVAL, shared)
    other = _context("other", {**TRAIN, "num_envs": 3}, shared)
    alone = _context("rollout", TRAIN, {})  # a worker without an evaluation DAG
    envs = [ctx.state["vector_env"] for ctx in (train, evaluation, other, alone)]
    try:
        assert envs[0] is envs[1]  # same simulator, options, env count and processes
        assert envs[2] is not envs[0] and envs[3] is not envs[0]
        assert len(shared) == 2

        batch = _rows([0, 1], [2, 3])
        expected = NODE.fn(alone, batch.clone())
        NODE.fn(evaluation, _rows([3, 2, 1, 0], [5, 6, 7, 8]))  # other tasks and init states
        got = NODE.fn(train, batch.clone())
        for key in (K.OBS_STATE, K.OBS_IMAGE, K.RAW_ACTIONS, K.OLD_LOGPROBS, K.STEP_MASK):
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
        assert got[K.OBS_STATE].abs().sum() > 0  # the episodes ran
    finally:
        for env in envs:
            env.close()  # idempotent: the shared env is closed by both of its nodes
