"""LIBERO-90 is a pretraining corpus only: an evaluation asks its tasks only of a policy
trained on it (issue 51, bad input), refused before any worker starts otherwise."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from embodied_rl.runtime.config import (
    compose,
    dag_from_config,
    load_all_plugins,
    trained_suites,
    validate_config,
)
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.run_folder import SAVED_CONFIG, check_eval_suite
from tests.embodied_rl.runtime.test_shipped_pretrained import SHIPPED
from tests.embodied_rl.synthetic_demos import write_synthetic_demos


def _sft_overrides(tmp_path, suite: str) -> list[str]:
    demos = tmp_path / suite
    if not demos.exists():
        write_synthetic_demos(demos, size=64, suite=suite)
    return ["policy=openvla_oft_libero", f"simulator.options.suite={suite}",
            f"data.paths=['{demos}']", "data.max_demos_per_task=1"]  # fmt: skip


def _composed(config_name: str, overrides: list[str]):
    """The config with its node types registered (as ``validate_config`` does first)."""
    cfg = compose(config_name, overrides)
    load_all_plugins(cfg)
    return cfg


def _check_eval_suite(cfg, run) -> None:
    """``embodied-rl eval``'s check, on the evaluation DAG of ``cfg`` (one worker)."""
    check_eval_suite(dag_from_config(cfg, 1, key="eval_dag"), 1, run)


def _saved_run(tmp_path, overrides: list[str]):
    """A run folder's saved config, written as the launcher writes it (resolved)."""
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(compose("sft_libero", overrides), run / SAVED_CONFIG, resolve=True)
    return run


def test_the_suites_trained_on_are_the_demos_and_the_rollouts_suites(tmp_path):
    sft = _composed("sft_libero", _sft_overrides(tmp_path, "libero_goal"))
    assert trained_suites(dag_from_config(sft, 1)) == {"libero_goal"}  # demos node's suite
    rl = _composed("srpo_libero", ["simulator.options.suite=libero_10"])
    assert trained_suites(dag_from_config(rl, 1)) == {"libero_10"}  # rollouts' suite


def test_a_libero90_evaluation_of_a_policy_trained_on_an_evaluation_suite_is_refused(tmp_path):
    run = _saved_run(tmp_path, _sft_overrides(tmp_path, "libero_object"))
    asked = _composed("sft_libero", _sft_overrides(tmp_path, "libero_90"))
    with pytest.raises(ConfigError) as refused:
        _check_eval_suite(asked, run)
    message = str(refused.value)
    assert "asks libero_90 tasks" in message and "['libero_object']" in message
    assert "simulator.options.suite=libero_object" in message  # the fix names the own suite
    assert str(run) in message  # where the suite trained on was read
    _check_eval_suite(_composed("sft_libero", _sft_overrides(tmp_path, "libero_object")), run)


def test_the_pretraining_run_evaluates_its_own_held_out_libero90_states():
    """The shipped pretraining run's saved config trains on libero_90: its check passes."""
    run = SHIPPED["openvla_oft_libero"]
    _check_eval_suite(_composed("pretrain_libero90", []), run)


def test_a_training_run_whose_evaluation_runs_libero90_is_refused(tmp_path):
    overrides = _sft_overrides(tmp_path, "libero_spatial")
    cfg = compose("sft_libero", overrides)
    options = OmegaConf.to_container(cfg.simulator.options, resolve=True)
    cfg.rollout.simulator_options = {**options, "suite": "libero_90", "max_steps": 100}
    with pytest.raises(ConfigError, match=r"asks libero_90 tasks .* \['libero_spatial'\]"):
        validate_config(cfg)
    validate_config(compose("sft_libero", overrides))  # its own suite: no refusal
