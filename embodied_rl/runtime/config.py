"""Validate a composed run config without building anything heavy.

Every problem :func:`validate_config` finds is a :class:`ConfigError` (or, for the DAG, a
``DagValidationError``) whose message names the key and ends in ``Fix: <what to change>``.
Unknown keys are errors at every level: top-level keys, the typed sections (``workers``,
``trainer``, ``ray``, ``eval``), model entries, node configs, and keys of the sections that
nodes read through interpolation (``data``, ``rollout``, ...) that no node refers to.

The parts live beside this module, each with one purpose: ``config_compose`` (hydra
composition of ``configs/``), ``config_sections`` (the typed sections), ``config_keys``
(keys no node reads), ``config_inputs`` (the files nodes read and the id ranges their
simulators accept, checked on the driver) and ``config_errors`` (ConfigError and its wording). Their public
names are importable from here.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from embodied_rl.dag.node_type import dataclass_problems
from embodied_rl.dag.spec import DagSpec, validate_dag
from embodied_rl.data.tasks import shared_with_training
from embodied_rl.interfaces import ONE_CAMERA
from embodied_rl.registry import (
    PLUGIN_MODULES,
    is_model_name,
    load_plugins,
    model_builder,
    unknown_model_message,
)
from embodied_rl.runtime.config_compose import CONFIG_DIR, REPO_ROOT, compose
from embodied_rl.runtime.config_errors import (
    ConfigError,
    did_you_mean,
    plain_value,
    unresolvable,
)
from embodied_rl.runtime.config_inputs import check_inputs
from embodied_rl.runtime.config_keys import check_unused
from embodied_rl.runtime.config_sections import (
    MAX_WORKERS,
    NODE_FED_SECTIONS,
    PLACEMENT_STRATEGIES,
    SECTIONS,
    TOP_LEVEL,
    EvalConfig,
    RayConfig,
    RunOptions,
    TrainerConfig,
    WorkersConfig,
    check_loggers,
    section,
)
from embodied_rl.runtime.init_from import InitFromError, check_init_from
from embodied_rl.runtime.models import ModelSpec, OptimizerConfig, ParallelConfig

__all__ = [
    "CONFIG_DIR",
    "CORE_NODE_MODULES",
    "MAX_WORKERS",
    "NODE_FED_SECTIONS",
    "PLACEMENT_STRATEGIES",
    "REPO_ROOT",
    "SECTIONS",
    "TOP_LEVEL",
    "ConfigError",
    "EvalConfig",
    "RayConfig",
    "RunOptions",
    "TrainerConfig",
    "WorkersConfig",
    "compose",
    "dag_from_config",
    "load_all_plugins",
    "section",
    "validate_config",
]

logger = logging.getLogger(__name__)

CORE_NODE_MODULES = ("embodied_rl.nodes", "embodied_rl.tasks")


def load_all_plugins(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Register core nodes and the plugin packages named in ``cfg.plugins``."""
    for module in CORE_NODE_MODULES:
        importlib.import_module(module)
    plugins = plain_value(cfg, "plugins") or PLUGIN_MODULES
    if not isinstance(plugins, list | tuple) or not all(isinstance(p, str) for p in plugins):
        raise ConfigError(
            f"plugins must be a list of package names, got {plugins!r}",
            f"write e.g. plugins: {list(PLUGIN_MODULES)}",
        )
    for module in plugins:
        try:
            load_plugins([module])
        except ModuleNotFoundError as err:
            if err.name != module.split(".")[0] and err.name != module:
                raise  # the plugin exists but a package it imports is not installed
            raise ConfigError(
                f"plugins: no package {module!r}{did_you_mean(module, PLUGIN_MODULES)}",
                f"list importable plugin packages, e.g. {list(PLUGIN_MODULES)}",
            ) from None


def dag_from_config(
    cfg: DictConfig | Mapping[str, Any], num_workers: int, key: str = "dag"
) -> DagSpec:
    """The validated DAG under ``cfg.<key>.nodes`` (``dag`` or ``eval_dag``)."""
    block = plain_value(cfg, key)
    if not isinstance(block, Mapping) or "nodes" not in block:
        raise ConfigError(
            f"the config has no {key}.nodes (got {key}: {str(block)[:60]})",
            f"add e.g. 'defaults: [{{{key}: grpo}}]' or a {key}: {{nodes: [...]}} block",
        )
    unknown = sorted(map(str, set(block) - {"nodes", "branches"}))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {key}", f"{key} holds only 'nodes' and 'branches'"
        )
    return validate_dag(block["nodes"], num_workers, block.get("branches"))


