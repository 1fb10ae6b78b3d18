"""SFT on 2 Ray workers (sft_libero, synthetic demo files) and ``init_from`` into RL configs.

The runs use the real launcher, DAG, loader, policies and checkpoints; the evaluation at the
end (LIBERO) is switched off here and covered by the ``libero`` test below.
"""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.data.demo_formats import load_demo
from embodied_rl.data.demo_loader import select_demos
from embodied_rl.data.demos import dataset_statistics
from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import ConfigError, compose, validate_config
from embodied_rl.runtime.models import ModelStore
from tests.embodied_rl.synthetic_demos import INSTRUCTIONS, write_synthetic_demos

pytestmark = pytest.mark.ray

SIZE = 16  # simulator and demo image size of these runs
MLP = ["policy=mlp_image", "models.actor.options.chunk=4", "models.actor.options.hidden=[64,64]"]
OFT = ["models.actor.options.chunk=2"]
COMMON = [
    f"simulator.options.image_size={SIZE}",
    "eval.at_end=false",
    "data.batch_size=16",
    "algorithm.sft.micro_batch_size=8",
    "trainer.log_to_console=false",
]


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    return write_synthetic_demos(tmp_path_factory.mktemp("demos"), length=12, size=SIZE)


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory, demos):
    overrides = [*MLP, *COMMON, f"data.paths=['{demos}']", "models.actor.optimizer.lr=1e-3"]
    overrides += ["trainer.total_steps=300", "trainer.checkpoint_every=150"]
    run_dir = tmp_path_factory.mktemp("sft_mlp")
    return launch(compose("sft_libero", [*overrides, f"run_dir={run_dir}"]), show_progress=False)


def test_mlp_sft_drives_the_l1_loss_down(mlp_run):
    lines = _metrics(mlp_run.run_dir)
    assert [m["step"] for m in lines] == list(range(300))
    first, last = lines[0]["sft/loss"], np.mean([m["sft/loss"] for m in lines[-5:]])
    assert lines[0]["sft/l1"] == first and first > 0.2  # normalised targets in [-1, 1]
    assert last < first / 5, (first, last)  # 0.62 -> 0.075 when last measured
    assert all(m["sft/skipped_updates"] == 0 for m in lines)
    assert (mlp_run.run_dir / "checkpoints" / "step_000300" / "manifest.json").exists()


def test_resumed_sft_reproduces_the_uninterrupted_run(tmp_path, demos):
    """The loader position, weights, optimizer and statistics all come back on resume."""
    base = [*MLP, *COMMON, f"data.paths=['{demos}']", "trainer.checkpoint_every=2"]
    base += ["data.random_shift=2"]
    full = _metrics(
        launch(
            compose("sft_libero", [*base, "trainer.total_steps=4", f"run_dir={tmp_path / 'a'}"]),
            False,
        ).run_dir
    )
    cut = [*base, f"run_dir={tmp_path / 'b'}"]
    launch(compose("sft_libero", [*cut, "trainer.total_steps=2"]), show_progress=False)
    resumed = launch(compose("sft_libero", [*cut, "trainer.total_steps=4", "resume=true"]), False)
    lines = _metrics(resumed.run_dir)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    for step in (2, 3):
        for key in ("sft/loss", "sft/grad_norm"):
            assert lines[step][key] == pytest.approx(full[step][key], rel=1e-5), (step, key)


@pytest.mark.slow
def test_tiny_oft_sft_drives_the_token_cross_entropy_down(tmp_path, demos):
    overrides = [*OFT, *COMMON, f"data.paths=['{demos}']", "models.actor.optimizer.lr=3e-3"]
    overrides += ["trainer.total_steps=150", "trainer.checkpoint_every=0", f"run_dir={tmp_path}"]
    lines = _metrics(launch(compose("sft_libero", overrides), show_progress=False).run_dir)
    first, last = lines[0]["sft/loss"], np.mean([m["sft/loss"] for m in lines[-5:]])
    assert first == pytest.approx(np.log(256), rel=0.05)  # near-uniform over 256 bins
    # The tokens' marginal entropy is about log(12) = 2.5 per dimension: going well below it
    # needs the image (which holds the step) and the instruction.
    assert last < first / 4, (first, last)  # 5.58 -> 1.03 when last measured
    accuracy = [m["sft/token_accuracy"] for m in lines]
    assert accuracy[0] < 0.05 and np.mean(accuracy[-5:]) > 0.4


