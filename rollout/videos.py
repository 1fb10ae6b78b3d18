"""``rollout.videos``: an evaluation's videos, one frame per env step at their own size, by replay.

The evaluation's ``rollout.env`` (``keep_actions: true``) runs its episodes as fast as
without videos and keeps what its env was sent, ENV_ACTIONS ``(B, T, C, A)``. This node then
chooses the episodes to show over all ranks (:func:`~embodied_rl.eval_episodes.select_videos`
on the gathered metadata: the same choice on every rank, spread over the tasks, successes and
failures), and each rank replays the chosen episodes it holds on the same vector env: reset
to ``(task, init state)``, then the ``C`` actions of every policy step as a chunk
(``env.step_filmed``), with a ``video_size`` frame (whatever the policy's image size) after
the reset (``env.render(video_size)``) and after every env step. A video thus has ``env
steps + 1`` frames, the instruction above them, ``step k`` below and, on its last second, the
outcome in green or red (:class:`~embodied_rl.video.VideoWriter`: frames are written one by
one, so memory holds ``fps`` frames per env, not an episode).

Why a replay: only the episodes that get a video pay for their frames (at most
``max_videos`` over all ranks; with LIBERO on CPUs a 256 px frame costs several times the
physics of a step), and training rollouts (``keep_actions: false``) pay nothing. Frames are
drawn only for the replayed episodes still running; the spare envs of a wave are left out
of its reset (``active``: not simulated); the policy's observations are drawn once per chunk,
as in the rollout (``step_filmed``; stepping one action at a time drew them at every env step,
which doubled a LIBERO video's cost); waves group episodes of similar length.
``scripts/bench/eval_videos.py`` measures what the videos cost.

Simulators are deterministic (the same ``(task, init state, actions)`` give the same
episode: ``simulators/checker.py`` tests it, and the process pool relies on it to recover
from a crash), so the replay *is* the episode. It is checked anyway: its state before every
policy step and its outcome must be the recorded ones, else its video is dropped with a
warning.

Writes HAS_VIDEO ``(B,)`` bool (``eval.report`` shows those) and the MP4s
``<run_dir>/<name>/step_<step>/<Episode.video_name>``; logs ``<name>/videos`` (written).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len
from embodied_rl.eval_episodes import (
    Episode,
    check_folder_name,
    gather_episodes,
    local_episodes,
    select_videos,
    step_folder,
)
from embodied_rl.registry import SIMULATORS
from embodied_rl.runtime.context import simulating
from embodied_rl.video import VideoWriter
from rollout.env import ENV_STATE, setup_env

logger = logging.getLogger(__name__)

# Replayed vs recorded proprio state: a deterministic simulator gives the same numbers; the
# tolerance only forgives float noise, a diverged episode is off by far more.
STATE_ATOL = 1e-5


@dataclass
class RolloutVideosConfig:
    """Options of ``rollout.videos``.

    Attributes:
        simulator / simulator_options / num_envs / processes: those of the evaluation's
            ``rollout.env``: the node replays on that vector env (one per worker, shared).
        max_videos: videos per step over all ranks (0 = none); one per (task, init state,
            outcome) at most, spread over the tasks, successes and failures both.
        video_size: side of the square video frames in pixels, drawn for the videos (the
            policy's images keep their size); at most the simulator's ``max_render_size``
            (LIBERO: 480).
        fps: frame rate; one frame per env step (LIBERO steps at 20 Hz, reach at 25 Hz).
        name: the evaluation's folder under the run dir (``eval.report``'s ``name``).
    """

    simulator: str = "reach"
    simulator_options: dict[str, Any] = field(default_factory=dict)
    num_envs: int = 8
    processes: int = 0
    max_videos: int = 8
    video_size: int = 256
    fps: int = 20
    name: str = "eval"

    def __post_init__(self) -> None:
        check_fields(self, ("num_envs", "fps"), 1)
        check_fields(self, ("processes", "max_videos"), 0)
        if self.simulator not in SIMULATORS:
            raise ValueError(SIMULATORS.unknown_message(self.simulator))
        try:
            limits = SIMULATORS.get(self.simulator).limits(self.simulator_options)
        except ValueError:  # the evaluation's rollout.env, on the same options, reports it
            limits = {}
        fix = "; set eval.video_size to the side of the video frames, e.g. 256"
        high = limits.get("max_render_size")
        check_range("video_size", self.video_size, 1, high, note=" (pixels)", fix=fix)
        check_folder_name(self.name)


@dataclass
class Replay:
    """A chosen episode as the rollout recorded it.

    Attributes:
        episode: its metadata (task, init state, outcome, instruction, video name).
        actions: ``(L, C, A)`` the env actions of its ``L = FINISH_STEP + 1`` policy steps.
        states: ``(L, S)`` float32 its proprio state before each of them.
        path: the video file to write.
    """

    episode: Episode
    actions: np.ndarray
    states: np.ndarray
    path: Path


class _Recording:
    """An episode's replay in progress: its video, env steps so far, end and divergence."""

    def __init__(self, replay: Replay, fps: int) -> None:
        e = replay.episode
        self.replay = replay
        outcome = e.outcome.upper()  # frames drawn at the video's size: no upscaling (scale 1)
        self.video = VideoWriter(replay.path, fps, e.instruction, outcome, scale=1, labels=True)
        self.steps = 0  # env steps replayed
        self.ended = False
        self.problem: str | None = None  # why the replay is not the recorded episode
        self.write_error: OSError | None = None  # why the file could not be written

    def add(self, frame: np.ndarray) -> None:
        if self.write_error is not None:
            return
        try:
            self.video.append(frame, f"step {self.steps}")
        except OSError as err:  # disk full, no memory to start the encoder, ...
            self.write_error = err
            self.video.abort()

    def check_state(self, state: np.ndarray, t: int) -> None:
        """``state``: the replay's before policy step ``t``."""
        if not np.allclose(state, self.replay.states[t], rtol=0.0, atol=STATE_ATOL):
            self.problem = self.problem or f"its state before policy step {t} differs"

    def end(self, success: bool, t: int) -> None:
        """The replay ended in policy step ``t``, with ``success``."""
        self.ended = True
        last = len(self.replay.actions) - 1
        if t != last:
            self.problem = self.problem or f"it ended in policy step {t}, the rollout's in {last}"
        elif bool(success) != self.replay.episode.success:
            self.problem = self.problem or f"its outcome differs (success={bool(success)})"

    def close(self) -> int:
        """Write the video (frames written), or drop it if the replay diverged or the file
        could not be written (0): a video is never worth stopping a training run for."""
        e = self.replay.episode
        if self.problem is None and self.write_error is None:
            try:
                self.video.close()
                return self.video.frames
            except OSError as err:
                self.write_error = err
        self.video.abort()
        if self.write_error is not None:
            logger.warning(
                "rollout.videos: the video of task %d, init state %d (%s) could not be "
                "written (%s: %s); the evaluation goes on without it",
                e.task, e.init_state, e.outcome, type(self.write_error).__name__,
                self.write_error,
            )  # fmt: skip
            return 0
        logger.warning(
            "rollout.videos: the replay of task %d, init state %d (%s) is not the evaluated "
            "episode: %s; its video is not written (is the simulator deterministic?)",
            e.task, e.init_state, e.outcome, self.problem,
        )  # fmt: skip
        return 0


