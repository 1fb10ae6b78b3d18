"""What ``embodied-rl export`` wrote: each model's folder, how it loads, and the checkpoint.

Read by the model card (``model_card.py``) and returned by
:func:`~embodied_rl.export.run.export_run`, which the CLI prints from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_rl.interfaces import Exported


@dataclass
class ExportedModel:
    """One model of the export: its role (``actor``/``critic``), name, policy and options in
    the run, its folder, how it loads (:class:`~embodied_rl.interfaces.Exported`) and the
    files its exporter wrote there."""

    role: str
    model: str
    policy: str
    options: dict[str, Any]
    folder: Path
    loading: Exported
    files: list[str]


@dataclass
class ExportResult:
    """What :func:`~embodied_rl.export.run.export_run` wrote: ``out``, the checkpoint
    exported, its step and the models."""

    out: Path
    checkpoint: Path
    step: int
    models: list[ExportedModel]
