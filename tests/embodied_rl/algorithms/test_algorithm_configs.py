"""The GSPO, CPGD and RLOO run configs compose and validate; REINFORCE++ DAGs fit together."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from embodied_rl import keys as K
from embodied_rl.dag.spec import DagValidationError, validate_dag
from embodied_rl.runtime.config import compose, validate_config


def node(dag, node_id: str):
    return next(n for n in dag.nodes if n.id == node_id)


def test_gspo_config():
    dag = validate_config(compose("gspo_llm"))
    actor = node(dag, "train").config
    assert (actor.ratio_level, actor.loss_agg_mode) == ("sequence", "seq-mean-token-mean")
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (3e-4, 4e-4)
    assert node(dag, "advantage").type.name == "advantage.grpo"


def test_cpgd_config():
    dag = validate_config(compose("cpgd_llm"))
    actor = node(dag, "train").config
    assert (actor.policy_loss, actor.cpgd_drift_coef) == ("cpgd", 0.1)
    assert actor.ratio_level == "token"


def test_rloo_config():
    dag = validate_config(compose("rloo_llm"))
    assert node(dag, "advantage").type.name == "advantage.rloo"
    assert node(dag, "train").config.policy_loss == "ppo"


def test_grpo_config_keeps_its_defaults():
    actor = node(validate_config(compose("grpo_llm")), "train").config
    assert (actor.ratio_level, actor.policy_loss, actor.dual_clip_c) == ("token", "ppo", None)
    assert actor.loss_agg_mode == "token-mean"


def test_a_nonsense_override_fails_validation():
    cfg = compose("gspo_llm", ["algorithm.actor.loss_agg_mode=seq-mean-token-sum"])
    with pytest.raises(DagValidationError, match="one length-normalised loss per sequence"):
        validate_config(cfg)


def reinforce_pp_nodes(dag_name: str, reward_node: dict) -> list[dict]:
    """The nodes of ``dag_name`` with the advantage node replaced by token rewards + RF++."""
    cfg = compose("grpo_llm", [f"dag={dag_name}"])
    nodes = list(OmegaConf.to_container(cfg.dag.nodes, resolve=True))
    index = next(i for i, n in enumerate(nodes) if n["id"] == "advantage")
    deps = nodes[index]["deps"]
    nodes[index : index + 1] = [
        {**reward_node, "id": "token_rewards", "deps": deps},
        {"id": "advantage", "type": "advantage.reinforce_pp", "deps": ["token_rewards"],
         "config": {"gamma": 1.0, "baseline": True}},
    ]  # fmt: skip
    return nodes


def test_reinforce_pp_dags_satisfy_the_node_contracts():
    kl_reward = {"type": "reward.kl_penalty", "config": {"beta": 0.01, "estimator": "k1"}}
    dag = validate_dag(reinforce_pp_nodes("grpo_kl", kl_reward), 2)
    assert K.TOKEN_REWARDS in dag.by_id["advantage"].reads
    validate_dag(reinforce_pp_nodes("grpo", {"type": "reward.token_rewards"}), 2)
    # KL as reward without a reference model: the missing REF_LOGPROBS is named.
    with pytest.raises(DagValidationError, match=K.REF_LOGPROBS):
        validate_dag(reinforce_pp_nodes("grpo", kl_reward), 2)
