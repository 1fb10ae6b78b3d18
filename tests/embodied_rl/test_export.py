"""``embodied-rl export``: a run's policy in the Hugging Face layout, loaded back without it.

Round trips on the tiny presets: the exported folder, loaded with the policy's own loader
(``path=`` for OpenVLA / OpenVLA-OFT and the causal LM, ``from_pretrained`` for the MLP,
the critic and ``transformers``), acts exactly as the model the checkpoint holds. The
OpenVLA-OFT case exports the shipped SFT checkpoint (``assets/checkpoints``); the others
write their run folder with the real checkpoint writer, from weights moved away from the
preset's initial ones (so a loader that ignored the files would fail). A real training run
is exported in ``test_trackers.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl import keys as K
from embodied_rl.cli import main
from embodied_rl.data.batch import make_batch
from embodied_rl.export.run import export_run
from embodied_rl.registry import load_plugins, model_builder
from embodied_rl.runtime.config import REPO_ROOT, compose
from embodied_rl.runtime.init_from import load_init_state

SHIPPED = REPO_ROOT / "assets" / "checkpoints" / "openvla_oft_libero_object_task0"
LIBERO_STATISTICS = {
    "action": {
        "q01": [-0.9, -0.8, -0.7, -0.1, -0.2, -0.3, 0.0],
        "q99": [0.9, 0.8, 0.7, 0.1, 0.2, 0.3, 1.0],
        "mask": [True] * 6 + [False],
    }
}


@pytest.fixture(scope="module", autouse=True)
def _policies():
    load_plugins(["policies"])


def _trained(policy: str, options: dict, seed: int = 0, statistics: dict | None = None):
    """The preset's model with every weight moved (as training would), statistics set."""
    model = model_builder(policy)(options, torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    if statistics is not None:
        model.set_statistics(statistics)
    return model.eval()


def _run_folder(root: Path, config: dict, models: dict, step: int = 3) -> Path:
    """A run folder as ``embodied-rl train`` leaves it: config.yaml and one sealed
    checkpoint holding ``models`` (name -> module), written by the real checkpoint writer."""
    run_dir = root / "run"
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(config), run_dir / "config.yaml")
    state = {"step": step, "models": {f"model/{n}": m.state_dict() for n, m in models.items()}}
    checkpoint.write_rank_shard(run_dir / "checkpoints", step, 0, state)
    checkpoint.finalize(run_dir / "checkpoints", step, world_size=1)
    return run_dir


def _export_actor(root: Path, policy: str, options: dict, statistics: dict | None = None):
    """(the trained actor, what exporting its one-model run wrote)."""
    trained = _trained(policy, options, statistics=statistics)
    config = {"name": policy, "models": {"actor": {"policy": policy, "options": options}}}
    run_dir = _run_folder(root, config, {"actor": trained})
    (actor,) = export_run(run_dir, root / "out").models
    return trained, actor


def _observation(n: int = 3, size: int = 64, state_dim: int = 8):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    states = rng.normal(size=(n, state_dim)).astype(np.float32)
    return images, ["pick up the alphabet soup and place it in the basket"] * n, states


def _same_greedy_actions(a, b, images, instructions, states) -> None:
    first = a.act(images, instructions, states, temperature=1.0, do_sample=False)
    second = b.act(images, instructions, states, temperature=1.0, do_sample=False)
    np.testing.assert_array_equal(first.actions, second.actions)


def test_the_shipped_openvla_oft_checkpoint_round_trips_through_path(tmp_path):
    """OFT (continuous head, proprio token): the published layout, read by ``path``."""
    result = export_run(SHIPPED, tmp_path / "oft")
    (actor,) = result.models
    assert (actor.policy, result.step) == ("openvla_oft", 600)
    assert {"config.json", "model.safetensors", "dataset_statistics.json"} <= set(actor.files)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(actor.files)
    assert json.loads((actor.folder / "config.json").read_text())["model_type"] == "openvla"
    config = OmegaConf.to_container(OmegaConf.load(SHIPPED / "config.yaml"))
    options = config["models"]["actor"]["options"]
    trained = model_builder("openvla_oft")(options, torch.device("cpu"))
    trained.load_state_dict(load_init_state(str(SHIPPED), "actor"))
    loaded = model_builder("openvla_oft")(actor.loading.options, torch.device("cpu"))
    assert actor.loading.options["path"] == str(tmp_path / "oft")
    assert loaded.normalizer.statistics() == trained.normalizer.statistics() is not None
    _same_greedy_actions(trained, loaded, *_observation())
    card = (tmp_path / "oft" / "README.md").read_text()
    assert "openvla_oft policy after 600 steps" in card
    assert "suite: libero_object" in card  # the data it was trained on


def test_an_openvla_export_round_trips_through_path(tmp_path):
    """OpenVLA (7 tokens decoded one at a time), tiny_libero, with LIBERO statistics."""
    options = {"preset": "tiny_libero", "gripper_convention": "libero"}
    trained, actor = _export_actor(tmp_path, "openvla", options, LIBERO_STATISTICS)
    stats = json.loads((actor.folder / "dataset_statistics.json").read_text())
    assert stats["demonstrations"]["action"]["q99"] == LIBERO_STATISTICS["action"]["q99"]
    loaded = model_builder("openvla")(actor.loading.options, torch.device("cpu"))
    _same_greedy_actions(trained, loaded, *_observation(size=32, state_dim=7))


