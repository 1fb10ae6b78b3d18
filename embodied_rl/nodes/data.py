"""Source nodes: each data-parallel rank reads its own shard of prompts, task manifests or
demonstration steps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.dataloader import ShardedPromptLoader
from embodied_rl.data.demo_formats import resolve_demo_paths
from embodied_rl.data.demo_loader import (
    CAMERAS,
    DemoLoader,
    check_action_convention,
    check_cameras,
    check_frame_size,
    check_frame_sizes,
    select_demos,
)
from embodied_rl.data.demos import DemoInfo
from embodied_rl.data.lerobot import LeRobotFeatures
from embodied_rl.data.prompt_checks import check_file_head
from embodied_rl.data.prompt_files import open_source
from embodied_rl.data.tasks import (
    TaskManifestLoader,
    check_task_ids,
    manifest,
    padded_batch_size,
    split_init_states,
    split_size,
)
from embodied_rl.data.video_loader import VideoClipLoader, select_videos
from embodied_rl.runtime.context import NodeContext

REPO_ROOT = Path(__file__).resolve().parents[2]
LOADER_STATE = "loader"
STATISTICS_SOURCES = ("demos", "checkpoint")  # data.demos' statistics option


@dataclass
class PromptDataConfig:
    """Options of ``data.prompts`` (what happens to bad rows: ``embodied_rl.data.dataloader``).

    Attributes:
        path: JSONL or Parquet file with a ``prompt`` field (and ``answer`` for rule rewards).
            Relative paths are looked up from the working directory, then the repo root.
        batch_size: prompts per training step over ALL data-parallel ranks.
        shuffle: reshuffle every epoch (deterministic from the run seed).
        with_answers: every row must have an ``answer`` (rule rewards compare with it) and
            batches carry ANSWER_TEXT; ``false`` for data without answers.
        on_bad_row: ``error`` refuses a file with a malformed row or a missing field, naming
            the line; ``drop`` skips such rows and counts them (``data/dropped_malformed``,
            ``data/dropped_missing_field``). Empty prompts are always dropped and counted.
        max_prompt_length: drop (and count as ``data/dropped_too_long``) prompts with more
            tokens; set it to the rollout's ``max_prompt_length``, which refuses longer ones.
        tokenizer_model: the entry of ``models`` whose tokenizer counts the tokens (the
            rollout's model); needed with ``max_prompt_length``.
    """

    path: str = "assets/data/arithmetic_train.jsonl"
    batch_size: int = 8
    shuffle: bool = True
    with_answers: bool = True
    on_bad_row: str = "error"
    max_prompt_length: int | None = None
    tokenizer_model: str | None = None

    def __post_init__(self) -> None:
        check_range("batch_size", self.batch_size, 1)
        if self.on_bad_row not in ("error", "drop"):
            raise ValueError(f"on_bad_row must be 'error' or 'drop', got {self.on_bad_row!r}")
        check_range("max_prompt_length", self.max_prompt_length, 1)
        if (self.max_prompt_length is None) != (self.tokenizer_model is None):
            raise ValueError(
                "max_prompt_length and tokenizer_model go together: set both (e.g. "
                "max_prompt_length: ${rollout.max_prompt_length}, tokenizer_model: "
                "${rollout.model}) or neither"
            )
        try:  # fail at validation time, not inside a worker
            resolve_data_path(self.path)
        except FileNotFoundError as err:
            raise ValueError(str(err)) from None

    def required_fields(self) -> tuple[str, ...]:
        return ("prompt", "answer") if self.with_answers else ("prompt",)

    def check_inputs(self) -> None:
        """On the driver before workers start (``validate_config``): the file opens as JSONL
        or Parquet, has the needed columns, its first rows pass the row checks, and it holds
        one batch of usable (non-empty) prompts."""
        fields = self.required_fields()
        source = open_source(resolve_data_path(self.path), fields)
        check_file_head(source, fields, self.on_bad_row, batch_size=self.batch_size)


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


def token_counter(tokenizer: Any, limit: int) -> Callable[[list[str]], list[int]]:
    """Token counts of prompts as the LLM rollout tokenises them (the same call), for the
    loader's check against ``limit``; counts of prompts that cannot exceed it are bounds.

    No tokenizer emits more tokens than a text has UTF-8 bytes, plus the tokens it adds to
    any text (special tokens, a word-boundary marker): byte-level BPE, SentencePiece and
    WordPiece tokens each cover at least one byte. A prompt whose bound is within ``limit``
    is therefore not tokenised: with a generous limit the start-up check then costs JSON
    parsing alone, a small fraction of tokenising every row (measured:
    docs/benchmarks/code_figures.md).
    """
    overhead = len(tokenizer("")["input_ids"]) + 1

    def count(prompts: list[str]) -> list[int]:
        counts = [len(p.encode()) + overhead for p in prompts]
        unsure = [i for i, bound in enumerate(counts) if bound > limit]
        if unsure:
            exact = tokenizer([prompts[i] for i in unsure])["input_ids"]
            for i, ids in zip(unsure, exact):
                counts[i] = len(ids)
        return counts

    return count


def setup_loader(ctx: NodeContext) -> None:
    cfg: PromptDataConfig = ctx.node_config
    counter = None
    if cfg.tokenizer_model is not None and cfg.max_prompt_length is not None:
        counter = token_counter(ctx.models[cfg.tokenizer_model].tokenizer, cfg.max_prompt_length)
    ctx.state[LOADER_STATE] = ShardedPromptLoader(
        resolve_data_path(cfg.path),
        global_batch_size=cfg.batch_size,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=int(ctx.cfg.seed),
        shuffle=cfg.shuffle,
        required_fields=cfg.required_fields(),
        on_bad_row=cfg.on_bad_row,
        max_prompt_tokens=cfg.max_prompt_length,
        count_tokens=counter,
        exchange=ctx.gather_over_dp,
    )


def next_loader_batch(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's (B / dp) rows of the next step from the node's loader (prompts or tasks).

    Logs ``data/epoch`` and, for each reason rows were dropped when the loader started,
    ``data/dropped_<reason>`` (the same on every rank; absent when nothing was dropped).
    """
    loader: ShardedPromptLoader | TaskManifestLoader | DemoLoader | VideoClipLoader = ctx.state[
        LOADER_STATE
    ]
    out = loader.next_batch()
    ctx.metrics.log("data/epoch", loader.epoch, reduce="max")
    for reason, count in loader.dropped.items():
        ctx.metrics.log(f"data/dropped_{reason}", count, reduce="max")
    return out


def _prompt_keys(cfg: PromptDataConfig) -> tuple[str, ...]:
    return (K.PROMPT_TEXT, K.SAMPLE_ID) + ((K.ANSWER_TEXT,) if cfg.with_answers else ())


@register_node(
    "data.prompts",
    writes=_prompt_keys,
    source=True,
    config=PromptDataConfig,
    setup=setup_loader,
)
def prompts_node(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's prompt rows of the next step (``data.prompts``)."""
    return next_loader_batch(ctx, batch)


@dataclass
class TaskDataConfig:
    """Options of ``data.tasks``: which (task, init state) pairs a step trains on.

    Attributes:
        num_tasks / num_init_states: the simulator suite's sizes (from its config group).
        tasks: task ids to use, each once (``None``: all).
        split: ``train``, ``validation``, ``test``, ``heldout`` (validation and test) or
            ``all`` init states (``embodied_rl/data/tasks.py``).
        heldout_every: every n-th init state is held out for evaluation (0: none).
        batch_size: (task, init state) pairs per step over ALL ranks; each becomes a group of
            ``group_size`` rollouts in ``rollout.env``.
        shuffle: reshuffle every epoch.
        each_pair_once: evaluations: any batch_size (padded to a multiple of the ranks),
            rows that only repeat a pair marked PADDED and left out of the results
            (:class:`embodied_rl.data.tasks.TaskManifestLoader`).
    """

    num_tasks: int
    num_init_states: int
    tasks: list[int] | None = None
    split: str = "train"
    heldout_every: int = 5
    batch_size: int = 2
    shuffle: bool = True
    each_pair_once: bool = False

    def __post_init__(self) -> None:
        check_fields(self, ("num_tasks", "num_init_states", "batch_size"), 1)
        check_range("heldout_every", self.heldout_every, 0, note=" (0: none)")
        if self.tasks is not None:
            check_task_ids(self.tasks, self.num_tasks)
        split_size(self.num_init_states, self.heldout_every, self.split)

    def padded_batch_size(self, dp_size: int) -> int:
        """Rows per step over ``dp_size`` ranks: ``batch_size``, padded up to a multiple of
        them with ``each_pair_once`` (the DAG check asks every source node's config)."""
        return (
            padded_batch_size(self.batch_size, dp_size) if self.each_pair_once else self.batch_size
        )

    def ids_written(self) -> dict[str, tuple[int, str]]:
        """Batch key -> (exclusive bound of the ids this node draws, the setting that says so),
        checked against what the consuming rollout's simulator accepts (``validate_config``)."""
        if self.tasks is None:
            task_bound, task_setting = self.num_tasks, f"num_tasks={self.num_tasks}"
        else:
            task_bound, task_setting = max(self.tasks) + 1, f"tasks={list(self.tasks)}"
        inits = f"num_init_states={self.num_init_states}"
        return {
            K.TASK_ID: (task_bound, task_setting),
            K.INIT_STATE_ID: (self.num_init_states, inits),
        }

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
        each_pair_once=cfg.each_pair_once,
    )


def _task_keys(cfg: TaskDataConfig) -> tuple[str, ...]:
    return (K.TASK_ID, K.INIT_STATE_ID, K.SAMPLE_ID) + ((K.PADDED,) if cfg.each_pair_once else ())


@register_node(
    "data.tasks",
    writes=_task_keys,
    source=True,
    config=TaskDataConfig,
    setup=setup_task_loader,
)
def tasks_node(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's (task, init state) rows of the next step (``data.tasks``)."""
    return next_loader_batch(ctx, batch)


@dataclass
class DemoDataConfig:
    """Options of ``data.demos``: demonstration steps for behaviour cloning.

    Attributes:
        paths: LIBERO demo files (``*.hdf5``) or folders of them; relative paths are looked
            up from the working directory, then the repo root.
        model: the policy whose normaliser gets the demos' statistics before its first
            forward pass (the model ``sft.train`` trains).
        max_demos_per_task: keep the first n demos of each task (instruction); 1 is SRPO's
            one-demo SFT; ``None`` keeps all.
        cameras: ``[agentview]`` (the image the policy sees in rollouts), ``[agentview, wrist]``
            (OpenVLA-OFT with ``num_images_in_input: 2``) or ``[]`` (state only).
        image_size: resize frames to this side (the rollout's observation size), ``None``
            keeps the files' size.
        chunk: C, env actions per row (``actions[t : t + C]``, padded with the last action and
            masked at the episode end); must equal the policy's chunk.
        batch_size: demo steps per optimizer step over ALL data-parallel ranks.
        shuffle: reshuffle every epoch (deterministic from the run seed).
        random_shift: pad the images by this many pixels and crop back at a random offset
            (DrQ's augmentation; 0: off).
        heldout_every: the evaluation's split: demos that started from a held-out init state
            (every n-th, ``data.tasks``' rule) are refused; 0 holds nothing out.
        tasks: suite task indices to train on (``data.tasks``, the tasks the run evaluates);
            ``None`` keeps the demos of every task in ``paths``.
        suite: the simulator suite the run evaluates (``simulator.options.suite``): files that
            record another suite (``embodied_rl_suite``) are refused; files that record none
            (LIBERO's published ones, older files) pass. ``None``: not checked.
        lerobot: for ``paths`` that are LeRobot dataset folders: which features are the
            cameras, proprio and actions, the frames' orientation and the gripper convention
            (:class:`embodied_rl.data.lerobot.LeRobotFeatures`; ``None``: its defaults, the
            names of the LeRobot LIBERO conversions).
        resize_frames: frames of another size than ``image_size`` are resized; false refuses
            them (a pretraining corpus built for the run's size).
        statistics: ``demos``: the policy's action and proprio normalisation is set from the
            selected demos; ``checkpoint``: it keeps the statistics its ``init_from``
            checkpoint has (fine-tuning a pretrained policy in the action space it learned).
    """

    paths: list[str]
    model: str = "actor"
    max_demos_per_task: int | None = None
    cameras: list[str] = field(default_factory=lambda: list(CAMERAS[:1]))
    image_size: int | None = None
    chunk: int = 1
    batch_size: int = 32
    shuffle: bool = True
    random_shift: int = 0
    heldout_every: int = 5
    tasks: list[int] | None = None
    suite: str | None = None
    lerobot: dict[str, Any] | None = None
    resize_frames: bool = True
    statistics: str = "demos"

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("paths is empty; list demo files or folders (data.paths)")
        if self.statistics not in STATISTICS_SOURCES:
            raise ValueError(
                f"statistics={self.statistics!r}; expected one of {STATISTICS_SOURCES}"
            )
        self.lerobot_features = LeRobotFeatures.from_options(self.lerobot)
        check_cameras(self.cameras)
        check_fields(self, ("chunk", "batch_size"), 1)
        check_range("max_demos_per_task", self.max_demos_per_task, 1, note=" or null")
        check_range("image_size", self.image_size, 8, note=" or null")
        check_fields(self, ("random_shift", "heldout_every"), 0)

    def selected_demos(self) -> list[DemoInfo]:
        """The demos this node trains on, every file scanned and checked (metadata only)."""
        return select_demos(
            [str(p) for p in resolve_demo_paths(self.paths)],
            self.max_demos_per_task,
            self.heldout_every,
            tasks=self.tasks,
            suite=self.suite,
            lerobot=self.lerobot_features,
        )

    def check_inputs(self) -> None:
        """On the driver before workers start (``validate_config``): every demo file opens,
        has the LIBERO layout, is of ``suite``, of ``tasks``, from training init states, has
        the env's action convention, and its frames have one size (``image_size`` null) or
        that size (``resize_frames`` false)."""
        infos = self.selected_demos()
        if self.image_size is None and self.cameras:
            check_frame_sizes(infos)
        if self.image_size is not None and self.cameras and not self.resize_frames:
            check_frame_size(infos, self.image_size)
        check_action_convention(infos)


def setup_demo_loader(ctx: NodeContext) -> None:
    """Select and check the demos, build this rank's loader, set the policy's statistics."""
    cfg: DemoDataConfig = ctx.node_config
    loader = DemoLoader(
        cfg.selected_demos(),
        chunk=cfg.chunk,
        cameras=cfg.cameras,
        image_size=cfg.image_size,
        global_batch_size=cfg.batch_size,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=int(ctx.cfg.seed),
        shuffle=cfg.shuffle,
        shift=cfg.random_shift,
    )
    if cfg.statistics == "demos":  # from all selected demos on every rank: the same everywhere
        ctx.models[cfg.model].set_statistics(loader.statistics)
    ctx.state[LOADER_STATE] = loader


def _demo_keys(cfg: DemoDataConfig) -> tuple[str, ...]:
    keys = (K.OBS_STATE, K.PROMPT_TEXT, K.ACTIONS, K.RESPONSE_MASK, K.STEP_MASK, K.SAMPLE_ID)
    keys += (K.INIT_STATE_ID,)
    return keys + tuple(K.CAMERA_KEYS[camera] for camera in cfg.cameras)


@register_node(
    "data.demos",
    writes=_demo_keys,
    source=True,
    config=DemoDataConfig,
    setup=setup_demo_loader,
)
def demos_node(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's demonstration steps of the next update (``data.demos``)."""
    return next_loader_batch(ctx, batch)


@dataclass
class VideoDataConfig:
    """Options of ``data.videos``: clips of labelled episode videos (world-model pretraining).

    Attributes:
        paths: LIBERO demo files (successes) and episode video files (``rollout.save_episodes``:
            rollouts, successes and failures), or folders of them; relative paths are looked
            up from the working directory, then the repo root.
        num_frames: frames per clip (the world model's ``num_frames``).
        image_size: frames resized to this side (the rollouts' observation size).
        batch_size: clips per optimizer step over ALL data-parallel ranks.
        shuffle: reshuffle every epoch (deterministic from the run seed).
        prefix_prob: probability that a clip spans a random prefix of its episode instead of
            the whole episode.
        heldout_every: videos that started from a held-out init state (the evaluations'
            validation and test states) are left out; 0 holds nothing out.
        tasks: keep only videos of these suite task ids; ``None`` keeps all.
    """

    paths: list[str]
    num_frames: int = 16
    image_size: int = 64
    batch_size: int = 16
    shuffle: bool = True
    prefix_prob: float = 0.25
    heldout_every: int = 5
    tasks: list[int] | None = None

    def __post_init__(self) -> None:
        if not self.paths:
            raise ValueError("paths is empty; list video files or folders (data.paths)")
        check_fields(self, ("num_frames", "batch_size"), 1)
        check_range("image_size", self.image_size, 8)
        check_range("prefix_prob", self.prefix_prob, 0.0, 1.0)
        check_range("heldout_every", self.heldout_every, 0)

    def selected(self) -> tuple[list, dict[str, int]]:
        """The videos this node draws from and the counts left out (metadata only)."""
        paths = [str(p) for p in resolve_demo_paths(self.paths)]
        return select_videos(paths, self.heldout_every, self.tasks)

    def check_inputs(self) -> None:
        """On the driver before workers start: every file opens as a demo or episode video
        file and some videos are left to train on."""
        self.selected()


def setup_video_loader(ctx: NodeContext) -> None:
    """Select the videos and build this rank's clip loader."""
    cfg: VideoDataConfig = ctx.node_config
    infos, dropped = cfg.selected()
    ctx.state[LOADER_STATE] = VideoClipLoader(
        infos,
        num_frames=cfg.num_frames,
        image_size=cfg.image_size,
        global_batch_size=cfg.batch_size,
        dp_rank=ctx.dp_rank,
        dp_size=ctx.dp_size,
        seed=int(ctx.cfg.seed),
        shuffle=cfg.shuffle,
        prefix_prob=cfg.prefix_prob,
        dropped=dropped,
    )


@register_node(
    "data.videos",
    writes=(K.FRAMES, K.FRAME_COUNT, K.SUCCESS, K.TASK_ID, K.INIT_STATE_ID, K.SAMPLE_ID),
    source=True,
    config=VideoDataConfig,
    setup=setup_video_loader,
)
def videos_node(ctx: NodeContext, batch: None) -> TensorDict:
    """This rank's video clips of the next update (``data.videos``)."""
    return next_loader_batch(ctx, batch)
