"""Every shipped config validates, and every LLM config trains for 3 steps on 2 workers.

Four LLM configs are trained on 2 workers by a test of their own, which checks all that the
run here would and more, so they are not run twice: ``grpo_llm`` (``test_launch.py``'s
``full_run``), ``ppo_llm`` (``test_ppo.py``), ``dapo_llm`` (``test_dapo.py``) and
``marft_llm`` (``test_marft.py``)."""

from __future__ import annotations

import json
import re

import pytest

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch
from embodied_rl.runtime.config import CONFIG_DIR, compose, validate_config
from tests.embodied_rl.synthetic_demos import input_overrides

CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
DAGS = sorted(p.stem for p in (CONFIG_DIR / "dag").glob("*.yaml"))
LLM_CONFIGS = [name for name in CONFIGS if name.endswith("_llm")]
TRAINED_ELSEWHERE = {"grpo_llm", "ppo_llm", "dapo_llm", "marft_llm"}  # see the docstring


@pytest.mark.parametrize("name", CONFIGS)
def test_config_validates_through_the_cli(name, capsys):
    inputs = list(input_overrides(name))
    assert main(["validate", "--config-name", name, *inputs]) == 0, capsys.readouterr().err
    dag = validate_config(compose(name, inputs))
    assert dag.nodes


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_device_is_the_only_key_to_change_for_an_accelerator(name, device):
    """``device=cuda|npu`` validates with no other override, and only ``device`` differs
    (the strategy, dtype, backend and Ray resource follow from it in embodied_rl/devices.py)."""
    from omegaconf import OmegaConf

    inputs = list(input_overrides(name))
    on_cpu = OmegaConf.to_container(compose(name, inputs), resolve=True)
    moved = compose(name, [*inputs, f"device={device}"])
    validate_config(moved)
    on_device = OmegaConf.to_container(moved, resolve=True)
    assert on_cpu.pop("device") == "cpu" and on_device.pop("device") == device
    assert on_device == on_cpu


def test_every_dag_file_is_used_by_a_config():
    texts = " ".join((CONFIG_DIR / f"{name}.yaml").read_text() for name in CONFIGS)
    used = set(re.findall(r"dag:\s*([\w-]+)", texts))
    # grpo_kl and srpo_oracle are selected on the command line (dag=grpo_kl, as the README
    # shows; dag=srpo_oracle, the privileged upper bound of an SRPO comparison).
    unused = sorted(set(DAGS) - used - {"grpo_kl", "srpo_oracle"})
    assert not unused, f"DAG files no config uses: {unused}"
    validate_config(compose("grpo_llm", ["dag=grpo_kl", "algorithm.actor.kl_coef=0.1"]))
    for name in ("srpo_reach", "srpo_libero"):
        validate_config(compose(name, ["dag=srpo_oracle"]))


@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(set(LLM_CONFIGS) - TRAINED_ELSEWHERE))
def test_llm_config_runs_three_steps_on_two_workers(name, tmp_path):
    overrides = [
        "data.batch_size=4",
        "rollout.n=4",
        "trainer.total_steps=3",
        "trainer.checkpoint_every=3",
        "workers.num_workers=2",
        f"run_dir={tmp_path}",
    ]
    result = launch(compose(name, overrides), show_progress=False)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in lines)
    assert all(abs(m["loss/policy"]) < 1e3 for m in lines)
    assert (result.run_dir / "checkpoints" / "step_000003" / "manifest.json").exists()


def test_sft_libero_trains_what_srpo_libero_starts_from():
    """The SFT baseline evaluates on srpo_libero's simulator, with its policy, for every
    policy= choice (init_from checks the options again at start-up)."""
    from omegaconf import OmegaConf

    for choice in ([], ["policy=mlp_image"], ["policy=flow_vla_tiny"]):
        sft = OmegaConf.to_container(compose("sft_libero", choice), resolve=True)
        rl = OmegaConf.to_container(compose("srpo_libero", choice), resolve=True)
        assert sft["simulator"] == rl["simulator"]
        assert sft["models"]["actor"]["policy"] == rl["models"]["actor"]["policy"]
        assert sft["models"]["actor"]["options"] == rl["models"]["actor"]["options"]
        for key in ("model", "simulator", "simulator_options", "num_envs", "max_steps"):
            assert sft["rollout"][key] == rl["rollout"][key], key
        assert sft["data"]["heldout_every"] == rl["data"]["heldout_every"]
        assert sft["data"]["chunk"] == rl["models"]["actor"]["options"]["chunk"]