def _models(cfg) -> dict:
    return OmegaConf.to_container(cfg.models, resolve=True)


def _rl(name: str, init_from, *extra: str):
    overrides = [*MLP, f"simulator.options.image_size={SIZE}", *extra]
    return compose(name, [*overrides, f"models.actor.init_from={init_from}"])


def _observations(n: int = 4):
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, (n, SIZE, SIZE, 3), dtype=np.uint8)
    states = rng.normal(0, 0.3, (n, 8)).astype(np.float32)
    return images, [INSTRUCTIONS[i % 2] for i in range(n)], states


@pytest.mark.parametrize("name", ["srpo_libero", "grpo_libero", "ppo_libero"])
def test_init_from_starts_rl_from_the_sft_policy(mlp_run, demos, name):
    cfg = _rl(name, mlp_run.run_dir)
    validate_config(cfg)
    store = ModelStore(_models(cfg), torch.device("cpu"))
    started = store["actor"]
    # The SFT policy: its config's model with the newest checkpoint's weights.
    sft_cfg = compose("sft_libero", [*MLP, *COMMON, f"data.paths=['{demos}']"])
    sft = ModelStore({"actor": _models(sft_cfg)["actor"]}, torch.device("cpu"))["actor"]
    latest = checkpoint.latest_checkpoint(mlp_run.run_dir / "checkpoints")
    sft.load_state_dict(
        checkpoint.load_rank_shard(latest, 0, world_size=2)["models"]["model/actor"]
    )
    images, instructions, states = _observations()
    for do_sample in (False, True):
        torch.manual_seed(0)
        a = started.act(images, instructions, states, temperature=1.0, do_sample=do_sample)
        torch.manual_seed(0)
        b = sft.act(images, instructions, states, temperature=1.0, do_sample=do_sample)
        assert np.array_equal(a.actions, b.actions) and torch.equal(a.logprobs, b.logprobs)
    # The statistics travelled with the weights: those of the demos, not the identity.
    infos = select_demos([str(demos)], None, heldout_every=5)
    loaded = [load_demo(info, cameras=()) for info in infos]
    expected = dataset_statistics([d.actions for d in loaded], [d.proprio for d in loaded])
    assert started.normalizer.statistics()["action"]["q99"] == pytest.approx(
        expected["action"]["q99"]
    )
    if name == "ppo_libero":  # the critic starts fresh
        fresh = ModelStore({"critic": _models(cfg)["critic"]}, torch.device("cpu"))["critic"]
        critic = store["critic"]
        assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in critic.state_dict().items())
        assert not critic.normalizer.has_statistics


def test_fine_tuning_keeps_the_checkpoints_statistics_when_asked(mlp_run, demos, tmp_path):
    """One-demo SFT from a pretrained run with data.statistics=checkpoint keeps the action
    space the run learned (the statistics of all its demos), not the one demo's."""
    overrides = [*MLP, *COMMON, f"data.paths=['{demos}']", "data.max_demos_per_task=1"]
    overrides += [f"models.actor.init_from={mlp_run.run_dir}", "data.statistics=checkpoint"]
    overrides += ["trainer.total_steps=1", "trainer.checkpoint_every=1", f"run_dir={tmp_path}"]
    launch(compose("sft_libero", overrides), show_progress=False)
    tuned = ModelStore(_models(_rl("grpo_libero", tmp_path)), torch.device("cpu"))["actor"]
    kept = tuned.normalizer.statistics()["action"]["q99"]

    def statistics(max_demos):
        loaded = [load_demo(i, cameras=()) for i in select_demos([str(demos)], max_demos, 5)]
        return dataset_statistics([d.actions for d in loaded], [d.proprio for d in loaded])

    assert kept == pytest.approx(statistics(None)["action"]["q99"])  # mlp_run's, all demos
    assert kept != pytest.approx(statistics(1)["action"]["q99"])  # what statistics=demos sets


def test_a_checkpoint_dir_and_runtime_options_are_accepted(mlp_run):
    step = mlp_run.run_dir / "checkpoints" / "step_000150"
    validate_config(_rl("srpo_libero", step, "+models.actor.options.seed=3"))
    store = ModelStore(_models(_rl("srpo_libero", step)), torch.device("cpu"))
    weights = checkpoint.load_rank_shard(step, 1, world_size=2)["models"]["model/actor"]
    assert all(torch.equal(v, weights[k]) for k, v in store["actor"].state_dict().items())


