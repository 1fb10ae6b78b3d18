"""``rollout.save_episodes``: a rollout's episodes as labelled videos, for world-model pretraining.

The rollout (``rollout.env`` with ``keep_frames: true``) keeps the frames the policy saw,
FRAMES ``(B, T, H, W, 3)`` with FRAME_COUNT ``(B,)`` valid frames each. This node writes every
episode of this rank's batch, cut to its valid frames and labelled with its task, init state,
instruction, outcome and privileged progress, to one episode video file per step and dp shard
(:func:`~embodied_rl.data.episode_videos.write_episode_videos`)::

    <run_dir>/<name>/step_000003/rank_0.hdf5     the episodes of dp shard 0 at step 3

``<R>`` is the global rank that writes the shard (its first rank; the shard's other tp ranks
hold the same rows and write nothing). ``scan_videos`` / ``read_clip`` read them back, mixed
with LIBERO demo files. The batch passes through unchanged; the node logs ``<name>/episodes``
and ``<name>/successes`` (summed over the shards). ``configs/record_libero.yaml`` is a job
that only records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, strings
from embodied_rl.data.episode_videos import EpisodeVideo, write_episode_videos
from embodied_rl.eval_episodes import check_folder_name, step_folder
from embodied_rl.runtime.context import NodeContext


@dataclass
class SaveEpisodesConfig:
    """Options of ``rollout.save_episodes``.

    Attributes:
        name: folder under the run dir and metric prefix (``<name>/episodes``).
        suite: recorded in each file (e.g. ``libero_object``); ``""`` when unknown.
    """

    name: str = "episodes"
    suite: str = ""

    def __post_init__(self) -> None:
        check_folder_name(self.name)


def episode_videos(batch: TensorDict, origin: str) -> list[EpisodeVideo]:
    """Every episode of ``batch``, its FRAMES cut to its FRAME_COUNT (at least one frame).

    Raises:
        ValueError: an episode has no valid frame (FRAME_COUNT < 1).
    """
    frames, counts = batch[K.FRAMES], batch[K.FRAME_COUNT].tolist()
    texts = strings(batch, K.PROMPT_TEXT)
    columns = zip(
        batch[K.TASK_ID].tolist(), batch[K.INIT_STATE_ID].tolist(), batch[K.SUCCESS].tolist()
    )
    progress = (
        batch[K.PRIVILEGED_PROGRESS].tolist()
        if K.PRIVILEGED_PROGRESS in batch.keys()
        else [math.nan] * len(counts)
    )
    videos = []
    for i, (task, init_state, success) in enumerate(columns):
        if not 1 <= counts[i] <= frames.shape[1]:
            raise ValueError(
                f"episode {i}: FRAME_COUNT {counts[i]} is outside [1, {frames.shape[1]}] "
                "(the frames kept); is the rollout's keep_frames on?"
            )
        videos.append(
            EpisodeVideo(
                frames=frames[i, : counts[i]].numpy(),
                instruction=str(texts[i]),
                success=bool(success),
                task=int(task),
                init_state=int(init_state),
                origin=origin,
                progress=float(progress[i]),
            )
        )
    return videos


def write_step(path: Path, videos: list[EpisodeVideo], suite: str) -> None:
    """Write ``videos`` to ``path``, replacing a file of the same step and rank.

    Such a file can only come from an interrupted run: a resumed run restarts at its last
    checkpoint and records the steps after it again (a new rollout, other episodes). The
    writer refuses to overwrite, so that file, the stale one, is removed first; the step's
    files then hold the episodes of the run that reached the end.
    """
    path.unlink(missing_ok=True)
    write_episode_videos(path, videos, suite)


SAVE_READS = (
    K.FRAMES, K.FRAME_COUNT, K.TASK_ID, K.INIT_STATE_ID, K.SUCCESS, K.PROMPT_TEXT,
)  # fmt: skip


@register_node("rollout.save_episodes", reads=SAVE_READS, config=SaveEpisodesConfig)
def save_episodes(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Write this dp shard's episodes (its first rank does) and log the counts; batch unchanged.

    Reads FRAMES (B, T, H, W, 3) uint8, FRAME_COUNT (B,) int64, TASK_ID, INIT_STATE_ID (B,)
    int64, SUCCESS (B,) bool and PROMPT_TEXT (B strings).
    """
    cfg: SaveEpisodesConfig = ctx.node_config
    writer = ctx.layout.shard_ranks(ctx.dp_rank)[0]
    n = batch_len(batch) if ctx.rank == writer else 0
    successes = int(batch[K.SUCCESS].sum()) if n else 0
    if n:  # an empty batch writes no file
        origin = f"rollout step {ctx.step} rank {ctx.rank}"
        path = step_folder(ctx.run_dir, cfg.name, ctx.step) / f"rank_{ctx.rank}.hdf5"
        write_step(path, episode_videos(batch, origin), cfg.suite)
    ctx.metrics.log(f"{cfg.name}/episodes", n, reduce="sum")
    ctx.metrics.log(f"{cfg.name}/successes", successes, reduce="sum")
    return batch
