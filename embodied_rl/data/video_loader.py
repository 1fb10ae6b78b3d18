"""Clips of labelled episode videos for world-model pretraining, sharded and resumable.

A *row* is one video (``embodied_rl/data/episode_videos.py``: LIBERO demos and recorded
rollouts, successes and failures). Each time a row is drawn, ``num_frames`` of its frames are
read: spread over the whole episode with the SRPO encoder's own rule
(``sample_frame_indices``: linspace, short episodes cycled), so the model learns on the
clips it will embed; with probability ``prefix_prob`` over a random prefix instead (episodes
cut short look like that), which also varies the clips of the few videos a task has. Frames
are resized to ``image_size`` so that videos of different sizes batch together.

Rows are drawn by :class:`~embodied_rl.data.sampler.EpochSampler` (the same permutation on
every rank, each rank its own slice); the draws are seeded by (run seed, epoch, step, rank),
so a resumed run reads the clips the interrupted one would have read.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.demo_loader import resize_frames
from embodied_rl.data.episode_videos import (
    VideoInfo,
    read_clip,
    sample_frame_indices,
    scan_videos,
)
from embodied_rl.data.sampler import EpochSampler
from embodied_rl.data.tasks import is_heldout


def select_videos(
    paths: Sequence[str], heldout_every: int, tasks: Sequence[int] | None = None
) -> tuple[list[VideoInfo], dict[str, int]]:
    """The videos to pretrain on, and how many were left out and why.

    Videos that started from a held-out init state (``heldout_every``, the evaluations'
    validation and test states) are left out, so an evaluation on those states scores videos
    the world model never saw; with ``tasks``, only videos that record one of those task ids.

    Raises:
        ValueError: nothing is left, naming the counts and the fix.
    """
    infos = scan_videos(paths)
    dropped: Counter[str] = Counter()
    kept = []
    for info in infos:
        if tasks is not None and info.task not in tasks:
            dropped["other_task"] += 1
        elif info.init_state is not None and is_heldout(info.init_state, heldout_every):
            dropped["heldout_init_state"] += 1
        else:
            kept.append(info)
    if not kept:
        raise ValueError(
            f"no videos to pretrain on: {len(infos)} found in {list(paths)}, left out "
            f"{dict(dropped)}. Fix: add videos of training init states (or of data.tasks)"
        )
    return kept, dict(dropped)


class VideoClipLoader:
    """This rank's clips of each step.

    Attributes:
        infos: the selected videos; dropped: videos left out at start-up, by reason.
        sampler: the sharded, resumable row order.
    """

    def __init__(
        self,
        infos: Sequence[VideoInfo],
        *,
        num_frames: int,
        image_size: int,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        prefix_prob: float = 0.0,
        dropped: dict[str, int] | None = None,
    ) -> None:
        if not infos:
            raise ValueError("no videos selected; check the video paths")
        self.infos = list(infos)
        self.num_frames, self.image_size, self.prefix_prob = num_frames, image_size, prefix_prob
        self.seed, self.dp_rank = seed, dp_rank
        self.dropped = dict(dropped or {})
        # Few videos: fill the last batch of an epoch with repeats rather than drop rows.
        self.sampler = EpochSampler(
            len(self.infos),
            global_batch_size=global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=False,
            source="the videos",
        )

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def clip(self, row: int, generator: torch.Generator) -> np.ndarray:
        """(num_frames, S, S, 3) uint8 of video ``row``: the whole episode or a random prefix."""
        info = self.infos[row]
        length = info.length
        if self.prefix_prob > 0 and torch.rand(1, generator=generator).item() < self.prefix_prob:
            length = int(torch.randint(1, info.length + 1, (1,), generator=generator).item())
        frames = read_clip(info, sample_frame_indices(length, self.num_frames).numpy())
        return resize_frames(frames, self.image_size)

    def next_batch(self) -> TensorDict:
        """This rank's clips of the next step.

        Returns:
            FRAMES (n, F, S, S, 3) uint8, FRAME_COUNT (n,) = F, SUCCESS (n,) bool, TASK_ID and
            INIT_STATE_ID (n,) int64 (-1 where the file records none), SAMPLE_ID (n,).
        """
        rows, sample_ids = self.sampler.current()
        key = f"{self.seed}/{self.sampler.epoch}/{self.sampler.step_in_epoch}/{self.dp_rank}"
        generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        self.sampler.advance()
        infos = [self.infos[r] for r in rows]
        clips = [torch.from_numpy(self.clip(r, generator)) for r in rows]
        frames = (
            torch.stack(clips)
            if clips
            else torch.zeros(
                0, self.num_frames, self.image_size, self.image_size, 3, dtype=torch.uint8
            )
        )
        fields = {
            K.FRAMES: frames,
            K.FRAME_COUNT: torch.full((len(rows),), self.num_frames, dtype=torch.int64),
            K.SUCCESS: torch.tensor([i.success for i in infos], dtype=torch.bool),
            K.TASK_ID: torch.tensor(
                [-1 if i.task is None else i.task for i in infos], dtype=torch.int64
            ),
            K.INIT_STATE_ID: torch.tensor(
                [-1 if i.init_state is None else i.init_state for i in infos], dtype=torch.int64
            ),
            K.SAMPLE_ID: torch.tensor(list(sample_ids), dtype=torch.int64),
        }
        return make_batch(fields)

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "videos": [info.source for info in self.infos]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses another set of videos."""
        sources = [info.source for info in self.infos]
        if state["videos"] != sources:
            raise ValueError(
                f"video loader state was saved for {len(state['videos'])} videos, this run "
                f"selects {len(sources)}; resume with the same video paths and heldout_every"
            )
        self.sampler.load_state_dict(state)
