"""The error of a wrong run config, and the helpers that word it.

Every message names the key and ends in ``Fix: <what to change>``; the validators in
``embodied_rl/runtime/config.py`` and its sibling ``config_*`` modules raise it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """The run config is wrong; the message names the key and says how to fix it."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        super().__init__(problem if fix is None else f"{problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


def did_you_mean(name: Any, options: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unresolvable(err: OmegaConfBaseException, where: str) -> ConfigError:
    """The ConfigError for an interpolation that names a missing key, or a ``???`` value."""
    key = getattr(err, "full_key", None) or where
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return ConfigError(
        f"cannot resolve {key}: {reason}",
        "define the key that the ${...} reference names, or correct the reference",
    )


def plain_value(cfg: DictConfig | Mapping[str, Any], key: str) -> Any:
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
        raise unresolvable(err, key) from None
