"""Compose a run config from ``configs/`` with hydra, turning hydra's errors into ConfigErrors.

A top config (``configs/<name>.yaml``) picks options of the config groups in its
``defaults`` list: ``runtime`` (the run options and the workers, ray and trainer sections
every run shares), ``dag``, ``eval_dag``, ``policy``, ``critic``; then its own keys override.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from embodied_rl.runtime.config_errors import ConfigError, did_you_mean

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"


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
    # is not a string) or TypeError (``dag=[1,2]``: a list of them); the overrides are the
    # only input here, so each is the user's error.
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException, ValueError, TypeError) as err:
        unknown = _unknown_override_key(err, config_name, directory)
        raise unknown or ConfigError(
            # hydra's messages span lines (parse position, a docs link): the CLI prints one line.
            f"cannot compose {config_name!r} with {list(overrides)}: {one_line(err)}",
            "correct the override named above (key=value changes a key, +key=value adds one, "
            "group=option picks a config group option)",
        ) from None


def one_line(err: Exception) -> str:
    """``err``'s message with its lines joined by ``"; "``."""
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())


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
        f"unknown key {full_key}{did_you_mean(leaf, keys)} in the override of {config_name!r}",
        f"use a key {parent or 'the config'} has: {keys}; +{full_key}=... adds a key the file "
        "lacks (it must still be a valid key)",
    )