def _refusal(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert "Fix:" in str(info.value)
    return str(info.value)


def test_mismatches_are_refused_with_the_fix(mlp_run, tmp_path):
    run = mlp_run.run_dir
    other_policy = compose("srpo_libero", [f"models.actor.init_from={run}"])
    message = _refusal(other_policy)
    assert "trained a 'mlp' policy" in message and "builds 'openvla_oft'" in message
    assert "set models.actor.policy=mlp" in message
    message = _refusal(_rl("srpo_libero", run, "models.actor.options.chunk=8"))
    assert "chunk=4 there, 8 here" in message
    message = _refusal(_rl("srpo_libero", run, "models.actor.options.head=discrete"))
    assert "head='gaussian' there, 'discrete' here" in message
    message = _refusal(_rl("grpo_libero", run, "simulator.options.image_size=32"))
    assert "image_size=16 there, 32 here" in message
    message = _refusal(_rl("srpo_libero", run, "models.actor.options.gripper_convention=none"))
    assert "gripper_convention='libero' there, 'none' here" in message
    # Not a policy option (OpenVLA-OFT resizes any image): the simulator's observations.
    message = _refusal(_rl("srpo_libero", run, "simulator.options.cameras=[robot0_eye_in_hand]"))
    assert "other observations" in message
    assert "cameras=['agentview'] there, ['robot0_eye_in_hand'] here" in message
    message = _refusal(_rl("srpo_libero", tmp_path / "nowhere"))
    assert "does not exist" in message
    (tmp_path / "empty").mkdir()
    assert "holds no complete checkpoint" in _refusal(_rl("srpo_libero", tmp_path / "empty"))


def test_a_checkpoint_without_statistics_is_refused(mlp_run, tmp_path):
    """A copy of the SFT run whose policy never had statistics set (written by the real
    checkpoint writer, as a run without data.demos would)."""
    copy = tmp_path / "no_stats"
    copy.mkdir()
    shutil.copy(mlp_run.run_dir / "config.yaml", copy / "config.yaml")
    latest = checkpoint.latest_checkpoint(mlp_run.run_dir / "checkpoints")
    for rank in range(2):
        state = checkpoint.load_rank_shard(latest, rank, world_size=2)
        state["models"]["model/actor"]["normalizer.action.present"] = torch.tensor(False)
        checkpoint.write_rank_shard(copy / "checkpoints", 7, rank, state)
    checkpoint.finalize(copy / "checkpoints", 7, world_size=2)
    message = _refusal(_rl("srpo_libero", copy))
    assert "has no action normalisation statistics" in message and "sft DAG" in message


def test_a_checkpoint_whose_checksum_does_not_match_is_refused_not_loaded(mlp_run, tmp_path):
    """One flipped byte (same size: only the sha256 can tell) in a copy of the SFT run."""
    copy = tmp_path / "edited"
    shutil.copytree(mlp_run.run_dir, copy, ignore=shutil.ignore_patterns("eval*", "tensorboard"))
    shard = checkpoint.latest_checkpoint(copy / "checkpoints") / checkpoint.shard_name(0)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    message = _refusal(_rl("srpo_libero", copy))
    assert f"{shard.name} does not match its sha256 in the manifest; it is not loaded" in message
    assert "git checkout -- assets/checkpoints" in message


@pytest.mark.libero
@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_sft_libero_evaluates_then_grpo_starts_from_it(tmp_path, demos):
    """sft_libero's own command: SFT, then the held-out evaluation with videos; GRPO on LIBERO
    then starts from its checkpoint."""
    overrides = [*MLP, f"data.paths=['{demos}']", "data.batch_size=16", "trainer.total_steps=3"]
    overrides += ["trainer.checkpoint_every=3", "simulator.options.max_steps=16"]
    sft = launch(compose("sft_libero", [*overrides, f"run_dir={tmp_path / 'sft'}"]), False)
    lines = _metrics(sft.run_dir)
    assert "eval/success_rate" in lines[-1] and "sft/loss" in lines[0]
    videos = list((sft.run_dir / "eval" / "step_000003").glob("*.mp4"))
    assert videos and (sft.run_dir / "eval" / "step_000003" / "report.html").exists()
    rl = [*MLP, f"models.actor.init_from={sft.run_dir}", "trainer.total_steps=1"]
    rl += ["eval.at_end=false", "simulator.options.max_steps=16", f"run_dir={tmp_path / 'rl'}"]
    lines = _metrics(launch(compose("grpo_libero", rl), show_progress=False).run_dir)
    assert lines[0]["rollout/episode_steps"] > 0
