"""Compose the hydra config of a run and validate it without building anything heavy."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from embodied_rl.dag.spec import DagSpec, validate_dag
from embodied_rl.registry import PLUGIN_MODULES, load_plugins
from embodied_rl.runtime.models import ModelSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
CORE_NODE_MODULES = ("embodied_rl.nodes", "embodied_rl.tasks")


class ConfigError(ValueError):
    """The run config is wrong; the message says which key and how to fix it."""


@dataclass
class WorkersConfig:
    """``workers``: one DAG worker per device bundle."""

    num_workers: int = 2
    cpus_per_worker: float = 1.0
    torch_threads: int = 1


@dataclass
class TrainerConfig:
    """``trainer``: the step loop around the DAG."""

    total_steps: int = 10
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    collective_timeout_s: float = 300.0
    plot_keys: tuple[str, ...] = ("reward/mean",)
    log_to_console: bool = True  # rank 0 prints a line per step (off under a progress bar)


@dataclass
class RayConfig:
    """``ray``: ``address: null`` starts an embedded local cluster; ``auto`` joins one."""

    address: str | None = None
    num_cpus: int | None = None
    poll_interval_s: float = 0.5


@dataclass
class EvalConfig:
    """``eval``: when the evaluation DAG (``eval_dag``) runs during training.

    Attributes:
        every: run it after every ``every`` training steps (0: never during training).
        at_end: run it once more after the last step.
        batch_size: (task, init state) pairs evaluated each time, over all workers.
        max_videos: videos written each time, over all workers.
        suite_name: shown in the report's title (e.g. the LIBERO suite).
    """

    every: int = 0
    at_end: bool = False
    batch_size: int = 8
    max_videos: int = 8
    suite_name: str = ""


SECTIONS = {
    "workers": WorkersConfig,
    "trainer": TrainerConfig,
    "ray": RayConfig,
    "eval": EvalConfig,
}
TOP_LEVEL = {
    "name", "seed", "device", "resume", "run_dir", "output_root", "plugins",
    "models", "dag", "data", "rollout", "reward", "algorithm", "simulator", "encoder", "srpo", "eval", "eval_dag", "workers", "trainer", "ray",
}  # fmt: skip


def compose(
    config_name: str, overrides: Sequence[str] = (), config_dir: str | Path | None = None
) -> DictConfig:
    """Compose ``configs/<config_name>.yaml`` with hydra overrides (``key=value``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    directory = Path(config_dir or CONFIG_DIR).resolve()
    if not (directory / f"{config_name}.yaml").exists():
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ConfigError(
            f"no config {config_name!r} in {directory}; available: {', '.join(known)}"
        )
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def section(cfg: DictConfig, name: str) -> Any:
    """The typed dataclass of a section; unknown keys are errors that list the valid ones."""
    cls = SECTIONS[name]
    node = cfg.get(name)
    raw = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in '{name}'; valid keys: {sorted(fields)}")
    return cls(**raw)


def load_all_plugins(cfg: DictConfig) -> None:
    """Register core nodes and the plugin packages named in ``cfg.plugins``."""
    for module in CORE_NODE_MODULES:
        importlib.import_module(module)
    load_plugins(cfg.get("plugins") or PLUGIN_MODULES)


def dag_from_config(cfg: DictConfig, num_workers: int, key: str = "dag") -> DagSpec:
    """The validated DAG under ``cfg.<key>.nodes`` (``dag`` or ``eval_dag``)."""
    if key not in cfg or not cfg[key] or "nodes" not in cfg[key]:
        raise ConfigError(f"the config has no {key}.nodes; add e.g. 'defaults: [{{{key}: grpo}}]'")
    return validate_dag(OmegaConf.to_container(cfg[key].nodes, resolve=True), num_workers)


def validate_config(cfg: DictConfig) -> DagSpec:
    """Everything that can be checked before Ray starts; returns the validated DAG."""
    unknown = sorted(set(cfg.keys()) - TOP_LEVEL)
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {unknown}; valid keys: {sorted(TOP_LEVEL)}")
    workers = section(cfg, "workers")
    trainer = section(cfg, "trainer")
    section(cfg, "ray")
    evaluation = section(cfg, "eval")
    if workers.num_workers < 1:
        raise ConfigError("workers.num_workers must be >= 1")
    if trainer.total_steps < 1:
        raise ConfigError("trainer.total_steps must be >= 1")
    from embodied_rl.devices import device_spec

    device_spec(str(cfg.get("device", "cpu")))
    load_all_plugins(cfg)
    for name, raw in (OmegaConf.to_container(cfg.get("models") or {}, resolve=True)).items():
        try:
            spec = ModelSpec.from_mapping(name, raw)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from err
        from embodied_rl.registry import POLICIES

        if spec.policy not in POLICIES:
            raise ConfigError(f"models.{name}: {POLICIES.unknown_message(spec.policy)}")
    if cfg.get("eval_dag"):
        dag_from_config(cfg, workers.num_workers, key="eval_dag")
    elif evaluation.every > 0 or evaluation.at_end:
        raise ConfigError("eval.every/eval.at_end are set but there is no eval_dag; add one")
    return dag_from_config(cfg, workers.num_workers)
