"""The model card (``README.md``) of an ``embodied-rl export`` folder.

Written from the run folder alone: how to load each exported model, the command lines that
trained it (``command.txt``, written by the CLI), the data it was trained on (the config's
``data`` and ``simulator`` sections), the evaluation results (``<run_dir>/<name>/results.jsonl``
of ``eval.report``, and the success and reward metrics of the exported step's
``metrics.jsonl`` row) and the whole resolved config. The YAML front matter is the Hugging
Face Hub's model card metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.eval_episodes import RESULTS_FILE
from embodied_rl.export.result import ExportedModel, ExportResult
from embodied_rl.metrics import METRICS_FILE, read_metrics
from embodied_rl.runtime.init_from import RUN_CONFIG
from embodied_rl.runtime.run_folder import COMMAND_FILE

CARD_FILE = "README.md"


def write_model_card(
    folder: Path, run_dir: Path, config: Mapping[str, Any], result: ExportResult
) -> Path:
    """Write ``folder/README.md`` for the models of ``result``, exported from ``run_dir``."""
    sections = [
        _front_matter(result),
        _summary(run_dir, config, result),
        _files(result),
        *(_loading(model) for model in result.models),
        _command(run_dir),
        _data(config),
        _evaluation(run_dir, result.step),
        "## Training config\n\nThe run's resolved `config.yaml`:\n\n"
        + _block("yaml", (run_dir / RUN_CONFIG).read_text()),
    ]
    path = folder / CARD_FILE
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path


def _block(language: str, text: str) -> str:
    return f"```{language}\n{text.rstrip()}\n```"


def _yaml(value: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(value))


def _front_matter(result: ExportResult) -> str:
    tags = [
        "embodied-rl",
        "reinforcement-learning",
        *dict.fromkeys(m.policy for m in result.models),
    ]
    return "---\nlibrary_name: embodied_rl\ntags:\n" + "".join(f"- {t}\n" for t in tags) + "---"


def _summary(run_dir: Path, config: Mapping[str, Any], result: ExportResult) -> str:
    actor = result.models[0]
    manifest = checkpoint.read_manifest(result.checkpoint)
    hashes = ", ".join(f"`{name}` {entry['sha256']}" for name, entry in manifest["files"].items())
    return (
        f"# {config.get('name')}: {actor.policy} policy after {result.step} steps\n\n"
        f"Exported by `embodied-rl export` from the run folder `{run_dir}`, checkpoint "
        f"`{result.checkpoint.relative_to(run_dir)}` (sha256 of its shards: {hashes}). This "
        "folder holds everything the models below need; the run folder does not have to exist."
    )


def _files(result: ExportResult) -> str:
    lines = ["## Files", "", "| model | policy | folder | files |", "|---|---|---|---|"]
    for model in result.models:
        where = model.folder.relative_to(result.out).as_posix()
        lines.append(
            f"| {model.role} (`models.{model.model}`) | `{model.policy}` | `{where}/` "
            f"| {', '.join(f'`{f}`' for f in model.files)} |"
        )
    lines += [
        "",
        "`dataset_statistics.json`, where present, holds the action (and proprio) "
        "normalisation statistics in OpenVLA's `norm_stats` format.",
    ]
    return "\n".join(lines)


def _loading(model: ExportedModel) -> str:
    parts = [f"## Load the {model.role}"]
    if model.loading.python:
        parts.append(_block("python", model.loading.python))
    if model.loading.options is not None:
        entry = {"models": {model.role: {"policy": model.policy, "options": model.loading.options}}}
        parts += [
            "In an `embodied_rl` run (evaluation, fine-tuning), as the model entry:",
            _block("yaml", _yaml(entry)),
            "or in Python: `embodied_rl.registry.model_builder(policy)(options, 'cpu')` after "
            "`import policies`.",
        ]
    for purpose, (name, policy, options) in model.loading.also.items():
        entry = {"models": {name: {"policy": policy, "options": options}}}
        parts += [f"{purpose}, as the model entry:", _block("yaml", _yaml(entry))]
    return "\n\n".join(parts)


def _command(run_dir: Path) -> str:
    path = run_dir / COMMAND_FILE
    if not path.is_file():
        return (
            "## Training command\n\nNot recorded: the run was started through the Python API "
            "(`embodied_rl.launch.launcher.launch`), not the `embodied-rl` command. The "
            "config below is complete: `embodied-rl train --config-name <its name>` with its "
            "values as overrides reproduces it."
        )
    return (
        "## Training command\n\nEvery attempt of the run (the first trains, later ones "
        f"resume), from `{COMMAND_FILE}`:\n\n" + _block("bash", path.read_text())
    )


def _data(config: Mapping[str, Any]) -> str:
    shown = {key: config[key] for key in ("data", "simulator") if config.get(key) is not None}
    if not shown:
        return "## Data\n\nThe config has no `data` or `simulator` section."
    return (
        "## Data\n\nWhat the run trained on (its config's `data` and `simulator` sections):\n\n"
        + _block("yaml", _yaml(shown))
    )


def _evaluation(run_dir: Path, step: int) -> str:
    parts = ["## Evaluation"]
    for results in sorted(run_dir.glob(f"*/{RESULTS_FILE}")):
        rows = [r for r in read_metrics(results) if r["step"] <= step]
        if rows:
            parts.append(_results_tables(results.parent.name, rows))
    metrics = _metrics_at(run_dir, step)
    if metrics:
        lines = ["| metric | value |", "|---|---:|"]
        lines += [f"| `{key}` | {value:.4g} |" for key, value in metrics.items()]
        parts.append(f"Metrics of the last trained step ({METRICS_FILE}):\n\n" + "\n".join(lines))
    if len(parts) == 1:
        parts.append("No evaluation results in the run folder (no `eval_dag`, or none ran).")
    return "\n\n".join(parts)


def _results_tables(name: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Overall success per evaluated step, then the per-task table of the last one."""
    steps = sorted({r["step"] for r in rows})
    lines = [f"### `{name}` (`{name}/{RESULTS_FILE}`)", ""]
    lines += ["| step | episodes | successes | success rate |", "|---:|---:|---:|---:|"]
    for s in steps:
        episodes = sum(r["episodes"] for r in rows if r["step"] == s)
        successes = sum(r["successes"] for r in rows if r["step"] == s)
        lines.append(f"| {s} | {episodes} | {successes} | {successes / max(episodes, 1):.3f} |")
    lines += ["", f"Per task at step {steps[-1]}:", ""]
    lines += [
        "| task | instruction | episodes | successes | success rate |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in (r for r in rows if r["step"] == steps[-1]):
        instruction = str(r.get("instruction", "")).replace("|", "\\|")
        lines.append(
            f"| {r['task']} | {instruction} | {r['episodes']} | {r['successes']} "
            f"| {r['success_rate']:.3f} |"
        )
    return "\n".join(lines)


def _metrics_at(run_dir: Path, step: int) -> dict[str, float]:
    """Success and reward metrics of the row of the last trained step (``step - 1``)."""
    rows = [r for r in read_metrics(run_dir / METRICS_FILE) if r["step"] == max(step - 1, 0)]
    if not rows:
        return {}
    return {
        key: float(value)
        for key, value in sorted(rows[-1].items())
        if key.endswith("success_rate") or key.startswith("reward/")
    }