def test_eval_split_and_name_reach_the_evaluation_dag():
    """``eval.split=train eval.name=eval_train`` evaluates the training init states into
    its own report folder and metrics; the default stays the held-out split under ``eval``."""
    from omegaconf import OmegaConf

    def eval_nodes(overrides):
        plain = OmegaConf.to_container(compose("srpo_reach", overrides), resolve=True)
        return {node["id"]: node.get("config", {}) for node in plain["eval_dag"]["nodes"]}

    default = eval_nodes([])
    assert default["tasks"]["split"] == "heldout" and default["report"]["name"] == "eval"
    train = eval_nodes(["eval.split=train", "eval.name=eval_train"])
    assert train["tasks"]["split"] == "train" and train["report"]["name"] == "eval_train"
    assert train["videos"]["name"] == "eval_train"  # the videos go into the report's folder
    with pytest.raises(Exception, match="eval.split must be one of"):
        validate_config(compose("srpo_reach", ["eval.split=heldin"]))
    validation = eval_nodes(["eval.split=validation"])["tasks"]
    assert validation["split"] == "validation" and validation["heldout_every"] == 5
    validate_config(compose("srpo_reach", ["eval.split=test"]))
    # Training on every state makes a held-out evaluation a leak; evaluating train is asked for.
    with pytest.raises(Exception, match="'test' split shares 20 .task, init state. pairs"):
        validate_config(compose("srpo_reach", ["data.split=all", "eval.split=test"]))
    validate_config(compose("srpo_reach", ["data.split=all", "eval.split=train"]))
    # The evaluation before step 1 and the one after it would be averaged in one metrics row.
    with pytest.raises(Exception, match="eval.at_start=true with eval.every=1"):
        validate_config(compose("srpo_reach", ["eval.at_start=true", "eval.every=1"]))


def test_eval_tasks_default_to_the_trained_tasks():
    """``eval.tasks`` unset: the evaluation's tasks are ``data.tasks``; pretrain_libero90
    trains on every task of its corpus and evaluates a fixed ten of them; ``null`` is all."""
    from omegaconf import OmegaConf

    def eval_tasks(name, overrides):
        plain = OmegaConf.to_container(compose(name, overrides), resolve=True)
        (tasks,) = [node for node in plain["eval_dag"]["nodes"] if node["id"] == "tasks"]
        return tasks["config"]["tasks"], plain["data"]["tasks"]

    assert eval_tasks("srpo_oft_libero", []) == ([0], [0])
    assert eval_tasks("srpo_oft_libero", ["+eval.tasks=[3,4]"]) == ([3, 4], [0])
    inputs = list(input_overrides("pretrain_libero90"))
    evaluated, trained = eval_tasks("pretrain_libero90", inputs)
    assert trained is None and len(evaluated) == 10 == len(set(evaluated))
    assert eval_tasks("pretrain_libero90", [*inputs, "eval.tasks=null"]) == (None, None)


def test_eval_videos_replay_the_rollouts_env_at_eval_video_size():
    """The evaluation rollout keeps its actions (no frames); rollout.videos replays on the same
    env (same simulator settings) at eval.video_size; bad sizes are refused at validate."""
    from omegaconf import OmegaConf

    for name in ("srpo_reach", "srpo_libero"):
        plain = OmegaConf.to_container(compose(name, ["eval.video_size=160"]), resolve=True)
        nodes = {node["id"]: node.get("config", {}) for node in plain["eval_dag"]["nodes"]}
        rollout, videos = nodes["rollout"], nodes["videos"]
        assert rollout["keep_actions"] and not rollout["keep_frames"]
        for key in ("simulator", "simulator_options", "num_envs", "processes"):
            assert videos[key] == rollout[key], (name, key)
        assert (videos["video_size"], videos["max_videos"]) == (160, plain["eval"]["max_videos"])
        assert plain["rollout"]["keep_frames"] and not plain["rollout"].get("keep_actions")
    with pytest.raises(Exception, match=r"video_size must be >= 1 \(pixels\), got 0"):
        validate_config(compose("srpo_reach", ["eval.video_size=0"]))
    with pytest.raises(Exception, match=r"video_size must be in \[1, 480\]"):
        validate_config(compose("srpo_libero", ["eval.video_size=512"]))
