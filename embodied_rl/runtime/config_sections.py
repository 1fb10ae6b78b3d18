"""The typed sections of a run config (``workers``, ``trainer``, ``ray``, ``eval``), the
top-level scalars, and which top-level keys a run config may have.

Each section is a dataclass whose ``__post_init__`` checks its ranges; :func:`section`
builds one from the composed config with unknown keys and wrong types as ConfigErrors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig

from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import NodeConfigError, build_dataclass
from embodied_rl.data.tasks import SPLITS
from embodied_rl.runtime.config_errors import ConfigError, did_you_mean, plain_value

# One worker per device: more than this is a typo, and would only stall the validator.
MAX_WORKERS = 1 << 16


@dataclass
class RunOptions:
    """The top-level scalars of a run config (the sections are checked on their own)."""

    name: str
    seed: int = 0
    device: str = "cpu"
    resume: bool = False
    overwrite: bool = False  # a fresh run may replace the run in run_dir (run_folder.py)
    run_dir: str | None = None
    output_root: str = "outputs"
    plugins: list[str] | None = None

    def __post_init__(self) -> None:
        check_range("seed", self.seed, 0)


@dataclass
class WorkersConfig:
    """``workers``: one DAG worker per device bundle."""

    num_workers: int = 2
    cpus_per_worker: float = 1.0
    torch_threads: int = 1

    def __post_init__(self) -> None:
        check_fields(self, ("num_workers", "cpus_per_worker", "torch_threads"), 0, low_open=True)
        check_range("num_workers", self.num_workers, high=MAX_WORKERS)


WANDB_MODES = ("offline", "online")


@dataclass
class WandbConfig:
    """``trainer.wandb``: the Weights & Biases run (with ``wandb`` in ``trainer.loggers``).

    Attributes:
        project: the W&B project.
        entity: the W&B team or user (``null``: the account's default; online mode only).
        mode: ``offline`` writes the run under ``<dir>/wandb/`` and needs no network or
            account (upload later with ``wandb sync``); ``online`` streams it to the server.
        dir: where W&B writes (``null``: the run directory).
    """

    project: str = "embodied_rl"
    entity: str | None = None
    mode: str = "offline"
    dir: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(f"mode must be one of {list(WANDB_MODES)}, got {self.mode!r}")


@dataclass
class MlflowConfig:
    """``trainer.mlflow``: the MLflow run (with ``mlflow`` in ``trainer.loggers``).

    Attributes:
        tracking_uri: the tracking store (``null``: ``file:<run_dir>/mlruns``, a local file
            store; ``http://host:5000`` for a tracking server).
        experiment: the experiment name (``null``: the run config's ``name``).
    """

    tracking_uri: str | None = None
    experiment: str | None = None


@dataclass
class TrainerConfig:
    """``trainer``: the step loop around the DAG.

    ``time_limit_min`` ends training early: after the step during which that many minutes of
    training wall time (``time/elapsed_s``, resumed attempts included) have passed, with the
    final evaluation and checkpoint; ``null`` runs all ``total_steps``.

    ``preempt_grace_s``: after SIGTERM (what Slurm and Kubernetes send before they preempt a
    job) the workers finish the step in progress and checkpoint it, if that takes at most this
    many seconds; past it (or with 0) they are stopped at once, and only the checkpoints
    saved before remain (``runtime/preemption.py``).

    ``loggers``: run logs besides ``metrics.jsonl`` and ``metrics.png`` (always written):
    ``tensorboard`` (scalars from rank 0's worker), ``wandb`` and ``mlflow`` (experiment
    trackers fed by the driver, configured by ``wandb`` and ``mlflow``; see
    ``embodied_rl/trackers/``).
    """

    total_steps: int = 10
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    collective_timeout_s: float = 300.0
    plot_keys: tuple[str, ...] = ("reward/mean",)
    log_to_console: bool = True  # rank 0 prints a line per step (off under a progress bar)
    time_limit_min: float | None = None
    preempt_grace_s: float = 60.0
    loggers: tuple[str, ...] = ("tensorboard",)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def __post_init__(self) -> None:
        check_fields(
            self, ("total_steps", "keep_checkpoints", "collective_timeout_s"), 0, low_open=True
        )
        check_fields(self, ("checkpoint_every", "preempt_grace_s"), 0)
        check_range("time_limit_min", self.time_limit_min, 0, low_open=True)
        self.loggers = tuple(self.loggers)  # names checked by check_loggers


# Here, beside trainer.loggers, not in trackers/: validation must not import the driver's
# trackers (they import the runtime), and the feed reads which loggers are trackers from here.
LOGGERS = ("tensorboard", "wandb", "mlflow")
# tracker -> (the module it imports, the pip package, the extra of pyproject.toml)
TRACKERS = {
    "wandb": ("wandb", "wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny", "mlflow"),
}


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse unknown ``trainer.loggers`` names and trackers whose package is not installed.

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
        positive = ("num_cpus", "poll_interval_s", "connect_timeout_s", "placement_timeout_s")
        check_fields(self, positive, 0, low_open=True)
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
        at_start: run it once before the first step (not when resuming): the starting
            policy's numbers, in the metrics row of step 0 and the report ``step_000000``.
        batch_size: (task, init state) pairs evaluated each time, over all workers.
        max_videos: videos written each time, over all workers.
        video_size: side of the video frames in pixels (every env step is drawn at this
            size for the videos; the policy's images keep theirs).
        suite_name: shown in the report's title (e.g. the LIBERO suite).
        split: init states evaluated: ``heldout`` (never trained on; the default),
            ``validation`` (half of them: the states to choose a configuration on), ``test``
            (the other half: touched once per reported run), ``train`` or ``all`` (see
            ``embodied_rl/data/tasks.py``). A held-out split that shares a state with the
            training rows is refused.
        name: metric prefix (``<name>/success_rate``) and report folder under the run dir;
            give another split its own, e.g. ``eval.split=train eval.name=eval_train``.
        tasks: the suite task ids evaluated. Not set: ``data.tasks``, the tasks the run
            trains on; ``null``: every task of the suite. Multi-task pretraining evaluates a
            fixed subset of its tasks (``configs/pretrain_libero90.yaml``).
    """

    every: int = 0
    at_end: bool = False
    at_start: bool = False
    batch_size: int = 8
    max_videos: int = 8
    video_size: int = 256
    suite_name: str = ""
    split: str = "heldout"
    name: str = "eval"
    tasks: list[int] | None = None

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, 0, low_open=True)
        check_fields(self, ("every", "max_videos"), 0)
        check_range("video_size", self.video_size, 1, note=" (pixels)")
        if self.split not in SPLITS:
            raise ValueError(f"eval.split must be one of {SPLITS}, got {self.split!r}")
        if self.at_start and self.every == 1:
            # Both evaluations would be logged in the metrics row of step 0 and averaged.
            raise ValueError(
                "eval.at_start=true with eval.every=1: the evaluation before the first step and "
                "the one after it would share the metrics row of step 0; set eval.every=0 or >= 2"
            )


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
    "record",  # what rollout.save_episodes writes (configs/record_libero.yaml)
    "agents",  # per-agent settings of a multi-agent DAG (e.g. each agent's workers)
)
TOP_LEVEL = (
    {f.name for f in fields(RunOptions)}
    | set(SECTIONS)
    | set(NODE_FED_SECTIONS)
    | {"models", "dag", "eval_dag"}
)


def section(cfg: DictConfig | Mapping[str, Any], name: str) -> Any:
    """The typed dataclass of a section; unknown keys and wrong types are ConfigErrors."""
    raw = plain_value(cfg, name)
    try:
        return build_dataclass(SECTIONS[name], {} if raw is None else raw, name)
    except NodeConfigError as err:
        raise ConfigError(err.problem, err.fix) from None