def _check_top_level(plain: Mapping[Any, Any]) -> RunOptions:
    """Top-level keys are known; the scalars have the right types; the device exists."""
    unknown = sorted(set(plain) - TOP_LEVEL, key=str)
    if unknown:
        raise ConfigError(
            f"unknown top-level key {unknown[0]!r}{did_you_mean(unknown[0], sorted(TOP_LEVEL))}",
            f"remove it or use one of the valid keys {sorted(TOP_LEVEL)}",
        )
    scalars = {f.name: plain[f.name] for f in fields(RunOptions) if f.name in plain}
    problems = dataclass_problems(RunOptions, scalars, "the config")
    if problems:
        raise ConfigError(*problems[0])
    try:
        options = RunOptions(**scalars)
    except ValueError as err:
        raise ConfigError(str(err), "set it at the top level of the config") from None
    from embodied_rl.devices import DEVICE_TYPES, device_spec

    try:
        device_spec(options.device)
    except ValueError as err:
        raise ConfigError(str(err), f"set device to one of {DEVICE_TYPES}") from None
    return options


def _check_models(models: Any) -> dict[str, ModelSpec]:
    """Each ``models.<name>`` entry: known keys, right types, a registered policy."""
    if models is None:
        return {}
    if not isinstance(models, Mapping):
        raise ConfigError(
            f"models must be a mapping of name -> model entry, got {models!r}",
            "write e.g. models: {actor: {policy: causal_lm}}",
        )
    specs = {}
    for name, raw in models.items():
        where = f"models.{name}"
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{where} must be a mapping, got {raw!r}", f"write {where}: {{policy: ...}}"
            )
        allowed = [f.name for f in fields(ModelSpec)]
        unknown = sorted(set(raw) - set(allowed), key=str)
        if unknown:
            raise ConfigError(
                f"unknown key {where}.{unknown[0]}{did_you_mean(unknown[0], allowed)}",
                f"use only the valid keys {allowed}",
            )
        for key, wanted in (
            ("policy", str),
            ("options", Mapping),
            ("trainable", bool),
            ("init_from", str | None),
        ):
            if key in raw and not isinstance(raw[key], wanted):
                raise ConfigError(
                    f"{where}.{key} has the wrong type ({type(raw[key]).__name__})",
                    f"set {where}.{key} to a {getattr(wanted, '__name__', 'path string')}",
                )
        problems = [
            problem
            for block, cls in (("optimizer", OptimizerConfig), ("parallel", ParallelConfig))
            for problem in dataclass_problems(cls, raw.get(block) or {}, f"{where}.{block}")
        ]
        if problems:
            raise ConfigError(*problems[0])
        try:
            spec = ModelSpec.from_mapping(str(name), raw)
        except ValueError as err:
            raise ConfigError(str(err), f"correct {where}") from None
        if not is_model_name(spec.policy):  # a policy or a video encoder
            raise ConfigError(
                f"{where}: {unknown_model_message(spec.policy)}", f"set {where}.policy"
            )
        check_options = getattr(model_builder(spec.policy), "check_options", None)
        if check_options is not None:  # e.g. a path checkpoint's files against the options
            check_options(spec.options, where)
        specs[str(name)] = spec
    return specs


def _check_init_from(specs: Mapping[str, ModelSpec], simulator: Mapping[str, Any] | None) -> None:
    """Every ``init_from`` names a complete checkpoint of a matching policy with statistics,
    trained on the observations this run's ``simulator`` section gives."""
    for name, spec in specs.items():
        if spec.init_from is None:
            continue
        try:
            check_init_from(name, spec.policy, spec.options, spec.init_from, simulator)
        except InitFromError as err:
            raise ConfigError(err.problem, err.fix) from None


def _check_model_names(dag: DagSpec, models: Mapping[str, ModelSpec]) -> None:
    """Node config fields named ``model`` or ``*_model`` must name an entry of ``models``."""
    for node in dag.nodes:
        if node.config is None:
            continue
        for field in fields(node.config):
            value = getattr(node.config, field.name)
            named = field.name == "model" or field.name.endswith("_model")
            if named and isinstance(value, str) and value not in models:
                raise ConfigError(
                    f"node {node.id!r}: its config.{field.name} is {value!r}, but models has no "
                    f"{value!r}{did_you_mean(value, sorted(models))} (models: {sorted(models)})",
                    f"add models.{value}, or set the node's {field.name} to an entry of models",
                )


