"""Experiment trackers: Weights & Biases and MLflow runs beside the run folder's own logs.

``trainer.loggers`` names the run logs besides ``metrics.jsonl`` and ``metrics.png`` (always
written): ``tensorboard`` (written by rank 0's worker, ``metrics.RunLogger``) and the trackers
``wandb`` and ``mlflow``. Only the driver talks to a tracker; the workers never import one.
Rank 0's worker writes the metrics and evaluation reports into the run folder, and the
driver's :class:`~embodied_rl.trackers.feed.TrackerFeed` forwards what is new there at every
status poll (``runtime/launcher.py``): scalars per step, the resolved config, the evaluation
success tables and videos, and the run folder's path. A tracker that fails during the run is
reported once and dropped; training goes on.

This module holds only what the validator needs (names, packages); the trackers themselves
are in ``feed.py``, ``wandb_run.py`` and ``mlflow_run.py``, imported by the driver.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from embodied_rl.runtime.config_errors import ConfigError, did_you_mean

LOGGERS = ("tensorboard", "wandb", "mlflow")
# tracker -> (the module it imports, the pip package, the extra of pyproject.toml)
TRACKERS = {
    "wandb": ("wandb", "wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny", "mlflow"),
}


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse unknown logger names and trackers whose package is not installed.

    Raises:
        ConfigError: naming the logger and the fix (a valid name, or the install command).
    """
    for name in loggers:
        if name not in LOGGERS:
            raise ConfigError(
                f"trainer.loggers: unknown logger {name!r}{did_you_mean(name, LOGGERS)}",
                f"use names from {list(LOGGERS)}, e.g. trainer.loggers=[tensorboard,wandb] "
                "(metrics.jsonl and metrics.png are always written)",
            )
    for name in dict.fromkeys(loggers):
        if name not in TRACKERS:
            continue
        module, package, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"trainer.loggers names {name}, but the {package} package is not installed",
                f"install it with `.venv/bin/pip install -c constraints.txt -e '.[{extra}]'` "
                f"(or `pip install {package}`), or remove {name} from trainer.loggers",
            )
