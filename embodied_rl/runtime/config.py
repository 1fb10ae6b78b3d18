"""Compose the hydra config of a run and validate it without building anything heavy.

Every problem :func:`validate_config` finds is a :class:`ConfigError` (or, for the DAG, a
``DagValidationError``) whose message names the key and ends in ``Fix: <what to change>``.
Unknown keys are errors at every level: top-level keys, the typed sections (``workers``,
``trainer``, ``ray``, ``eval``), model entries, node configs, and keys of the sections that
nodes read through interpolation (``data``, ``rollout``, ...) that no node refers to.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from embodied_rl.dag.node_type import NodeConfigError, build_dataclass, dataclass_problems
from embodied_rl.dag.spec import DagSpec, validate_dag
from embodied_rl.data.tasks import SPLITS
from embodied_rl.registry import NODE_TYPES, PLUGIN_MODULES, POLICIES, load_plugins
from embodied_rl.runtime.init_from import InitFromError, check_init_from
from embodied_rl.runtime.models import ModelSpec, OptimizerConfig, ParallelConfig

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
CORE_NODE_MODULES = ("embodied_rl.nodes", "embodied_rl.tasks")
# One worker per device: more than this is a typo, and would only stall the validator.
MAX_WORKERS = 1 << 16


class ConfigError(ValueError):
    """The run config is wrong; the message names the key and says how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem if fix is None else f"{problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


def _positive(owner: Any, *names: str, strict: bool = True) -> None:
    """Range check for ``__post_init__``: each named field > 0 (or >= 0 with strict=False)."""
    for name in names:
        value = getattr(owner, name)
        if value is not None and (value <= 0 if strict else value < 0):
            raise ValueError(f"{name} must be {'> 0' if strict else '>= 0'}, got {value}")


@dataclass
class RunOptions:
    """The top-level scalars of a run config (the sections are checked on their own)."""

    name: str
    seed: int = 0
    device: str = "cpu"
    resume: bool = False
    run_dir: str | None = None
    output_root: str = "outputs"
    plugins: list[str] | None = None


@dataclass
class WorkersConfig:
    """``workers``: one DAG worker per device bundle."""

    num_workers: int = 2
    cpus_per_worker: float = 1.0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        _positive(self, "num_workers", "cpus_per_worker", "torch_threads")
        if self.num_workers > MAX_WORKERS:
            raise ValueError(f"num_workers must be <= {MAX_WORKERS}, got {self.num_workers}")


@dataclass
class TrainerConfig:
    """``trainer``: the step loop around the DAG.

    ``time_limit_min`` ends training early: after the step during which that many minutes of
    training wall time (``time/elapsed_s``, resumed attempts included) have passed, with the
    final evaluation and checkpoint; ``null`` runs all ``total_steps``.
    """

    total_steps: int = 10
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    collective_timeout_s: float = 300.0
    plot_keys: tuple[str, ...] = ("reward/mean",)
    log_to_console: bool = True  # rank 0 prints a line per step (off under a progress bar)
    time_limit_min: float | None = None

    def __post_init__(self) -> None:
        _positive(self, "total_steps", "keep_checkpoints", "collective_timeout_s")
        _positive(self, "checkpoint_every", strict=False)
        _positive(self, "time_limit_min")


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass
class RayConfig:
    """``ray``: ``address: null`` starts an embedded local cluster; ``auto`` joins one.

    Attributes:
        address: ``null`` (embedded cluster on this machine), ``auto`` (the cluster this
            machine is a node of) or ``host:port`` of a head node's GCS.
        num_cpus: logical CPUs of the embedded cluster (default: enough for the workers).
        poll_interval_s: how often the driver asks the workers for their status.
        placement_strategy: how the workers' bundles are placed on the nodes (Ray's placement
            group strategies): ``PACK`` fills as few nodes as possible (the least traffic
            between nodes), ``SPREAD`` spreads them over the nodes.
        connect_timeout_s: how long reaching ``address`` may take before the run is refused.
        placement_timeout_s: how long the cluster may take to place every worker.
    """

    address: str | None = None
    num_cpus: int | None = None
    poll_interval_s: float = 0.5
    placement_strategy: str = "PACK"
    connect_timeout_s: float = 15.0
    placement_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        _positive(self, "num_cpus", "poll_interval_s", "connect_timeout_s", "placement_timeout_s")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"placement_strategy must be one of {PLACEMENT_STRATEGIES}, "
                f"got {self.placement_strategy!r}"
            )