def _chunk_at(wave: Sequence[Replay], t: int) -> np.ndarray:
    """``(len(wave), C, A)``: the actions of policy step ``t`` of each (zeros past its end)."""
    return np.stack(
        [r.actions[t] if t < len(r.actions) else np.zeros_like(r.actions[0]) for r in wave]
    )


def _replay_wave(
    env: Any, wave: list[Replay], size: int, fps: int, shared: dict[str, Any]
) -> list[int]:
    """Replay up to ``env.num_envs`` episodes together and write their videos.

    Returns:
        frames written per episode (0: the replay diverged, no video).
    """
    padded = wave + [wave[0]] * (env.num_envs - len(wave))  # spare envs: left out of the reset
    active = np.arange(env.num_envs) < len(wave)
    recordings = [_Recording(r, fps) for r in wave]
    try:
        with simulating(shared, "an evaluation video's replay"):
            obs = env.reset(
                [r.episode.task for r in padded], [r.episode.init_state for r in padded], active
            )
            frames = env.render(size, list(range(len(wave))))
        for i, rec in enumerate(recordings):
            rec.check_state(obs.state[i], 0)
            rec.add(frames[i])
        for t in range(max(len(r.actions) for r in wave)):
            _replay_policy_step(env, padded, recordings, t, size, shared)
            if all(rec.ended for rec in recordings):
                break
        return [rec.close() for rec in recordings]
    except BaseException:
        for rec in recordings:
            rec.video.abort()
        raise


