"""OpenVLA-OFT with two images per step (``num_images_in_input: 2``, the OFT LIBERO
fine-tunes): agentview then wrist, each through the vision towers, 2 x P image tokens; the
demonstrations and rollouts carry the wrist camera (OBS_WRIST_IMAGE) to it."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

import embodied_rl.nodes  # noqa: F401
import rollout  # noqa: F401
import simulators  # noqa: F401
from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_loader import DemoLoader, resize_frames, select_demos
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import compose, validate_config
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.context import MetricSink, NodeContext
from policies.openvla_oft import OpenVLAOFTPolicy, build_openvla_oft
from policies.openvla_oft.published import check_checkpoint_options
from tests.embodied_rl.synthetic_demos import write_synthetic_demos
from tests.simulators.libero_common import INIT as LIBERO_INIT
from tests.simulators.libero_common import OPTIONS as LIBERO_OPTIONS
from tests.simulators.libero_common import TASK as LIBERO_TASK
from tests.simulators.libero_common import requires_libero

CPU = torch.device("cpu")
INSTRUCTIONS = ["put the bowl on the plate", "open the top drawer"]
TWO = {"seed": 0, "micro_batch_size": 2, "num_images_in_input": 2, "chunk": 2}


@pytest.fixture(scope="module")
def two_cameras() -> OpenVLAOFTPolicy:
    return build_openvla_oft(TWO, CPU)


@pytest.fixture(scope="module")
def continuous_two_cameras() -> OpenVLAOFTPolicy:
    options = {**TWO, "use_continuous_head": True, "use_proprio": True}
    return build_openvla_oft(options, CPU)


def views(n: int, seed: int) -> np.ndarray:
    """(n, 2, 40, 40, 3) uint8: agentview, then wrist."""
    return np.random.default_rng(seed).integers(0, 256, (n, 2, 40, 40, 3), dtype=np.uint8)


def states(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)


def test_the_image_tokens_are_each_cameras_tokens_agentview_first(two_cameras):
    images = views(3, 0)
    tokens = two_cameras.image_tokens(images)
    vla = two_cameras.vla
    agent = vla.image_tokens(two_cameras.pixel_values(images[:, 0]))
    wrist = vla.image_tokens(two_cameras.pixel_values(images[:, 1]))
    patches = agent.shape[1]
    assert tokens.shape == (3, 2 * patches, agent.shape[2])
    assert torch.equal(tokens, torch.cat([agent, wrist], dim=1))


def test_the_wrist_image_changes_the_outputs_and_the_order_matters(two_cameras):
    images = views(2, 1)

    def scores(observations: np.ndarray) -> torch.Tensor:  # greedy tokens' log-probs (2, K)
        greedy = {"temperature": 1.0, "do_sample": False}
        return two_cameras.act(observations, INSTRUCTIONS, None, **greedy).logprobs

    base = scores(images)
    other_wrist = images.copy()
    other_wrist[:, 1] = views(2, 2)[:, 1]
    assert (scores(other_wrist) - base).abs().max() > 1e-4
    assert (scores(images[:, ::-1].copy()) - base).abs().max() > 1e-4
    assert torch.equal(scores(images), base)


def test_one_camera_given_to_a_two_camera_policy_is_refused(two_cameras):
    with pytest.raises(ValueError, match=r"reads 2 cameras \['agentview', 'wrist'\]"):
        two_cameras.act(views(2, 0)[:, 0], INSTRUCTIONS, None, temperature=1.0, do_sample=False)


def _trajectories(images: np.ndarray, state: np.ndarray, key: str, stored) -> TensorDict:
    """B=2 trajectories of T=2 steps, step 1 of the second masked: observations 0, 1 | 2."""
    n = len(images)
    index = [(0, 0), (0, 1), (1, 0)][:n]
    agent = torch.zeros(2, 2, *images.shape[2:], dtype=torch.uint8)
    wrist = torch.zeros_like(agent)
    proprio = torch.zeros(2, 2, state.shape[1])
    targets = torch.zeros(2, 2, stored.shape[1], dtype=stored.dtype)
    for i, (b, t) in enumerate(index):
        agent[b, t], wrist[b, t] = torch.from_numpy(images[i, 0]), torch.from_numpy(images[i, 1])
        proprio[b, t], targets[b, t] = torch.from_numpy(state[i]), stored[i]
    batch = TensorDict(
        {
            K.OBS_IMAGE: agent,
            K.OBS_WRIST_IMAGE: wrist,
            K.OBS_STATE: proprio,
            key: targets,
            K.STEP_MASK: torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        },
        batch_size=[2],
    )
    batch[K.PROMPT_TEXT] = INSTRUCTIONS
    return batch


@pytest.mark.parametrize("head", ["tokens", "continuous"])
def test_evaluate_reads_the_wrist_camera_and_reproduces_act(
    two_cameras, continuous_two_cameras, head
):
    policy = two_cameras if head == "tokens" else continuous_two_cameras
    images, state = views(3, 3), states(3, 0)
    prompts = [INSTRUCTIONS[0], INSTRUCTIONS[0], INSTRUCTIONS[1]]
    torch.manual_seed(0)
    out = policy.act(images, prompts, state, temperature=1.3, do_sample=True)
    stored = out.tokens if head == "tokens" else out.raw_actions
    batch = _trajectories(images, state, policy.score_key, stored)
    logprobs, _ = policy.evaluate(batch, 1.3)
    steps = logprobs.reshape(2, 2, -1)
    recomputed = torch.stack([steps[0, 0], steps[0, 1], steps[1, 0]])
    assert torch.allclose(recomputed, out.logprobs, atol=1e-5)
    assert bool((steps[1, 1] == 0).all())
    # Without the wrist images the batch is refused, naming the setting that records them.
    del batch[K.OBS_WRIST_IMAGE]
    with pytest.raises(KeyError, match=r"data.cameras=\['agentview', 'wrist'\]"):
        policy.evaluate(batch, 1.3)


def test_a_saved_two_camera_model_records_it_and_reloads_only_with_two(two_cameras, tmp_path):
    folder = two_cameras.save_pretrained(tmp_path / "two")
    assert json.loads((folder / "config.json").read_text())["num_images_in_input"] == 2
    with pytest.raises(ConfigError, match=r"set \+\+models.actor.options.num_images_in_input=2"):
        check_checkpoint_options({"preset": None, "path": str(folder)})
    reloaded = build_openvla_oft({**TWO, "preset": None, "path": str(folder)}, CPU)
    images = views(2, 4)
    greedy = {"temperature": 1.0, "do_sample": False}
    assert torch.equal(
        reloaded.act(images, INSTRUCTIONS, None, **greedy).tokens,
        two_cameras.act(images, INSTRUCTIONS, None, **greedy).tokens,
    )


def test_inspect_prints_the_overrides_that_run_a_two_camera_checkpoint(
    two_cameras, tmp_path, capsys
):
    from embodied_rl.cli import main

    folder = two_cameras.save_pretrained(tmp_path / "two")
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "images per step  2 (agentview + wrist" in out
    overrides = out.strip().splitlines()[-1].split()
    assert "++models.actor.options.num_images_in_input=2" in overrides
    assert "simulator.options.cameras=[agentview,wrist]" in overrides
    chunk = f"++models.actor.options.chunk={TWO['chunk']}"
    cfg = compose("srpo_libero", [*overrides, chunk])
    validate_config(cfg)  # the printed overrides are accepted, and give the policy its wrist
    assert list(cfg.simulator.options.cameras) == ["agentview", "wrist"]


def test_the_demo_loader_gives_each_camera_its_own_frames(tmp_path):
    folder = write_synthetic_demos(tmp_path, length=6, size=16)
    infos = select_demos([str(folder)], None, heldout_every=5)
    options = {"chunk": 2, "image_size": 8, "global_batch_size": 24, "dp_rank": 0, "dp_size": 1}
    loader = DemoLoader(infos, cameras=["agentview", "wrist"], seed=3, shuffle=False, **options)
    batch = loader.next_batch()  # every row once, demo-major
    assert batch[K.OBS_WRIST_IMAGE].shape == batch[K.OBS_IMAGE].shape == (24, 1, 8, 8, 3)
    first = load_demo(infos[0], cameras=("agentview", "wrist")).images
    for camera, key in (("agentview", K.OBS_IMAGE), ("wrist", K.OBS_WRIST_IMAGE)):
        expected = torch.from_numpy(resize_frames(first[camera], 8))
        assert torch.equal(batch[key][:6, 0], expected)
    assert not torch.equal(batch[K.OBS_IMAGE], batch[K.OBS_WRIST_IMAGE])  # inverted frames
    # One camera: the same agentview rows as before, and no wrist key.
    single = DemoLoader(infos, cameras=["agentview"], seed=3, shuffle=False, **options)
    alone = single.next_batch()
    assert K.OBS_WRIST_IMAGE not in alone.keys()
    assert torch.equal(alone[K.OBS_IMAGE], batch[K.OBS_IMAGE])
    with pytest.raises(ValueError, match=r"cameras \['wrist'\]: a policy reads none"):
        DemoLoader(infos, cameras=["wrist"], seed=3, **options)


def test_validate_refuses_demos_or_rollouts_without_the_wrist_a_policy_reads(tmp_path):
    demos = [f"data.paths=[{write_synthetic_demos(tmp_path, size=64)}]"]
    two = [*demos, "++models.actor.options.num_images_in_input=2"]
    both = "[agentview,wrist]"
    with pytest.raises(ConfigError, match=r"Fix: set data.cameras=\[agentview,wrist\]"):
        validate_config(compose("sft_libero", [*two, f"simulator.options.cameras={both}"]))
    with pytest.raises(ConfigError, match=r"Fix: set simulator.options.cameras=\[agentview,wri"):
        validate_config(compose("sft_libero", [*two, f"data.cameras={both}"]))
    cameras = [*two, f"data.cameras={both}", f"simulator.options.cameras={both}"]
    validate_config(compose("sft_libero", cameras))
    validate_config(compose("sft_libero", [*cameras, "rollout.processes=2"]))
    with pytest.raises(ConfigError, match=r"reads \['agentview'\]"):
        validate_config(compose("sft_libero", [*demos, f"data.cameras={both}"]))


@pytest.mark.libero
@requires_libero
def test_a_libero_rollout_records_the_wrist_images_the_policy_acted_on(two_cameras):
    """Two LIBERO episodes of 2 policy steps: OBS_WRIST_IMAGE is recorded beside OBS_IMAGE,
    and ``evaluate`` on the rollout's batch gives back its log-probs (the images it stored
    are the ones ``act`` saw)."""
    node = NODE_TYPES.get("rollout.env")
    options = {"simulator": "libero", "simulator_options": LIBERO_OPTIONS, "num_envs": 2}
    cfg = node.build_config({**options, "group_size": 2, "max_steps": 2, "temperature": 1.3})
    ctx = NodeContext.single_process(
        "rollout", cfg, cfg=OmegaConf.create({"seed": 0}), metrics=MetricSink(), seed_fn=lambda _: 3
    )
    node.setup(ctx)
    ctx.models = {"actor": two_cameras}
    rows = make_batch(
        {
            K.TASK_ID: torch.tensor([LIBERO_TASK]),
            K.INIT_STATE_ID: torch.tensor([LIBERO_INIT]),
            K.SAMPLE_ID: torch.tensor([0]),
        }
    )
    try:
        out = node.fn(ctx, rows)
    finally:
        ctx.state["vector_env"].close()
    agent, wrist = out[K.OBS_IMAGE], out[K.OBS_WRIST_IMAGE]
    assert wrist.shape == agent.shape and wrist.shape[:2] == (2, 2)
    assert not torch.equal(wrist, agent)
    logprobs, _ = two_cameras.evaluate(out, 1.3)
    mask = out[K.RESPONSE_MASK] > 0
    assert torch.allclose(logprobs[mask], out[K.OLD_LOGPROBS][mask], atol=1e-4)