def test_an_mlp_export_with_statistics_round_trips_through_from_pretrained(tmp_path):
    from policies.mlp import MLPPolicy

    options = {"state_dim": 7, "action_dim": 7, "chunk": 2, "instruction_buckets": 16}
    statistics = {**LIBERO_STATISTICS, "proprio": LIBERO_STATISTICS["action"]}
    trained, actor = _export_actor(tmp_path, "mlp", options, statistics)
    assert actor.loading.options is None and "MLPPolicy.from_pretrained" in actor.loading.python
    loaded = MLPPolicy.from_pretrained(actor.folder)
    assert loaded.normalizer.statistics() == trained.normalizer.statistics()
    _same_greedy_actions(trained, loaded, None, *_observation(state_dim=7)[1:])


def test_a_causal_lm_and_its_critic_round_trip_through_transformers(tmp_path):
    """The actor loads with ``AutoModelForCausalLM`` and with the policy's ``path``; the
    critic with ``CausalLMCritic.from_pretrained``."""
    from transformers import AutoModelForCausalLM

    from policies.causal_lm import CausalLMCritic

    config = OmegaConf.to_container(compose("ppo_llm", []), resolve=True)
    entries = config["models"]
    actor = _trained("causal_lm", entries["actor"]["options"], seed=1)
    critic = _trained("causal_lm_critic", entries["critic"]["options"], seed=2)
    run_dir = _run_folder(tmp_path, config, {"actor": actor, "critic": critic})
    assert main(["export", str(run_dir), "--out", str(tmp_path / "out"), "--critic"]) == 0
    out = tmp_path / "out"
    prompt = actor.tokenizer(["12+7="], return_tensors="pt")
    hf = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(hf(**prompt).logits, actor.model(**prompt).logits)
    options = {
        **entries["actor"]["options"],
        "preset": None,
        "path": str(out),
        "tokenizer_path": None,
    }
    loaded = model_builder("causal_lm")(options, torch.device("cpu"))
    generate = {"max_new_tokens": 6, "do_sample": False}
    ids, mask = prompt["input_ids"], prompt["attention_mask"]
    assert torch.equal(
        loaded.generate(ids, mask, **generate)[0], actor.generate(ids, mask, **generate)[0]
    )
    batch = make_batch(
        {
            K.PROMPT_IDS: ids,
            K.PROMPT_MASK: mask,
            K.RESPONSE_IDS: torch.tensor([[16, 17, 18]]),
            K.RESPONSE_MASK: torch.ones(1, 3),
        }
    )
    with torch.no_grad():
        assert torch.equal(
            CausalLMCritic.from_pretrained(out / "critic").values(batch), critic.values(batch)
        )


# ------------------------------------------------------------------------------ bad input
@pytest.fixture
def mlp_run(tmp_path):
    options = {"state_dim": 8, "action_dim": 2}
    config = {"name": "mlp", "models": {"actor": {"policy": "mlp", "options": options}}}
    return _run_folder(tmp_path, config, {"actor": _trained("mlp", options)})


def _export(capsys, *args: str) -> tuple[int, str]:
    code = main(["export", *map(str, args)])
    return code, capsys.readouterr().err


def test_a_run_without_a_checkpoint_is_refused_naming_the_fix(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, err = _export(capsys, tmp_path / "nowhere", "--out", tmp_path / "out")
    assert code == 2 and "the run folder" in err and "does not exist" in err
    code, err = _export(capsys, run_dir, "--out", tmp_path / "out")
    assert code == 2 and "has no config.yaml, so it is no run folder" in err
    (run_dir / "config.yaml").write_text("name: x\nmodels: {}\n")
    code, err = _export(capsys, run_dir, "--out", tmp_path / "out")
    assert code == 2 and "has no complete checkpoint" in err
    assert "Fix: train with trainer.checkpoint_every > 0" in err
    assert not (tmp_path / "out").exists()


def test_a_missing_step_or_critic_is_refused_naming_what_exists(mlp_run, tmp_path, capsys):
    code, err = _export(capsys, mlp_run, "--out", tmp_path / "out", "--step", "7")
    assert code == 2 and "step_000007 is unusable: does not exist" in err
    assert "Fix: pass --step of a complete checkpoint (step_000003)" in err
    code, err = _export(capsys, mlp_run, "--out", tmp_path / "out", "--critic")
    assert code == 2 and "has no models.critic" in err and "Fix: export without --critic" in err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_non_empty_out_needs_force_which_replaces_it(mlp_run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.safetensors").write_text("old")
    code, err = _export(capsys, mlp_run, "--out", out)
    assert code == 2 and f"--out {out} is not empty" in err and "add --force" in err
    assert (out / "stale.safetensors").exists()
    assert _export(capsys, mlp_run, "--out", out, "--force")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    code, err = _export(capsys, mlp_run, "--out", tmp_path, "--force")  # holds the run
    assert code == 2 and f"export --out {tmp_path} contains the run folder {mlp_run}" in err
    assert mlp_run.is_dir()


@pytest.mark.parametrize("where", ["checkpoints", ".", "exported"])
def test_an_out_inside_the_run_is_refused_and_nothing_is_deleted(mlp_run, capsys, where):
    """``export RUN --out RUN/checkpoints --force`` deleted the checkpoint it exported."""
    before = sorted(str(p.relative_to(mlp_run)) for p in mlp_run.rglob("*"))
    code, err = _export(capsys, mlp_run, "--out", mlp_run / where, "--force")
    how = "is" if where == "." else "lies inside"
    assert code == 2 and f"{how} the run folder {mlp_run}, which the command reads" in err
    assert err.count("\n") == 1 and "Fix: choose a folder of its own" in err
    assert sorted(str(p.relative_to(mlp_run)) for p in mlp_run.rglob("*")) == before