TASK_MANIFEST_TYPE = "data.tasks"


def _check_state_sizes(dag: DagSpec, models: Mapping[str, ModelSpec]) -> None:
    """The proprio size each rollout's policy reads is the one its simulator gives (a policy
    built for another size failed at its first act, in a worker)."""
    for node in dag.nodes:
        state_dim = getattr(node.config, "simulator_state_dim", None)
        spec = models.get(getattr(node.config, "model", None))
        if state_dim is None or spec is None:
            continue
        reads = getattr(model_builder(spec.policy), "state_size", None)
        simulator_dim, policy_dim = state_dim(), None if reads is None else reads(spec.options)
        if simulator_dim is not None and policy_dim and policy_dim != simulator_dim:
            raise ConfigError(
                f"node {node.id!r}: models.{node.config.model} ({spec.policy}) reads a "
                f"{policy_dim}-d state, simulator {node.config.simulator!r} gives "
                f"{simulator_dim}-d states",
                f"set the policy's state size to {simulator_dim} (models.{node.config.model}"
                ".options.state_dim, or proprio_dim for openvla_oft)",
            )


def _check_wrist_camera(dag: DagSpec, models: Mapping[str, ModelSpec]) -> None:
    """A policy that reads the wrist camera gets it: a ``data.demos`` node loads it exactly when
    its policy reads it (with it unread, every frame is held twice), and a rollout's simulator
    renders it where its options name the cameras (else the first step failed in a worker)."""
    for node in dag.nodes:
        spec = models.get(getattr(node.config, "model", None))
        if spec is None:
            continue
        reads = getattr(model_builder(spec.policy), "cameras", None)
        wanted = ONE_CAMERA if reads is None else tuple(reads(spec.options))
        who = f"models.{node.config.model} ({spec.policy})"
        loaded = getattr(node.config, "cameras", None) if node.type.name == "data.demos" else None
        if loaded and ("wrist" in wanted) != ("wrist" in loaded):
            raise ConfigError(
                f"node {node.id!r} loads the cameras {list(loaded)}, but {who} reads "
                f"{list(wanted)}",
                f"set data.cameras=[{','.join(wanted)}]"
                + ("" if "wrist" in wanted else " (or the policy's num_images_in_input=2)"),
            )
        rendered = getattr(node.config, "simulator_cameras", lambda: None)()
        if "wrist" in wanted and rendered is not None and "wrist" not in rendered:
            raise ConfigError(
                f"node {node.id!r}: {who} reads the cameras {list(wanted)}, but the simulator "
                f"renders {list(rendered)}",
                f"set simulator.options.cameras=[{','.join(wanted)}]",
            )


def _check_statistics_source(dag: DagSpec, models: Mapping[str, ModelSpec]) -> None:
    """A ``data.demos`` node that keeps the checkpoint's statistics has a checkpoint to keep
    them from (``init_from``, where check_init_from has found them set)."""
    for node in dag.nodes:
        if getattr(node.config, "statistics", None) != "checkpoint":
            continue
        model = node.config.model
        if model in models and models[model].init_from is None:
            raise ConfigError(
                f"node {node.id!r}: statistics=checkpoint keeps the normalisation statistics "
                f"of models.{model}.init_from, which is not set",
                f"set models.{model}.init_from to the pretrained run, or data.statistics=demos",
            )


def _manifest_nodes(dag: DagSpec) -> list[Any]:
    return [node for node in dag.nodes if node.type.name == TASK_MANIFEST_TYPE]


def _check_evaluation_apart(evaluation_dag: DagSpec, training_dag: DagSpec) -> None:
    """The evaluation's held-out (task, init state) rows are none that training draws."""
    trained = [row for node in _manifest_nodes(training_dag) for row in node.config.rows()]
    for node in _manifest_nodes(evaluation_dag):
        shared = shared_with_training(trained, node.config.rows(), node.config.split)
        if shared:
            raise ConfigError(
                f"eval_dag node {node.id!r}: its {node.config.split!r} split shares "
                f"{len(shared)} (task, init state) pairs with the training rows, e.g. "
                f"{shared[:4]}; its numbers would not be held out",
                "train on data.split=train and evaluate validation/test/heldout with the same "
                "data.heldout_every",
            )