@dataclass
class EvalConfig:
    """``eval``: when the evaluation DAG (``eval_dag``) runs during training.

    Attributes:
        every: run it after every ``every`` training steps (0: never during training).
        at_end: run it once more after the last step.
        batch_size: (task, init state) pairs evaluated each time, over all workers.
        max_videos: videos written each time, over all workers.
        suite_name: shown in the report's title (e.g. the LIBERO suite).
        split: init states evaluated: ``heldout`` (never trained on; the default), ``train``
            or ``all`` (see ``embodied_rl/data/tasks.py``).
        name: metric prefix (``<name>/success_rate``) and report folder under the run dir;
            give another split its own, e.g. ``eval.split=train eval.name=eval_train``.
    """

    every: int = 0
    at_end: bool = False
    batch_size: int = 8
    max_videos: int = 8
    suite_name: str = ""
    split: str = "heldout"
    name: str = "eval"

    def __post_init__(self) -> None:
        _positive(self, "batch_size")
        _positive(self, "every", "max_videos", strict=False)
        if self.split not in SPLITS:
            raise ValueError(f"eval.split must be one of {SPLITS}, got {self.split!r}")


SECTIONS = {
    "workers": WorkersConfig,
    "trainer": TrainerConfig,
    "ray": RayConfig,
    "eval": EvalConfig,
}
# Sections that DAG nodes read through interpolation (``config: ${rollout}``); a key of them
# that no interpolation refers to would be silently ignored, so it is an error.
NODE_FED_SECTIONS = (
    "data",
    "rollout",
    "reward",
    "algorithm",
    "simulator",
    "encoder",
    "srpo",
    "agents",  # per-agent settings of a multi-agent DAG (e.g. each agent's workers)
)
TOP_LEVEL = (
    {f.name for f in fields(RunOptions)}
    | set(SECTIONS)
    | set(NODE_FED_SECTIONS)
    | {"models", "dag", "eval_dag"}
)
_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # ${a.b.c}; resolvers (${x:..}) excluded


