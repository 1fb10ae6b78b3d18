"""Frames the env rollout keeps for the SRPO encoder and videos: every ``frame_stride``-th step.

The reach task with a camera (``image_size``) returns observation images, so FRAMES come
from them; without a camera they come from ``render()`` (covered by the timing test).
"""

from __future__ import annotations

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

MAX_STEPS = 8


def _rollout(frame_stride: int, rows: int = 2, camera: bool = True):
    """``rows`` (task, init state) rows x 2 episodes on 4 envs; returns the batch and the
    env's task descriptions after it (``""``: an env left out of the last wave's reset)."""
    node = NODE_TYPES.get("rollout.env")
    options = {"image_size": 16 if camera else 0, "render_size": 16}
    cfg = node.build_config(
        {
            "simulator": "reach",
            "simulator_options": options,
            "group_size": 2,
            "num_envs": 4,
            "max_steps": MAX_STEPS,
            "keep_frames": True,
            "frame_stride": frame_stride,
        }
    )
    policy = POLICIES.get("mlp")(
        {"state_dim": 8, "action_dim": 2, "image_size": options["image_size"]},
        torch.device("cpu"),
    )
    ctx = NodeContext.single_process(
        "rollout", cfg, cfg=OmegaConf.create({"seed": 0}), metrics=MetricSink(), seed_fn=lambda _: 7
    )
    node.setup(ctx)
    ctx.models = {"actor": policy}
    batch = make_batch(
        {
            K.TASK_ID: torch.tensor([0, 1][:rows]),
            K.INIT_STATE_ID: torch.tensor([2, 3][:rows]),
            K.SAMPLE_ID: torch.arange(rows),
        }
    )
    env = ctx.state["vector_env"]
    try:
        return node.fn(ctx, batch), env.task_descriptions
    finally:
        env.close()


@pytest.mark.parametrize("stride", [1, 3])
def test_observation_frames_are_kept_every_stride_steps(stride):
    out, _ = _rollout(stride)
    images, frames = out[K.OBS_IMAGE], out[K.FRAMES]
    steps = images.shape[1]
    assert steps == MAX_STEPS  # the reach expert is not run: random policies do not finish
    assert frames.shape == (4, -(-steps // stride), 16, 16, 3)  # ceil(8 / 3) = 3 frames
    for j in range(frames.shape[1]):
        assert torch.equal(frames[:, j], images[:, j * stride])  # frame j shows step j*stride
    if stride == 1:
        assert frames.data_ptr() == images.data_ptr()  # no copy
    finish = out[K.FINISH_STEP]
    assert torch.equal(out[K.FRAME_COUNT], finish // stride + 1)
    # The last valid frame is at or before the last valid step, the next one after it.
    last = (out[K.FRAME_COUNT] - 1) * stride
    assert bool((last <= finish).all()) and bool((last + stride > finish).all())


def test_a_short_wave_leaves_its_spare_envs_out_and_renders_only_its_episodes():
    """2 episodes on 4 envs without a camera (frames from ``render``): the 2 spare envs are
    left out of the reset (not simulated: empty descriptions) and never drawn (drawing one
    raises), and the batch holds the 2 episodes only."""
    out, descriptions = _rollout(1, rows=1, camera=False)
    assert descriptions == ["reach the red target"] * 2 + ["", ""]
    assert out[K.FRAMES].shape == (2, MAX_STEPS, 16, 16, 3)
    assert out[K.PROMPT_TEXT] == ["reach the red target"] * 2
    assert int(out[K.FRAMES][:, 0].float().std()) > 0  # drawn scenes, not the zero rows