def trained_suites(dag: DagSpec) -> set[str]:
    """The simulator suites a training DAG runs or reads: its rollouts' ``simulator_suite()``
    and its demonstration nodes' ``suite``."""
    suites = set()
    for node in dag.nodes:
        rollout_suite = getattr(node.config, "simulator_suite", None)
        suite = rollout_suite() if callable(rollout_suite) else getattr(node.config, "suite", None)
        if isinstance(suite, str):
            suites.add(suite)
    return suites


def check_pretraining_suite(evaluation_dag: DagSpec, trained: set[str], source: str) -> None:
    """An evaluation runs a pretraining-only suite (LIBERO-90) only for a policy trained on it:
    LIBERO-90's numbers never stand for a policy of the four evaluation suites.

    Args:
        trained: the suites the evaluated policy was trained on (:func:`trained_suites`).
        source: where ``trained`` comes from, for the message.

    Raises:
        ConfigError: naming the suite asked, the suites trained on and the fix.
    """
    for node in evaluation_dag.nodes:
        asked = getattr(node.config, "pretraining_suite", None)
        suite = asked() if callable(asked) else None
        if suite is None or suite in trained:
            continue
        own = sorted(trained)
        raise ConfigError(
            f"eval_dag node {node.id!r} asks {suite} tasks (simulator.options.suite={suite}) of "
            f"a policy trained on {own or 'no suite'} ({source}): {suite} is a pretraining "
            "corpus only, never an evaluation suite of a policy trained on another suite",
            (f"evaluate on the suite it was trained on (simulator.options.suite={own[0]})"
             if own else "evaluate on the suite the policy was trained on")
            + f"; {suite}'s own held-out check is `--config-name pretrain_libero90`",
        )  # fmt: skip


def validate_config(cfg: DictConfig | Mapping[str, Any], mode: str = "train") -> DagSpec:
    """Everything that can be checked before Ray starts; returns the validated DAG.

    ``mode="eval"`` (``embodied-rl eval``) checks the input files of the evaluation DAG only:
    the training DAG does not run, so e.g. an SFT run's demonstrations may be gone.

    Raises:
        ConfigError: a key of the run config, named in the message with the fix.
        DagValidationError: the DAG (or eval DAG), every problem with its node and fix.
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(dict(cfg))
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise unresolvable(err, "the config") from None
    _check_top_level(plain)
    for name in ("workers", "trainer", "ray"):  # the workers read them key by key
        if name not in plain:
            raise ConfigError(
                f"the config has no '{name}' section",
                f"restore it (drop ~{name}; configs/runtime/default.yaml holds the defaults)",
            )
    workers = section(plain, "workers")
    check_loggers(section(plain, "trainer").loggers)
    section(plain, "ray")
    evaluation = section(plain, "eval")
    load_all_plugins(plain)
    models = _check_models(plain.get("models"))
    _check_init_from(models, plain.get("simulator"))
    dags = []
    if plain.get("eval_dag") is not None:
        dags.append(dag_from_config(plain, workers.num_workers, key="eval_dag"))
    elif evaluation.every > 0 or evaluation.at_end or evaluation.at_start:
        raise ConfigError(
            "eval.every/eval.at_end/eval.at_start are set but there is no eval_dag",
            "add 'eval_dag: env' to the defaults, or set eval.every=0 eval.at_end=false "
            "eval.at_start=false",
        )
    dags.append(dag_from_config(plain, workers.num_workers))
    for dag in dags:
        _check_model_names(dag, models)
        _check_statistics_source(dag, models)
        _check_state_sizes(dag, models)
        _check_wrist_camera(dag, models)
    if len(dags) == 2:
        _check_evaluation_apart(evaluation_dag=dags[0], training_dag=dags[1])
        check_pretraining_suite(dags[0], trained_suites(dags[1]), "this run's dag")
    # data files, demo folders, id ranges: before anything is written
    check_inputs(dags[:-1] if mode == "eval" else dags)
    unused = check_unused(OmegaConf.to_container(cfg, resolve=False))
    if unused:
        logger.warning("config keys not used by this run's DAG(s): %s", ", ".join(unused))
    return dags[-1]
