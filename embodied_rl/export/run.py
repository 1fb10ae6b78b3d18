"""``embodied-rl export``: build a run's models, load a checkpoint, write the export folder.

The models are built from the run's options and loaded with the checkpoint's weights and
statistics buffers exactly as ``init_from`` does (``runtime/init_from.py``), on the CPU; no
Ray, no run state. The folder is written under a temporary name and renamed into place, so
an export that fails leaves ``out`` as it was.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.export.model_card import write_model_card
from embodied_rl.export.result import ExportedModel, ExportResult
from embodied_rl.interfaces import Exported
from embodied_rl.registry import EXPORTERS, model_builder
from embodied_rl.runtime.config import load_all_plugins
from embodied_rl.runtime.config_compose import one_line
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.init_from import RUN_CONFIG, InitFromError, InitSource, load_init_state
from embodied_rl.runtime.path_guard import check_apart, relation

CRITIC_FOLDER = "critic"


def export_run(
    run: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    step: int | None = None,
    critic: bool = False,
    force: bool = False,
) -> ExportResult:
    """Write the actor (and with ``critic`` the critic) of a run's checkpoint to ``out``.

    Args:
        run: the run folder (``config.yaml`` and ``checkpoints/step_N``).
        out: the export folder; must be new or empty unless ``force`` (then replaced).
        step: the checkpoint's step (``None``: the newest complete checkpoint).
        critic: also export ``models.critic`` into ``out/critic``.
        force: replace a non-empty ``out``.

    Raises:
        ConfigError: no such run or checkpoint, no such model, no exporter for its policy,
            or ``out`` is not empty; the message ends with the fix.
    """
    run_dir = Path(run).expanduser().resolve()
    out = Path(out).expanduser().resolve()
    config = _run_config(run_dir)
    ckpt = _checkpoint(run_dir, step)
    _check_out(out, run_dir, force)
    load_all_plugins(config)
    models = config.get("models") or {}
    roles = [("actor", _model_name(models, "actor", run_dir))]
    if critic:
        roles.append(("critic", _model_name(models, "critic", run_dir)))
    # Every model is built and loaded before anything is written.
    loaded = [(role, name, _load_model(run_dir, ckpt, name, models[name])) for role, name in roles]
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        written = []
        for role, name, model in loaded:
            exported = _write_model(role, name, models[name], model, partial)
            written.append(_relocated(exported, partial, out))  # as it will read from ``out``
        result = ExportResult(out, ckpt, int(checkpoint.read_manifest(ckpt)["step"]), written)
        write_model_card(partial, run_dir, config, result)
        _replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return result


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` as plain data."""
    fix = "point it at a run folder written by `embodied-rl train` (outputs/<config>/<run>)"
    if not run_dir.is_dir():
        raise ConfigError(f"export: the run folder {run_dir} does not exist", fix)
    if not (run_dir / RUN_CONFIG).is_file():
        raise ConfigError(f"export: {run_dir} has no {RUN_CONFIG}, so it is no run folder", fix)
    try:
        return OmegaConf.to_container(OmegaConf.load(run_dir / RUN_CONFIG), resolve=True)
    except Exception as err:  # noqa: BLE001 - yaml and omegaconf raise several types
        raise ConfigError(
            f"export: cannot read {run_dir / RUN_CONFIG} ({type(err).__name__}: {one_line(err)})",
            fix,
        ) from None


def _checkpoint(run_dir: Path, step: int | None) -> Path:
    """The checkpoint folder to export: ``step_N`` of ``step``, or the newest sealed one."""
    root = run_dir / "checkpoints"
    if step is None:
        newest = checkpoint.latest_checkpoint(root)
        if newest is None:
            raise ConfigError(
                f"export: {run_dir} has no complete checkpoint (no checkpoints/step_N whose "
                "manifest verifies), so there are no trained weights to export",
                "train with trainer.checkpoint_every > 0 (a run saves its last step), resume "
                "the run to write one, or export another run",
            )
        return newest
    ckpt = root / checkpoint.step_dir_name(step)
    problem = "does not exist" if not ckpt.is_dir() else checkpoint.verify_checkpoint(ckpt)
    if problem is not None:
        steps = [p.name for p in sorted(root.glob("step_*")) if p.is_dir()] if root.is_dir() else []
        raise ConfigError(
            f"export: checkpoint {ckpt} is unusable: {problem}",
            f"pass --step of a complete checkpoint ({', '.join(steps) or 'there is none'}), "
            "or leave --step out for the newest",
        )
    return ckpt