def compose(
    config_name: str, overrides: Sequence[str] = (), config_dir: str | Path | None = None
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with hydra overrides (``key=value``).

    Raises:
        ConfigError: no such config, or hydra refused an override (its message names it).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    directory = Path(config_dir or CONFIG_DIR).resolve()
    if not (directory / f"{config_name}.yaml").exists():
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ConfigError(
            f"no config {config_name!r} in {directory}", f"use one of: {', '.join(known)}"
        )
    GlobalHydra.instance().clear()
    # Hydra reports some bad overrides as a plain ValueError (``dag=-1``: a group option that
    # is not a string); the overrides are the only input here, so each is the user's error.
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        unknown = _unknown_override_key(err, config_name, directory)
        raise unknown or ConfigError(
            f"cannot compose {config_name!r} with {list(overrides)}: {err}",
            "correct the override named above (key=value changes a key, +key=value adds one, "
            "group=option picks a config group option)",
        ) from None


def _unknown_override_key(err: Exception, config_name: str, directory: Path) -> ConfigError | None:
    """For ``key=value`` naming a key the config lacks: the keys it has there, did-you-mean."""
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if not isinstance(cause, ConfigAttributeError | ConfigKeyError) or not full_key:
        return None
    parent, _, leaf = str(full_key).rpartition(".")
    try:
        base = compose(config_name, config_dir=directory)
    except ConfigError:
        return None
    node = OmegaConf.select(base, parent) if parent else base
    keys = sorted(map(str, node.keys())) if isinstance(node, DictConfig) else []
    return ConfigError(
        f"unknown key {full_key}{_suggest(leaf, keys)} in the override of {config_name!r}",
        f"use a key {parent or 'the config'} has: {keys}; +{full_key}=... adds a key the file "
        "lacks (it must still be a valid key)",
    )


def _unresolvable(err: OmegaConfBaseException, where: str) -> ConfigError:
    key = getattr(err, "full_key", None) or where
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return ConfigError(
        f"cannot resolve {key}: {reason}",
        "define the key that the ${...} reference names, or correct the reference",
    )


def _get(cfg: DictConfig | Mapping[str, Any], key: str) -> Any:
    """``cfg[key]`` (``None`` when absent) as plain Python data, interpolations resolved.

    Raises:
        ConfigError: an interpolation names a missing key, or a value is ``???``.
    """
    try:
        node = cfg.get(key)
        if OmegaConf.is_config(node):
            return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        return node
    except OmegaConfBaseException as err:
        raise _unresolvable(err, key) from None


def section(cfg: DictConfig | Mapping[str, Any], name: str) -> Any:
    """The typed dataclass of a section; unknown keys and wrong types are ConfigErrors."""
    raw = _get(cfg, name)
    try:
        return build_dataclass(SECTIONS[name], {} if raw is None else raw, name)
    except NodeConfigError as err:
        raise ConfigError(err.problem, err.fix) from None


def _suggest(name: Any, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_all_plugins(cfg: DictConfig | Mapping[str, Any]) -> None:
    """Register core nodes and the plugin packages named in ``cfg.plugins``."""
    for module in CORE_NODE_MODULES:
        importlib.import_module(module)
    plugins = _get(cfg, "plugins") or PLUGIN_MODULES
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
                f"plugins: no package {module!r}{_suggest(module, PLUGIN_MODULES)}",
                f"list importable plugin packages, e.g. {list(PLUGIN_MODULES)}",
            ) from None


def dag_from_config(
    cfg: DictConfig | Mapping[str, Any], num_workers: int, key: str = "dag"
) -> DagSpec:
    """The validated DAG under ``cfg.<key>.nodes`` (``dag`` or ``eval_dag``)."""
    block = _get(cfg, key)
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
            f"unknown top-level key {unknown[0]!r}{_suggest(unknown[0], sorted(TOP_LEVEL))}",
            f"remove it or use one of the valid keys {sorted(TOP_LEVEL)}",
        )
    scalars = {f.name: plain[f.name] for f in fields(RunOptions) if f.name in plain}
    problems = dataclass_problems(RunOptions, scalars, "the config")
    if problems:
        raise ConfigError(*problems[0])
    options = RunOptions(**scalars)
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
                f"unknown key {where}.{unknown[0]}{_suggest(unknown[0], allowed)}",
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
        if spec.policy not in POLICIES:
            raise ConfigError(
                f"{where}: {POLICIES.unknown_message(spec.policy)}", f"set {where}.policy"
            )
        specs[str(name)] = spec
    return specs


def _check_init_from(specs: Mapping[str, ModelSpec]) -> None:
    """Every ``init_from`` names a complete checkpoint of a matching policy with statistics."""
    for name, spec in specs.items():
        if spec.init_from is None:
            continue
        try:
            check_init_from(name, spec.policy, spec.options, spec.init_from)
        except InitFromError as err:
            raise ConfigError(err.problem, err.fix) from None


def _references(node: Any) -> Iterator[str]:
    """Every ``${a.b}`` key path in an unresolved config container."""
    if isinstance(node, str):
        yield from _REFERENCE.findall(node)
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _references(value)


