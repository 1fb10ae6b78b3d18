"""The env rollout node splits its wall time into simulation (of which resets) and policy.

Invariants, not speed thresholds: the parts are logged, each is at least the delay a wrapper
adds to every call on its side (so time spent in one is not booked to another), and together
they fit inside the node call's wall time.
"""

from __future__ import annotations

import time

import pytest
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

DELAY_S = 0.004  # added to every policy.act, env.reset, env.step_chunk and env.render call


class DelaysEachCall:
    """The wrapped real object, with ``DELAY_S`` slept before each call of the ``methods``."""

    def __init__(self, inner, *methods: str):
        self.inner, self.calls = inner, dict.fromkeys(methods, 0)

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.calls:
            return attr

        def delayed(*args, **kwargs):
            self.calls[name] += 1
            time.sleep(DELAY_S)
            return attr(*args, **kwargs)

        return delayed


PHASES = ("simulate", "reset", "policy")


@pytest.mark.parametrize("processes", [0, 2])
def test_rollout_logs_simulate_and_policy_seconds_that_fit_in_the_call(processes):
    node = NODE_TYPES.get("rollout.env")
    cfg = node.build_config(
        {
            "simulator": "reach",
            "simulator_options": {"render_size": 16},
            "group_size": 3,  # 6 episodes on 4 envs: two waves, the second padded
            "num_envs": 4,
            "processes": processes,
            "max_steps": 8,
            "keep_frames": True,  # state-only reach: frames come from env.render()
            "frame_stride": 2,
        }
    )
    policy = POLICIES.get("mlp")({"state_dim": 8, "action_dim": 2}, torch.device("cpu"))
    sink = MetricSink()
    ctx = NodeContext.single_process(
        "rollout", cfg, cfg=OmegaConf.create({"seed": 0}), metrics=sink, seed_fn=lambda tag: 7
    )
    node.setup(ctx)
    env = DelaysEachCall(ctx.state["vector_env"], "reset", "step_chunk", "render")
    ctx.state["vector_env"] = env
    slow_policy = DelaysEachCall(policy, "act")
    ctx.models = {"actor": slow_policy}
    batch = make_batch(
        {
            K.TASK_ID: torch.tensor([0, 1]),
            K.INIT_STATE_ID: torch.tensor([2, 3]),
            K.SAMPLE_ID: torch.tensor([0, 1]),
        }
    )
    try:
        started = time.perf_counter()
        out = node.fn(ctx, batch)
        total = time.perf_counter() - started
    finally:
        env.inner.close()
    metrics = sink.pop()
    records = {phase: metrics[f"time/rollout/{phase}"] for phase in PHASES}
    assert {reduce for _, _, reduce in records.values()} == {"max"}  # as the node's own time
    simulate, reset, policy_s = (records[phase][0] for phase in PHASES)
    assert len(out) == 6 and out[K.FRAMES].shape[1] == 4  # the frames were rendered
    # 2 waves x 8 steps (chunk 1), a frame every 2nd step
    assert env.calls == {"reset": 2, "step_chunk": 2 * 8, "render": 2 * 4}
    assert slow_policy.calls == {"act": 2 * 8}
    assert policy_s >= 16 * DELAY_S
    assert reset >= 2 * DELAY_S
    assert simulate - reset >= (16 + 8) * DELAY_S  # steps and renders, not booked as resets
    assert simulate + policy_s <= total
