"""OpenVLA-OFT checkpoints in the published layout: the side files load and act as trained,
options that contradict the files are refused before workers start.

The checkpoint is written here exactly as OFT's training script leaves it: the VLA as
safetensors shards with their index, ``config.json``, ``dataset_statistics.json``, the
tokenizer, ``action_head--<step>_checkpoint.pt`` and ``proprio_projector--<step>_checkpoint.pt``
saved from DDP-wrapped modules (``module.`` names, OFT's own module names), and a
``lora_adapter/`` folder, which must be ignored. The weights are random (the tiny preset).
"""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import json
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import policies  # noqa: F401  (registers the policies)
from embodied_rl.runtime.config import ConfigError, compose, validate_config
from policies.openvla.loading import save_checkpoint
from policies.openvla_oft import OpenVLAOFTPolicy, build_openvla_oft
from policies.openvla_oft.published import check_checkpoint_options

CPU = torch.device("cpu")
CHUNK = 8
STATS = {
    "libero_spatial_no_noops": {
        "action": {"q01": [-0.5] * 6 + [-1.0], "q99": [0.5] * 6 + [1.0], "mask": [True] * 6 + [False]},
        "proprio": {"q01": [-1.0] * 8, "q99": [1.0] * 8, "mask": [True] * 8},
    }
}  # fmt: skip
INSTRUCTIONS = ["pick up the black bowl and place it on the plate", "open the top drawer"]


def published_head_state(policy: OpenVLAOFTPolicy) -> dict[str, torch.Tensor]:
    """Our continuous head's weights under OFT's names (MLPResNet inside L1RegressionActionHead)."""
    head = policy.action_head
    state = {
        "model.layer_norm1": head.norm_in,
        "model.fc1": head.fc_in,
        "model.layer_norm2": head.norm_out,
        "model.fc2": head.fc_out,
    }
    for i, block in enumerate(head.blocks):
        state[f"model.mlp_resnet_blocks.{i}.ffn.0"] = block.norm
        state[f"model.mlp_resnet_blocks.{i}.ffn.1"] = block.fc
    return {
        f"module.{prefix}.{kind}": getattr(module, kind).detach().clone()
        for prefix, module in state.items()
        for kind in ("weight", "bias")
    }


@pytest.fixture(scope="module")
def trained() -> OpenVLAOFTPolicy:
    """The model OFT would have trained: L1 head, proprio, statistics (seed 1: not default)."""
    options = {"seed": 1, "use_continuous_head": True, "use_proprio": True, "chunk": CHUNK}
    policy = build_openvla_oft(options, CPU)
    with torch.no_grad():  # a non-default log-std: the loaded model must not have it
        policy.action_log_std.fill_(0.5)
    policy.set_statistics(STATS["libero_spatial_no_noops"])
    return policy


@pytest.fixture(scope="module")
def folder(trained, tmp_path_factory):
    """``trained`` in OFT's published layout."""
    out = tmp_path_factory.mktemp("oft_published")
    vla_only = build_openvla_oft({"seed": 1, "chunk": CHUNK}, CPU)  # the same VLA weights
    save_checkpoint(vla_only, out, vla_only.vla.arch, STATS, vla_only.tokenizer, shard_size=40)
    config = json.loads((out / "config.json").read_text())  # the base model's pretraining data
    config["norm_stats"] = {"bridge_orig": {"action": {"q01": [-9.0] * 7, "q99": [9.0] * 7}}}
    (out / "config.json").write_text(json.dumps(config))
    torch.save(published_head_state(trained), out / "action_head--150000_checkpoint.pt")
    proprio = {f"module.{k}": v.clone() for k, v in trained.proprio_projector.state_dict().items()}
    torch.save(proprio, out / "proprio_projector--150000_checkpoint.pt")
    (out / "lora_adapter").mkdir()
    (out / "lora_adapter" / "adapter_config.json").write_text(json.dumps({"r": 32}))
    torch.save(
        {"base_model.model.x.lora_A.weight": torch.zeros(2, 2)},
        out / "lora_adapter" / "adapter_model.bin",
    )
    return out


def reference_mean(hidden: torch.Tensor, head: dict[str, torch.Tensor]) -> torch.Tensor:
    """OFT's L1 head on the action positions' hidden states (N, K, D) -> (N, K), written
    from its published module structure (pre-LN MLP-ResNet, 2 blocks)."""
    w = {k.removeprefix("module."): v for k, v in head.items()}

    def ln(x, name):
        return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"])

    def fc(x, name):
        return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    n = hidden.shape[0]
    x = hidden.reshape(n, CHUNK, -1)
    x = F.relu(fc(ln(x, "model.layer_norm1"), "model.fc1"))
    for i in range(2):
        block = f"model.mlp_resnet_blocks.{i}.ffn"
        x = x + F.relu(fc(ln(x, f"{block}.0"), f"{block}.1"))
    return fc(ln(x, "model.layer_norm2"), "model.fc2").reshape(n, -1)