def _unreferenced(value: Any, path: str, refs: set[str]) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of keys under ``path`` that no reference reaches (itself, a parent
    or a child)."""
    parts = path.split(".")
    if any(".".join(parts[:i]) in refs for i in range(1, len(parts) + 1)):
        return  # this key or a parent is passed on whole
    if not any(r.startswith(path + ".") for r in refs):
        yield path, value
    elif isinstance(value, Mapping):
        for key, child in value.items():
            yield from _unreferenced(child, f"{path}.{key}", refs)


def _node_option_names() -> set[str]:
    """Every key that some registered node type's config accepts."""
    names: set[str] = set()
    for type_name in NODE_TYPES.names():
        config_cls = NODE_TYPES.get(type_name).config_cls
        names |= {f.name for f in fields(config_cls)} if config_cls is not None else set()
    return names


def _unknown_leaf(path: str, value: Any, options: set[str]) -> str | None:
    """The first key under ``path`` that no node type accepts, or ``None``."""
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            found = _unknown_leaf(f"{path}.{key}", child, options)
            if found is not None:
                return found
        return None
    return None if path.rsplit(".", 1)[-1] in options else path


def _check_unused(unresolved: Mapping[Any, Any]) -> list[str]:
    """Keys of the node-fed sections that no interpolation passes to a node.

    Such a key never reaches a node. When it is no option of any node type (a typo such as
    ``data.batch_sise``) it is an error; a valid option that this DAG does not use (e.g. a
    section inherited from a parent config whose DAG differs) is returned for a warning.

    Raises:
        ConfigError: naming the unknown key, with a did-you-mean where one is close.
    """
    refs = set(_references(unresolved))
    options = _node_option_names()
    unused = []
    for name in (n for n in NODE_FED_SECTIONS if n in unresolved):
        for path, value in _unreferenced(unresolved[name], name, refs):
            unknown = _unknown_leaf(path, value, options)
            if unknown is None:
                unused.append(path)
                continue
            parent, leaf = unknown.rsplit(".", 1) if "." in unknown else ("", unknown)
            siblings = unresolved.get(name) if parent == name else None
            candidates = sorted((options | set(map(str, siblings or ()))) - {leaf})
            close = difflib.get_close_matches(leaf, candidates, n=1)
            hint = f" (did you mean {parent}.{close[0]}?)" if close and parent else ""
            raise ConfigError(
                f"unknown config key {unknown}: no node type has an option {leaf!r} and no "
                f"node's config refers to {unknown}{hint}",
                f"remove {unknown} or correct its name",
            )
    return unused


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
                    f"{value!r}{_suggest(value, sorted(models))} (models: {sorted(models)})",
                    f"add models.{value}, or set the node's {field.name} to an entry of models",
                )


def validate_config(cfg: DictConfig | Mapping[str, Any]) -> DagSpec:
    """Everything that can be checked before Ray starts; returns the validated DAG.

    Raises:
        ConfigError: a key of the run config, named in the message with the fix.
        DagValidationError: the DAG (or eval DAG), every problem with its node and fix.
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(dict(cfg))
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        raise _unresolvable(err, "the config") from None
    _check_top_level(plain)
    workers = section(plain, "workers")
    for name in ("trainer", "ray"):
        section(plain, name)
    evaluation = section(plain, "eval")
    load_all_plugins(plain)
    models = _check_models(plain.get("models"))
    _check_init_from(models)
    dags = []
    if plain.get("eval_dag") is not None:
        dags.append(dag_from_config(plain, workers.num_workers, key="eval_dag"))
    elif evaluation.every > 0 or evaluation.at_end:
        raise ConfigError(
            "eval.every/eval.at_end are set but there is no eval_dag",
            "add 'eval_dag: env' to the defaults, or set eval.every=0 eval.at_end=false",
        )
    dags.append(dag_from_config(plain, workers.num_workers))
    for dag in dags:
        _check_model_names(dag, models)
    unused = _check_unused(OmegaConf.to_container(cfg, resolve=False))
    if unused:
        logger.warning("config keys not used by this run's DAG(s): %s", ", ".join(unused))
    return dags[-1]