def _check_out(out: Path, run_dir: Path, force: bool) -> None:
    """``out`` must be apart from the run (``path_guard``: not it, not inside it, not holding
    it), new or empty unless ``force``, and ``force`` never empties the working directory."""
    check_apart("export --out", out, {"the run folder": run_dir}, "choose a folder of its own")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export: --out {out} is a file", "choose a folder path for --out")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ConfigError(
            f"export: --out {out} is not empty",
            "choose a new or empty folder, or add --force to replace its contents",
        )
    if relation(out, Path.cwd()) in ("is", "contains"):
        raise ConfigError(
            f"export: --out {out} holds the working directory, which --force would delete",
            "choose a folder of its own for the export",
        )


def _model_name(models: Mapping[str, Any], role: str, run_dir: Path) -> str:
    """``models.<role>``; for the actor, else the run's only trainable model."""
    if role in models:
        return role
    trainable = [m for m, entry in models.items() if entry.get("trainable", True)]
    if role == "actor" and len(trainable) == 1:
        return trainable[0]
    if role == "critic":
        raise ConfigError(
            f"export: the run {run_dir} has no models.critic (it has {sorted(models)})",
            "export without --critic (a critic is trained by the PPO configs)",
        )
    raise ConfigError(
        f"export: the run {run_dir} has no models.actor and not exactly one trainable model "
        f"(it has {sorted(models)})",
        "export a run whose policy is models.actor",
    )


def _load_model(run_dir: Path, ckpt: Path, name: str, entry: Mapping[str, Any]) -> Any:
    """``models.<name>`` built on the CPU from the run's options, with the checkpoint's
    weights and statistics buffers (as ``init_from`` loads them)."""
    policy, options = str(entry["policy"]), dict(entry.get("options") or {})
    if policy not in EXPORTERS:
        raise ConfigError(
            f"export: models.{name} is a {policy!r}, which has no exporter "
            f"(exporters: {', '.join(EXPORTERS.names())})",
            "register one with @EXPORTERS.register in the policy's package (see "
            "policies/export.py)",
        )
    try:
        state = load_init_state(InitSource(run_dir, ckpt, name, policy, options))
        model = model_builder(policy)(options, torch.device("cpu"))
        model.load_state_dict(state)
    except InitFromError as err:
        raise ConfigError(f"export: {err.problem}", err.fix) from None
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise ConfigError(
            f"export: cannot load models.{name} ({policy}) from {ckpt} "
            f"({type(err).__name__}: {one_line(err)})",
            "export a checkpoint that `embodied-rl train` wrote with this run's config.yaml "
            "(restore its files, or pass --step of another checkpoint)",
        ) from None
    return model.eval()


def _write_model(
    role: str, name: str, entry: Mapping[str, Any], model: Any, root: Path
) -> ExportedModel:
    """Write a loaded model with its policy's exporter into ``root`` (the actor) or
    ``root/critic``."""
    policy, options = str(entry["policy"]), dict(entry.get("options") or {})
    folder = root if role == "actor" else root / CRITIC_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    loading = EXPORTERS.get(policy)(model, options, folder)
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    return ExportedModel(role, name, policy, options, folder, loading, files)


def _relocated(model: ExportedModel, partial: Path, out: Path) -> ExportedModel:
    """``model`` as it reads once the folder it was written to, ``partial``, is ``out``."""

    def moved(value: Any) -> Any:
        return value.replace(str(partial), str(out)) if isinstance(value, str) else value

    options = model.loading.options
    loading = Exported(
        options=None if options is None else {k: moved(v) for k, v in options.items()},
        python=moved(model.loading.python),
        also={
            purpose: (name, policy, {k: moved(v) for k, v in entry_options.items()})
            for purpose, (name, policy, entry_options) in model.loading.also.items()
        },
    )
    folder = out / model.folder.relative_to(partial)
    return dataclasses.replace(model, folder=folder, loading=loading)


def _replace(partial: Path, out: Path) -> None:
    """Move the finished export into place; a replaced folder is removed only afterwards."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(partial, out)
        shutil.rmtree(old)
    else:
        os.replace(partial, out)
