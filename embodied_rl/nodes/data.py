"""Source nodes: each data-parallel rank reads its own shard of prompts or task manifests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.dataloader import ShardedPromptLoader
from embodied_rl.data.tasks import TaskManifestLoader, manifest, split_init_states
from embodied_rl.runtime.context import NodeContext

REPO_ROOT = Path(__file__).resolve().parents[2]
LOADER_STATE = "loader"


@dataclass
class PromptDataConfig:
    """Options of ``data.prompts``.

    Attributes:
        path: JSONL or Parquet file with a ``prompt`` field (and ``answer`` for rule rewards).
            Relative paths are looked up from the working directory, then the repo root.
        batch_size: prompts per training step over ALL data-parallel ranks.
        shuffle: reshuffle every epoch (deterministic from the run seed).
        on_bad_row: ``error`` stops at a malformed row; ``drop`` skips and counts it.
    """

    path: str = "assets/data/arithmetic_train.jsonl"
    batch_size: int = 8
    shuffle: bool = True
    on_bad_row: str = "error"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.on_bad_row not in ("error", "drop"):
            raise ValueError(f"on_bad_row must be 'error' or 'drop', got {self.on_bad_row!r}")
        try:  # fail at validation time, not inside a worker
            resolve_data_path(self.path)
        except FileNotFoundError as err:
            raise ValueError(str(err)) from None


def resolve_data_path(path: str) -> Path:
    """``path`` as given if it exists, else relative to the repo root; clear error otherwise."""
    candidate = Path(path).expanduser()
    if candidate.exists():
        return candidate.resolve()
    from_repo = REPO_ROOT / path
    if from_repo.exists():
        return from_repo
    places = sorted({str(Path.cwd()), str(REPO_ROOT)})
    raise FileNotFoundError(
        f"data file {path!r} not found (looked in {' and '.join(places)}); "
        "set data.train_path to an existing JSONL or Parquet file"
    )


def setup_loader(ctx: NodeContext) -> None:
    cfg: PromptDataConfig = ctx.node_config
    ctx.state[LOADER_STATE] = ShardedPromptLoader(
        resolve_data_path(cfg.path),
        global_batch_size=cfg.batch_size,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=int(ctx.cfg.seed),
        shuffle=cfg.shuffle,
        on_bad_row=cfg.on_bad_row,
    )


def next_loader_batch(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's (B / dp) rows of the next step from the node's loader (prompts or tasks)."""
    loader: ShardedPromptLoader | TaskManifestLoader = ctx.state[LOADER_STATE]
    out = loader.next_batch()
    ctx.metrics.log("data/epoch", loader.epoch, reduce="max")
    return out


register_node(
    "data.prompts",
    writes=(K.PROMPT_TEXT, K.ANSWER_TEXT, K.SAMPLE_ID),
    source=True,
    config=PromptDataConfig,
    setup=setup_loader,
)(next_loader_batch)


@dataclass
class TaskDataConfig:
    """Options of ``data.tasks``: which (task, init state) pairs a step trains on.

    Attributes:
        num_tasks / num_init_states: the simulator suite's sizes (from its config group).
        tasks: task ids to use (``None``: all).
        split: ``train``, ``heldout`` or ``all`` init states.
        heldout_every: every n-th init state is held out for evaluation (0: none).
        batch_size: (task, init state) pairs per step over ALL ranks; each becomes a group of
            ``group_size`` rollouts in ``rollout.env``.
        shuffle: reshuffle every epoch.
    """

    num_tasks: int = 1
    num_init_states: int = 1
    tasks: list[int] | None = None
    split: str = "train"
    heldout_every: int = 5
    batch_size: int = 2
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.tasks is not None:
            bad = [t for t in self.tasks if not 0 <= t < self.num_tasks]
            if bad:
                raise ValueError(f"task ids {bad} are outside 0..{self.num_tasks - 1}")
        split_init_states(self.num_init_states, self.heldout_every, self.split)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    def rows(self) -> list[tuple[int, int]]:
        tasks = self.tasks if self.tasks is not None else list(range(self.num_tasks))
        return manifest(
            tasks, split_init_states(self.num_init_states, self.heldout_every, self.split)
        )


def setup_task_loader(ctx: NodeContext) -> None:
    cfg: TaskDataConfig = ctx.node_config
    ctx.state[LOADER_STATE] = TaskManifestLoader(
        cfg.rows(),
        global_batch_size=cfg.batch_size,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=int(ctx.cfg.seed),
        shuffle=cfg.shuffle,
    )


register_node(
    "data.tasks",
    writes=(K.TASK_ID, K.INIT_STATE_ID, K.SAMPLE_ID),
    source=True,
    config=TaskDataConfig,
    setup=setup_task_loader,
)(next_loader_batch)