def test_side_files_load_and_act_as_trained(trained, folder, caplog):
    # dataset_statistics.json replaces config.json's norm_stats (one dataset: no unnorm_key
    # needed), and the suite name finds its _no_noops entry
    options = {"preset": None, "path": str(folder), "use_continuous_head": True}
    with caplog.at_level(logging.WARNING):
        loaded = build_openvla_oft({**options, "use_proprio": True, "chunk": CHUNK}, CPU)
        named = {**options, "use_proprio": True, "chunk": CHUNK, "unnorm_key": "libero_spatial"}
        assert build_openvla_oft(named, CPU).statistics_name == "libero_spatial_no_noops"
    assert loaded.statistics_name == "libero_spatial_no_noops"
    assert "action_log_std is in no file of the checkpoint; starts at [-2.0" in caplog.text
    assert torch.equal(loaded.action_log_std.detach(), torch.full((7,), -2.0))
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    state = rng.uniform(-0.9, 0.9, (2, 8)).astype(np.float32)
    out = loaded.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    with torch.no_grad():
        hidden = loaded.action_hidden(obs, INSTRUCTIONS, state)
        head = torch.load(folder / "action_head--150000_checkpoint.pt", weights_only=True)
        expected = reference_mean(hidden, head)
    torch.testing.assert_close(out.raw_actions, expected, rtol=1e-5, atol=1e-6)
    # the model as trained (its head, its proprio projector) acts the same way
    same = trained.act(obs, INSTRUCTIONS, state, temperature=1.0, do_sample=False)
    torch.testing.assert_close(out.raw_actions, same.raw_actions, rtol=1e-5, atol=1e-6)
    # de-normalised with dataset_statistics.json: q01 -0.5 / q99 0.5 on the pose
    raw = expected.clamp(-1, 1).reshape(2, CHUNK, 7).numpy()
    assert np.allclose(out.actions[..., :6], 0.5 * raw[..., :6], atol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"use_proprio": True}, r"use_continuous_head is false, but .* holds action_head--150000"),
        ({"use_continuous_head": True}, r"use_proprio is false, but .* holds proprio_projector--"),
    ],
)
def test_options_that_contradict_the_files_are_refused(folder, options, message):
    with pytest.raises(ConfigError, match=message) as err:
        check_checkpoint_options({"preset": None, "path": str(folder), **options})
    assert "Fix: set models.actor.options." in str(err.value) and "=true" in str(err.value)


def test_a_head_the_files_lack_is_refused_and_the_check_runs_before_workers(tmp_path):
    bare = build_openvla_oft({"seed": 0}, CPU)
    bare.save_pretrained(tmp_path / "tokens_only")
    options = {"preset": None, "path": str(tmp_path / "tokens_only"), "use_continuous_head": True}
    with pytest.raises(ConfigError, match=r"has no action_head--\*_checkpoint.pt file nor such"):
        check_checkpoint_options(options)
    overrides = [
        "policy=openvla_oft_libero",
        f"+models.actor.options.path={tmp_path / 'tokens_only'}",
        "models.actor.options.preset=null",
    ]
    with pytest.raises(
        ConfigError, match="Fix: set models.actor.options.use_continuous_head=false"
    ):
        validate_config(compose("srpo_libero", overrides))  # on the driver: no Ray


def test_two_steps_of_one_side_file_are_refused(folder, tmp_path):
    import shutil

    copy = shutil.copytree(folder, tmp_path / "two")
    shutil.copy(
        copy / "action_head--150000_checkpoint.pt", copy / "action_head--latest_checkpoint.pt"
    )
    with pytest.raises(ConfigError, match="holds 2 action_head files"):
        check_checkpoint_options({"preset": None, "path": str(copy), "use_continuous_head": True})


def test_inspect_says_what_the_published_folder_holds_and_how_to_use_it(folder, capsys):
    from embodied_rl.cli import main

    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "OpenVLA-OFT checkpoint" in out
    assert "L1 regression (action_head--150000_checkpoint.pt)" in out
    assert "8-d (proprio_projector--150000_checkpoint.pt)" in out
    assert "statistics       libero_spatial_no_noops" in out  # config.json's bridge_orig replaced
    assert "lora_adapter/" in out and "does not say how many images" in out
    overrides = out.strip().splitlines()[-1].split()
    assert "models.actor.policy=openvla_oft" in overrides
    assert "++models.actor.options.use_continuous_head=true" in overrides
    assert "++models.actor.options.use_proprio=true" in overrides
    # the printed overrides build the model they describe
    options = dict(o.removeprefix("++models.actor.options.").split("=") for o in overrides[1:])
    flags = {k: {"true": True, "false": False, "null": None}.get(v, v) for k, v in options.items()}
    check_checkpoint_options(flags)
    loaded = build_openvla_oft({**flags, "chunk": CHUNK}, CPU)
    assert loaded.action_head is not None and loaded.proprio_projector is not None
    # and are accepted as printed by a LIBERO config whose file lists only some options
    cfg = compose("srpo_libero", [*overrides, f"++models.actor.options.chunk={CHUNK}"])
    validate_config(cfg)
    assert cfg.models.actor.options.path == str(folder)


def test_inspect_refuses_what_it_cannot_load(tmp_path, capsys):
    from embodied_rl.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "resnet"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "model_type 'resnet', which no policy or encoder here loads" in err and "Fix:" in err
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
