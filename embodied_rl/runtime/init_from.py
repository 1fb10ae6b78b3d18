"""``models.<name>.init_from``: start a model from another run's checkpoint (SFT -> RL).

``init_from`` names a run directory (its newest complete checkpoint is used) or one of its
``checkpoints/step_N`` directories. The driver checks it before Ray starts
(:func:`check_init_from`, from ``validate_config``): the run's resolved ``config.yaml`` must
describe the same policy type and the same architecture options (whatever the policy's
builder lists in ``architecture_options``; runtime-only options such as the temperature or
the micro-batch size may differ), the checkpoint must hold the model, and an embodied
policy's normalisation statistics must be set in it. Each worker then loads the weights and
the statistics buffers right after building the model, before any sharding
(:func:`load_init_state`).

The model is found in the other run under the same name, else as its only trainable model.
Optimizer state, node state and the step are not taken: the new run starts at step 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from embodied_rl import checkpoint
from embodied_rl.registry import model_builder
from embodied_rl.runtime.config_compose import REPO_ROOT

RUN_CONFIG = "config.yaml"
# Simulator options that fix what a policy's inputs look like: a checkpoint trained on 64 px
# agentview frames means something else on 128 px frames or another camera set, even where
# the policy would resize them (OpenVLA-OFT) and run without an error.
OBSERVATION_OPTIONS = ("image_size", "cameras")
STATISTICS_FLAG = "normalizer.action.present"  # see policies/normalization.py


class InitFromError(ValueError):
    """``init_from`` cannot be used; ``problem`` and ``fix`` say why and what to change."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class InitSource:
    """Where an ``init_from`` model comes from.

    Attributes:
        run_dir: the run that trained it; checkpoint: its ``step_N`` directory.
        model: the model's name in that run; policy / options: its entry there.
        observation: that run's ``simulator.options`` among ``OBSERVATION_OPTIONS`` (empty
            for a run without a simulator).
    """

    run_dir: Path
    checkpoint: Path
    model: str
    policy: str
    options: dict[str, Any]
    observation: dict[str, Any] = field(default_factory=dict)


def _checkpoint_of(path: Path, where: str) -> tuple[Path, Path]:
    """(run dir, sealed checkpoint dir) of a run directory or a ``step_N`` directory."""
    fix = (
        "point it at a run directory (outputs/<config>/<run>) that finished a checkpoint "
        "(trainer.checkpoint_every > 0), or at one of its checkpoints/step_N directories"
    )
    if not path.exists():
        raise InitFromError(f"{where}: {path} does not exist", fix)
    if (path / checkpoint.MANIFEST).is_file():
        problem = checkpoint.verify_checkpoint(path, checksums=False)
        if problem is not None:
            raise InitFromError(f"{where}: checkpoint {path} is unusable: {problem}", fix)
        return path.parent.parent, path
    latest = checkpoint.latest_checkpoint(path / "checkpoints", checksums=False)
    if latest is None:
        raise InitFromError(
            f"{where}: {path} holds no complete checkpoint (no checkpoints/step_N with a "
            "manifest that verifies)",
            fix,
        )
    return path, latest


def _located(init_from: str) -> Path:
    """``init_from`` as an absolute path: a relative one is looked up from the working
    directory, then from the repository root (``assets/checkpoints/...`` works anywhere)."""
    path = Path(init_from).expanduser()
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path
    return path.resolve()


def resolve_init_source(init_from: str, name: str) -> InitSource:
    """The run, checkpoint and model entry ``models.<name>.init_from`` refers to."""
    where = f"models.{name}.init_from"
    run_dir, ckpt = _checkpoint_of(_located(init_from), where)
    config_file = run_dir / RUN_CONFIG
    if not config_file.is_file():
        raise InitFromError(
            f"{where}: {run_dir} has no {RUN_CONFIG} (the resolved config every run writes)",
            "point init_from at a run directory written by `embodied-rl train`",
        )
    config = OmegaConf.to_container(OmegaConf.load(config_file))
    models = config.get("models") or {}
    trainable = [m for m, entry in models.items() if entry.get("trainable", True)]
    model = name if name in models else (trainable[0] if len(trainable) == 1 else None)
    if model is None:
        raise InitFromError(
            f"{where}: the run {run_dir} has no model {name!r} and not exactly one trainable "
            f"model (it has {sorted(models)})",
            f"rename models.{name} to the run's model name, or use a run with one trainable model",
        )
    entry = models[model]
    options = dict(entry.get("options") or {})
    observation = observation_options(config.get("simulator"))
    return InitSource(run_dir, ckpt, model, str(entry["policy"]), options, observation)


