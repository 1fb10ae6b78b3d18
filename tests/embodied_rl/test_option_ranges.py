"""Every numeric option refuses a value outside its range, naming the option.

The walk covers every registered node type's config, the run config's sections (with the
optimizer and parallel blocks of a model) and every options dataclass of the policy, video
encoder, simulator and rollout packages (``*Options`` / ``*Config`` classes). Each int or
float field is set to -1 (one below a documented -1 sentinel) on an otherwise valid config,
which must raise a ``ValueError`` whose message names the field: a negative
``optimizer.grad_clip`` was once accepted and turned every update into gradient ascent.
Fields where a negative number means something are listed with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import typing

import pytest

import policies
import rollout
import simulators
from embodied_rl.registry import NODE_TYPES, load_plugins
from embodied_rl.runtime.config_sections import SECTIONS, RunOptions
from embodied_rl.runtime.models import OptimizerConfig, ParallelConfig

NUMBERS = (int, float, int | None, float | None)
# Fields where a negative value is meaningful, and why.
NEGATIVE_ALLOWED = {
    "OpenVLAOFTConfig.init_log_std": "a log standard deviation",
    "MLPPolicyConfig.init_log_std": "a log standard deviation",
    "actor.train.entropy_coef": "negative: an entropy penalty instead of a bonus",
    "filter.dynamic_sampling.success_threshold": "a reward value; rewards may be negative",
}
# Documented -1 sentinels: the value below them is the out-of-range one.
MINUS_ONE_MEANS_OFF = {"fault.inject.step"}
# Not options of any command: the scripted planner's tuning constants (offsets, gains), set
# in code and checked by the planner's tests and its success report.
NOT_OPTIONS = {"PlannerConfig"}
# Minimal valid arguments of the classes without defaults for every field.
REQUIRED = {
    "RunOptions": {"name": "x"},
    "VJepa2EncoderOptions": {"config": {}},
    "VJepa2WorldModelOptions": {"config": {}},
    "advantage.marft": {"agents": ["a", "b"]},
    "reward.digit_team": {"agents": ["a", "b"]},
}
TYPE_DEFAULTS = {int: 4, float: 1.0, str: "actor", list[str]: ["x"], list[int]: [0]}


def _option_classes() -> list[tuple[str, type]]:
    load_plugins()
    import embodied_rl.nodes  # noqa: F401  (registers the built-in node types)

    found = [(name, NODE_TYPES.get(name).config_cls) for name in NODE_TYPES.names()]
    found = [(name, cls) for name, cls in found if cls is not None]
    found += [(cls.__name__, cls) for cls in (*SECTIONS.values(), RunOptions)]
    found += [("OptimizerConfig", OptimizerConfig), ("ParallelConfig", ParallelConfig)]
    for package in (policies, simulators, rollout):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            for name, obj in vars(importlib.import_module(module.name)).items():
                if (
                    inspect.isclass(obj)
                    and dataclasses.is_dataclass(obj)
                    and obj.__module__ == module.name
                    and name.endswith(("Options", "Config"))
                    and name not in NOT_OPTIONS
                ):
                    found.append((name, obj))
    return sorted(dict(found).items())


def _baseline(name: str, cls: type) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            kwargs[field.name] = TYPE_DEFAULTS.get(hints[field.name])
    return {**kwargs, **REQUIRED.get(name, {})}


def _numeric_fields() -> list[tuple[str, type, str]]:
    cases = []
    for name, cls in _option_classes():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if field.init and hints[field.name] in NUMBERS:
                cases.append((name, cls, field.name))
    return cases


CASES = _numeric_fields()


def test_the_walk_reaches_every_kind_of_component():
    names = {name for name, _, _ in CASES}
    for expected in ("actor.train", "OptimizerConfig", "TrainerConfig", "OpenVLAOFTConfig"):
        assert expected in names
    assert any(cls.__module__.startswith("simulators.") for _, cls, _ in CASES)
    assert any(cls.__module__.startswith("rollout.") for _, cls, _ in CASES)
    assert len(CASES) > 100


@pytest.mark.parametrize("owner, cls, field", CASES, ids=[f"{o}.{f}" for o, _, f in CASES])
def test_an_out_of_range_number_is_refused_naming_the_option(owner, cls, field):
    key = f"{owner}.{field}"
    if key in NEGATIVE_ALLOWED:
        pytest.skip(NEGATIVE_ALLOWED[key])
    baseline = _baseline(owner, cls)
    cls(**baseline)  # valid as it stands
    value = -2 if key in MINUS_ONE_MEANS_OFF else -1
    with pytest.raises(ValueError) as refused:
        cls(**{**baseline, field: value})
    assert field in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    "override, words",
    [
        ("models.actor.optimizer.grad_clip=-1", "optimizer.grad_clip must be > 0 or null"),
        ("seed=-1", "seed must be >= 0"),
        ("algorithm.actor.kl_coef=-0.1", "kl_coef must be >= 0"),
    ],
)
def test_the_cli_refuses_them_in_one_line_before_anything_runs(override, words, capsys):
    from embodied_rl.cli import main

    assert main(["validate", "--config-name", "grpo_llm", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Fix:" in err
    assert "Traceback" not in err
