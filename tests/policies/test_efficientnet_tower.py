"""The ``tiny_libero_effnet`` VLA preset: a frozen ImageNet EfficientNet-Lite0 vision tower
(``policies/openvla/efficientnet_tower.py``) under tiny_libero's LM, through OpenVLA-OFT."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import json

import numpy as np
import pytest
import torch

import policies  # noqa: F401  (registers the policies)
from embodied_rl import keys as K
from policies.encoders.efficientnet_lite import load_efficientnet_lite0, preprocess
from policies.openvla.configuration import EFFICIENTNET_LITE0, VLAArchitecture
from policies.openvla.efficientnet_tower import EfficientNetBackbone
from policies.openvla.loading import architecture_from_config, architecture_to_config
from policies.openvla.vision import images_to_float
from policies.openvla_oft import OpenVLAOFTPolicy, build_openvla_oft
from policies.openvla_oft.configuration import OpenVLAOFTConfig
from tests.policies.test_openvla_oft import INSTRUCTIONS, images, prompts, states, trajectories

CPU = torch.device("cpu")
OPTIONS = {
    "preset": "tiny_libero_effnet",
    "seed": 0,
    "use_continuous_head": True,
    "use_proprio": True,
    "chunk": 8,
}


@pytest.fixture(scope="module")
def policy() -> OpenVLAOFTPolicy:
    return build_openvla_oft(OPTIONS, CPU)


def test_tokens_are_the_pretrained_network_at_stride_16(policy: OpenVLAOFTPolicy) -> None:
    tower = policy.vla.vision_backbone
    assert isinstance(tower, EfficientNetBackbone)
    assert (tower.image_size, tower.num_patches, tower.embed_dim) == (64, 16, 112)
    pixels = policy.pixel_values(images(3, 0))  # 40 px: resized to 64 px (and cropped)
    with torch.no_grad():
        tokens = tower(pixels)
    # Reference: the encoder module's own network, run layer by layer on the same pixels up
    # to the last 112-channel block (stem stride 2, then stages of stride 1, 2, 2, 2, 1).
    network = load_efficientnet_lite0(CPU)
    last = [i for i, block in enumerate(network._blocks) if block._bn2.num_features == 112][-1]
    assert last == 10 and network._blocks[last + 1]._bn2.num_features == 192
    with torch.no_grad():
        x = torch.nn.functional.relu6(network._bn0(network._conv_stem(pixels)))
        for block in network._blocks[: last + 1]:
            x = block(x)
    assert x.shape == (3, 112, 4, 4)
    assert tokens.shape == (3, 16, 112)
    assert torch.equal(tokens, x.permute(0, 2, 3, 1).reshape(3, 16, 112))  # row-major grid
    # The input mapping is the encoder's own (x - 127) / 128 (crop off: same pixels).
    raw = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (2, 64, 64, 3), np.uint8))
    mapped = tower.normalize(images_to_float(raw, 64))
    assert torch.allclose(mapped, preprocess(raw, 64), atol=1e-5)


def test_tower_is_frozen_and_keeps_its_batchnorm_statistics(policy: OpenVLAOFTPolicy) -> None:
    tower = policy.vla.vision_backbone
    before = {k: v.clone() for k, v in tower.state_dict().items()}
    obs, state = images(4, 2), states(4, 0)
    out = policy.act(obs, prompts(), state, temperature=1.0, do_sample=True)
    policy.train()
    try:
        assert not tower.training and policy.vla.projector.training
        policy.zero_grad()
        batch = trajectories(obs, state, K.RAW_ACTIONS, out.raw_actions)
        logprobs, _ = policy.evaluate(batch, 1.0)
        logprobs.sum().backward()
    finally:
        policy.eval()
    assert not any(p.requires_grad for p in tower.parameters())
    assert all(p.grad is None for p in tower.parameters())
    assert all(torch.equal(v, before[k]) for k, v in tower.state_dict().items())
    for trained in (policy.vla.projector.fc1.weight, policy.action_head.fc_in.weight):
        assert trained.requires_grad and float(trained.grad.abs().sum()) > 0
    policy.zero_grad()


def test_acts_with_continuous_head_and_proprio(policy: OpenVLAOFTPolicy) -> None:
    obs = images(2, 3)
    out = policy.act(obs, INSTRUCTIONS, states(2, 1), temperature=1.0, do_sample=False)
    assert out.actions.shape == (2, 8, 7) and out.raw_actions.shape == (2, 56)
    other = policy.act(obs, INSTRUCTIONS, states(2, 2), temperature=1.0, do_sample=False)
    assert not np.allclose(out.actions, other.actions)  # the proprio token is read


def test_same_seed_same_weights(policy: OpenVLAOFTPolicy) -> None:
    again = build_openvla_oft(OPTIONS, CPU).state_dict()
    assert all(torch.equal(v, again[k]) for k, v in policy.state_dict().items())
    # The preset is part of the architecture an init_from checkpoint must agree on.
    ours = OpenVLAOFTConfig.architecture_options(OPTIONS)
    assert ours != OpenVLAOFTConfig.architecture_options({**OPTIONS, "preset": "tiny_libero"})


def test_architecture_round_trips_and_published_configs_are_unchanged() -> None:
    arch = VLAArchitecture((), (64,), {"vocab_size": 411}, vision_backbone=EFFICIENTNET_LITE0)
    config = json.loads(json.dumps(architecture_to_config(arch)))
    assert config["vision_backbone"] == EFFICIENTNET_LITE0
    assert not config["use_fused_vision_backbone"]
    assert architecture_from_config(config) == arch
    fused = VLAArchitecture(("tiny_dinov2_reg4", "tiny_siglip"), (32, 32), {"vocab_size": 411})
    assert "vision_backbone" not in architecture_to_config(fused)  # published layout
    with pytest.raises(ValueError, match="no timm towers"):
        VLAArchitecture(("tiny_siglip",), (64,), {}, vision_backbone=EFFICIENTNET_LITE0)


def test_save_pretrained_reloads_identical_greedy_actions(
    policy: OpenVLAOFTPolicy, tmp_path
) -> None:
    folder = policy.save_pretrained(tmp_path / "effnet")
    loaded = build_openvla_oft({**OPTIONS, "preset": None, "path": str(folder)}, CPU)
    # (the preset's text_config names model_type, which config.json keeps outside it)
    assert architecture_to_config(loaded.vla.arch) == architecture_to_config(policy.vla.arch)
    tower = loaded.vla.vision_backbone
    assert isinstance(tower, EfficientNetBackbone)
    assert not any(p.requires_grad for p in tower.parameters())
    loaded.train()
    assert not tower.training
    loaded.eval()
    obs, state = images(2, 4), states(2, 3)
    a = policy.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    b = loaded.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    assert torch.equal(a.raw_actions, b.raw_actions) and np.array_equal(a.actions, b.actions)
