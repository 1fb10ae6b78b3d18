"""Evaluated episodes: the metadata ranks exchange, which get a video, where outputs go.

What ``eval.report`` (``embodied_rl/nodes/eval.py``) and ``rollout.videos``
(``rollout/videos.py``) share: an :class:`Episode` per evaluated episode (no frames), gathered
over the data-parallel group so that every rank sees all of them; :func:`select_videos`, the
choice of the episodes to show (the same on every rank); the output folder of a step.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import batch_len, strings
from embodied_rl.runtime.context import NodeContext

# What an evaluation writes: <run>/<name>/results.jsonl (one row per step and task), and per
# step <run>/<name>/step_N/ with the reports, the chart and the videos. The trackers and the
# model card read them too.
RESULTS_FILE = "results.jsonl"
REPORT_HTML = "report.html"
REPORT_MD = "report.md"
CHART_FILE = "success_by_task.png"


def check_folder_name(name: str) -> None:
    """``name`` (an evaluation's metric prefix and folder) must be a plain folder name."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain folder name like 'eval', got {name!r}")


@dataclass(frozen=True)
class Episode:
    """Metadata of one evaluated episode (what the ranks exchange; no frames).

    Attributes:
        task / init_state: the LIBERO-style task id and init state id.
        success: the episode succeeded.
        instruction: the language instruction (PROMPT_TEXT).
        dp_rank / index: the dp shard holding it and its row in that shard's batch.
        writer: global rank that writes its video (tp rank 0 of the shard).
        video: its video was written (HAS_VIDEO).
        progress: its privileged progress at the end (PRIVILEGED_PROGRESS), NaN where the
            simulator has none.
    """

    task: int
    init_state: int
    success: bool
    instruction: str
    dp_rank: int
    index: int
    writer: int
    video: bool = False
    progress: float = math.nan

    @property
    def outcome(self) -> str:
        return "success" if self.success else "failure"

    @property
    def video_name(self) -> str:
        return f"task{self.task}_init{self.init_state}_{self.outcome}_r{self.writer}.mp4"


def local_episodes(ctx: NodeContext, batch: TensorDict) -> list[Episode]:
    """This rank's episodes, in batch order; rows marked PADDED (repeats that only fill the
    batch) are not episodes of the evaluation."""
    n = batch_len(batch)
    if n == 0:
        return []
    writer = ctx.layout.shard_ranks(ctx.dp_rank)[0]
    videos = batch[K.HAS_VIDEO].tolist() if K.HAS_VIDEO in batch.keys() else [False] * n
    texts = strings(batch, K.PROMPT_TEXT)
    columns = zip(
        batch[K.TASK_ID].tolist(), batch[K.INIT_STATE_ID].tolist(), batch[K.SUCCESS].tolist()
    )
    padded = padded_rows(batch).tolist()
    progress = (
        batch[K.PRIVILEGED_PROGRESS].tolist()
        if K.PRIVILEGED_PROGRESS in batch.keys()
        else [math.nan] * n
    )
    return [
        Episode(
            int(t), int(s), bool(ok), str(texts[i]), ctx.dp_rank, i, writer, bool(videos[i]),
            float(progress[i]),
        )
        for i, (t, s, ok) in enumerate(columns)
        if not padded[i]
    ]  # fmt: skip


def padded_rows(batch: TensorDict) -> torch.Tensor:
    """(B,) bool: the rows marked PADDED (all False without the key)."""
    if K.PADDED in batch.keys():
        return batch[K.PADDED].bool()
    return torch.zeros(batch_len(batch), dtype=torch.bool)


def gather_episodes(ctx: NodeContext, local: list[Episode]) -> list[Episode]:
    """Every dp rank's episodes, concatenated in dp-rank order (a collective on the group)."""
    if ctx.dp_group is None or ctx.dp_size == 1:
        return list(local)
    parts = ctx.gather_over_dp([asdict(e) for e in local])
    return [Episode(**record) for part in parts for record in part]


def select_videos(episodes: Sequence[Episode], max_videos: int) -> list[Episode]:
    """Episodes to record, the same on every rank given the same gathered list.

    Per task, the videos alternate success, failure, success, ..., keeping one episode per
    (init state, outcome), then show the outcome that has more. Tasks take turns (in task
    order) until ``max_videos`` are chosen, so every task gets a video before any gets two.
    Each pick among the episodes of one (task, outcome) takes the one whose writer has the
    fewest chosen videos so far, then the first gathered: a rank replays the videos it
    writes one after another, so spread over the ranks they take a fraction of the time
    (the main job's two 256 px videos: about 115 s on one rank).
    """
    per_kind: dict[tuple[int, bool], list[Episode]] = {}
    seen: set[tuple[int, int, bool]] = set()
    for e in episodes:
        key = (e.task, e.init_state, e.success)
        if key not in seen:
            seen.add(key)
            per_kind.setdefault((e.task, e.success), []).append(e)
    queues = []
    for task in sorted({task for task, _ in per_kind}):
        successes = len(per_kind.get((task, True), ()))
        failures = len(per_kind.get((task, False), ()))
        outcomes = [True, False] * min(successes, failures)
        outcomes += [successes > failures] * abs(successes - failures)
        queues.append([(task, outcome) for outcome in outcomes])
    kinds: list[tuple[int, bool]] = []
    depth = 0
    while len(kinds) < max_videos and any(depth < len(q) for q in queues):
        kinds += [q[depth] for q in queues if depth < len(q)][: max_videos - len(kinds)]
        depth += 1
    chosen: list[Episode] = []
    load: Counter[int] = Counter()
    for kind in kinds:
        pool = per_kind[kind]
        pick = min(range(len(pool)), key=lambda i: (load[pool[i].writer], i))
        chosen.append(pool.pop(pick))
        load[chosen[-1].writer] += 1
    return chosen


def step_folder(run_dir: str | os.PathLike, name: str, step: int) -> Path:
    """``<run_dir>/<name>/step_<step:06d>``."""
    return Path(run_dir) / name / f"step_{step:06d}"


def written_videos(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes with a video, in the order :func:`select_videos` chose them."""
    with_video = [e for e in episodes if e.video]
    return select_videos(with_video, len(with_video))