def _replay_policy_step(
    env: Any,
    padded: list[Replay],
    recordings: list[_Recording],
    t: int,
    size: int,
    shared: dict[str, Any],
) -> None:
    """Policy step ``t``: its chunk of ``C`` env steps, a frame after each."""
    running = [i for i, rec in enumerate(recordings) if not rec.ended]
    with simulating(shared, "an evaluation video's replay"):
        result, clips = env.step_filmed(_chunk_at(padded, t), size, running)
    for i, clip in zip(running, clips):
        rec = recordings[i]
        for frame in clip:
            rec.steps += 1
            rec.add(frame)
        if result.done[i]:  # ended within the chunk (the env ignored the rest of it)
            rec.end(result.success[i], t)
        elif t + 1 < len(rec.replay.actions):
            rec.check_state(result.obs.state[i], t + 1)
        else:  # the rollout stopped here (its max_steps) before the env's limit
            rec.end(result.success[i], t)


def replay_videos(
    env: Any, replays: Sequence[Replay], size: int, fps: int, shared: dict[str, Any]
) -> list[int]:
    """Replay ``replays`` on ``env`` (waves of ``env.num_envs``, shortest episodes together)
    and write their videos of ``size`` px frames at ``fps``.

    Returns:
        frames written per replay, in the order given (0: diverged, no video).
    """
    order = sorted(range(len(replays)), key=lambda i: len(replays[i].actions))
    written = [0] * len(replays)
    for start in range(0, len(order), env.num_envs):
        wave = order[start : start + env.num_envs]
        counts = _replay_wave(env, [replays[i] for i in wave], size, fps, shared)
        for i, count in zip(wave, counts):
            written[i] = count
    return written


def replay_of(batch: TensorDict, episode: Episode, folder: Path) -> Replay:
    """What ``batch`` recorded of ``episode`` (one of its rows), to write under ``folder``."""
    length = int(batch[K.FINISH_STEP][episode.index]) + 1
    return Replay(
        episode,
        batch[K.ENV_ACTIONS][episode.index, :length].numpy(),
        batch[K.OBS_STATE][episode.index, :length].numpy(),
        folder / episode.video_name,
    )


VIDEO_READS = (
    K.TASK_ID, K.INIT_STATE_ID, K.SUCCESS, K.PROMPT_TEXT, K.FINISH_STEP, K.OBS_STATE,
    K.ENV_ACTIONS,
)  # fmt: skip


@register_node(
    "rollout.videos",
    reads=VIDEO_READS,
    writes=(K.HAS_VIDEO,),
    config=RolloutVideosConfig,
    setup=setup_env,
)
def rollout_videos(ctx: Any, batch: TensorDict) -> TensorDict:
    """Choose the episodes to show (over all ranks), replay this rank's and write their videos.

    Reads TASK_ID, INIT_STATE_ID, SUCCESS (B,), PROMPT_TEXT (B strings), FINISH_STEP (B,),
    OBS_STATE (B, T, S) and ENV_ACTIONS (B, T, C, A); writes HAS_VIDEO (B,) bool.
    """
    cfg: RolloutVideosConfig = ctx.node_config
    episodes = gather_episodes(ctx, local_episodes(ctx, batch))
    chosen = select_videos(episodes, cfg.max_videos)
    mine = [e for e in chosen if e.dp_rank == ctx.dp_rank and e.writer == ctx.rank]
    folder = step_folder(ctx.run_dir, cfg.name, ctx.step)
    replays = [replay_of(batch, e, folder) for e in mine]
    written = replay_videos(ctx.state[ENV_STATE], replays, cfg.video_size, cfg.fps, ctx.shared)
    has_video = torch.zeros(batch_len(batch), dtype=torch.bool)
    for e, frames in zip(mine, written):
        has_video[e.index] = frames > 0
    batch[K.HAS_VIDEO] = has_video
    ctx.metrics.log(f"{cfg.name}/videos", float(has_video.sum()), reduce="sum")
    return batch