def observation_options(simulator: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``OBSERVATION_OPTIONS`` a run config's ``simulator`` section sets."""
    options = (simulator or {}).get("options") or {}
    return {key: options[key] for key in OBSERVATION_OPTIONS if key in options}


def architecture(policy: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``policy`` that fix what its weights mean (defaults filled in)."""
    describe = getattr(model_builder(policy), "architecture_options", None)
    return dict(options) if describe is None else describe(options)


def _mismatches(source: InitSource, options: Mapping[str, Any], name: str) -> list[str]:
    try:
        theirs = architecture(source.policy, source.options)
        ours = architecture(source.policy, options)
    except ValueError as err:  # a policy's own option check
        raise InitFromError(
            f"models.{name}.options: {err}", f"correct models.{name}.options"
        ) from None
    return [
        f"{key}={theirs.get(key)!r} there, {ours.get(key)!r} here"
        for key in sorted(set(theirs) | set(ours), key=str)
        if theirs.get(key) != ours.get(key)
    ]


def check_init_from(
    name: str,
    policy: str,
    options: Mapping[str, Any],
    init_from: str,
    simulator: Mapping[str, Any] | None = None,
) -> None:
    """Refuse an ``init_from`` the model cannot start from (on the driver, before Ray).

    Args:
        simulator: this run's ``simulator`` section (``None``: no simulator); its observation
            options must equal the checkpoint run's.

    Raises:
        InitFromError: no complete checkpoint, another policy type, architecture or
            observation options that differ, no such model in the checkpoint, or no
            normalisation statistics.
    """
    try:
        _check(name, policy, options, init_from, observation_options(simulator))
    except InitFromError:
        raise
    except checkpoint.CorruptCheckpointError as err:
        raise InitFromError(
            f"models.{name}.init_from: {err}; it is not loaded",
            "restore the checkpoint's files (one shipped under assets/: git checkout -- "
            "assets/checkpoints), re-create it with the command recorded beside it, or point "
            "init_from at another checkpoint",
        ) from None
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as err:  # unreadable files
        raise InitFromError(
            f"models.{name}.init_from: cannot read {init_from!r} ({type(err).__name__}: {err})",
            "point init_from at a run directory written by `embodied-rl train`, or at one of "
            "its checkpoints/step_N directories",
        ) from None


def _check(
    name: str,
    policy: str,
    options: Mapping[str, Any],
    init_from: str,
    observation: Mapping[str, Any],
) -> None:
    where = f"models.{name}.init_from"
    source = resolve_init_source(init_from, name)
    if source.policy != policy:
        raise InitFromError(
            f"{where}: {source.run_dir} trained a {source.policy!r} policy (models."
            f"{source.model}), this config builds {policy!r}",
            f"set models.{name}.policy={source.policy} with its options (e.g. the policy= group "
            "the SFT run used), or point init_from at a run of this policy",
        )
    different = _mismatches(source, options, name)
    if different:
        raise InitFromError(
            f"{where}: {source.run_dir} trained models.{source.model} with other architecture "
            f"options ({'; '.join(different)}); its weights mean something else here",
            f"set the models.{name}.options above to the values 'there', or train the "
            "checkpoint with this config's options",
        )
    seen = [
        f"simulator.options.{key}={source.observation[key]!r} there, {observation[key]!r} here"
        for key in OBSERVATION_OPTIONS
        if key in source.observation
        and key in observation
        and source.observation[key] != observation[key]
    ]
    if seen:
        raise InitFromError(
            f"{where}: {source.run_dir} trained models.{source.model} on other observations "
            f"({'; '.join(seen)}); its weights never saw these inputs",
            "set the simulator.options above to the values 'there', or train the checkpoint "
            "with this config's simulator options",
        )
    state = load_init_state(source)
    if STATISTICS_FLAG in state and not bool(state[STATISTICS_FLAG]):
        raise InitFromError(
            f"{where}: checkpoint {source.checkpoint} has no action normalisation statistics "
            "(its policy never saw demonstrations)",
            "start from a run of the sft DAG (data.demos sets the statistics), or remove init_from",
        )


def load_init_state(source: InitSource | str, name: str = "") -> dict[str, Any]:
    """The model's full state dict (weights and statistics buffers) in the checkpoint.

    Args:
        source: an :class:`InitSource`, or the ``init_from`` path of ``models.<name>``.
    """
    if not isinstance(source, InitSource):
        source = resolve_init_source(source, name)
    models = checkpoint.load_entry(source.checkpoint, "models")
    key = f"model/{source.model}"
    if key not in models:
        raise InitFromError(
            f"checkpoint {source.checkpoint} has no weights of models.{source.model} (it holds "
            f"{sorted(models)}; frozen models are not saved)",
            "start from a run in which the model was trainable",
        )
    return models[key]
