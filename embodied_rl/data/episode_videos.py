"""Labelled episode videos: what world-model pretraining learns from and what the latent
comparison scores (``scripts/bench/world_model_latents.py``).

Two kinds of file read alike into :class:`VideoInfo` (metadata, no pixels) and
:func:`read_clip` (the frames asked for):

- LIBERO demonstration files (the layout of ``embodied_rl/data/demos.py``): every demo is a
  success; its frames are ``obs/agentview_rgb`` (one per env step).
- Episode video files, written by ``rollout.save_episodes`` (:func:`write_episode_videos`):
  the frames the policy saw (FRAMES, one per kept policy step), successes and failures::

      episodes/                  attrs: format = "embodied_rl_episode_videos", version = 1,
                                        suite (may be "")
      episodes/ep_<i>/frames     (T, H, W, 3) uint8, the simulator's observation convention
                                 attrs: task, init_state, success, instruction, origin

All frames are returned in the simulator's observation convention (what the policy and the
SRPO encoder see in rollouts), so the two kinds mix. A task is identified by its instruction
(LIBERO's published demo files record no task id).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embodied_rl.checks import check_range
from embodied_rl.data.demos import (
    IMAGE_KEYS,
    find_hdf5_files,
    open_hdf5,
    scan_demo_file,
    to_observation_convention,
)

EPISODE_FORMAT = "embodied_rl_episode_videos"
EPISODE_FORMAT_VERSION = 1
OBSERVATION_CONVENTION = "observation"  # frames stored as the policy sees them


def sample_frame_indices(length: int, num_frames: int) -> torch.Tensor:
    """Which of an episode's ``length`` valid frames to feed the encoder.

    ``length >= num_frames``: ``floor(linspace(0, length - 1, num_frames))`` (computed in
    integers, so no rounding surprises); shorter episodes cycle their frames:
    ``0, 1, ..., length - 1, 0, 1, ...``.

    Returns:
        (num_frames,) int64 indices into the valid frames.
    """
    check_range("length", length, 1)
    check_range("num_frames", num_frames, 1)
    steps = torch.arange(num_frames, dtype=torch.int64)
    if length < num_frames:
        return steps % length
    if num_frames == 1:
        return torch.zeros(1, dtype=torch.int64)
    return steps * (length - 1) // (num_frames - 1)


class EpisodeVideoError(ValueError):
    """A video file is neither a LIBERO demo file nor an episode video file we can read; the
    message names the file, the item and the fix."""


@dataclass(frozen=True)
class VideoInfo:
    """One labelled episode video (no pixels).

    Attributes:
        path: the HDF5 file.
        frames_key: the dataset of its frames in that file.
        length: ``T`` frames.
        image_shape: ``(H, W, 3)``.
        convention: ``observation`` (stored as the policy sees it) or a demo file's
            ``macros_image_convention`` (``opengl``/``opencv``).
        instruction: the task's language instruction (the task key).
        success: the episode reached the goal (demos: always).
        task: suite task index, when the file records it.
        init_state: official init state id, when the file records it.
        origin: ``demo`` for demonstrations; for rollouts what recorded it (e.g.
            ``rollout step 3 rank 0``).
        progress: the episode's privileged progress at its end (PRIVILEGED_PROGRESS: from
            simulator state, 1 at success), ``None`` when not recorded (demos, older files,
            a simulator without it).
    """

    path: Path
    frames_key: str
    length: int
    image_shape: tuple[int, int, int]
    convention: str
    instruction: str
    success: bool
    task: int | None = None
    init_state: int | None = None
    origin: str = "demo"
    progress: float | None = None

    @property
    def source(self) -> str:
        """``<file>:<dataset>``, how messages name it."""
        return f"{self.path}:{self.frames_key}"


@dataclass
class EpisodeVideo:
    """One episode to write with :func:`write_episode_videos`.

    Attributes:
        frames: ``(T, H, W, 3)`` uint8 in the simulator's observation convention, ``T >= 1``.
        instruction / task / init_state / success / origin: as in :class:`VideoInfo`.
        progress: its privileged progress at the end; NaN (not written) when unknown.
    """

    frames: np.ndarray
    instruction: str
    success: bool
    task: int = -1
    init_state: int = -1
    origin: str = "rollout"
    progress: float = math.nan


def write_episode_videos(
    path: str | os.PathLike[str], videos: Sequence[EpisodeVideo], suite: str = ""
) -> Path:
    """Write ``videos`` to a new episode video file, all or nothing.

    The file is written under a temporary name beside ``path`` and renamed into place, so a
    crash never leaves a half-written file that a reader would take for data.

    Raises:
        FileExistsError: ``path`` exists (episode files are never overwritten).
        ValueError: a video is empty or not ``(T, H, W, 3)`` uint8.
    """
    import h5py

    path = Path(path)
    if path.exists():
        raise FileExistsError(f"episode video file {path} exists; write to a new path")
    for i, video in enumerate(videos):
        frames = video.frames
        if (
            frames.ndim != 4
            or frames.shape[-1] != 3
            or frames.dtype != np.uint8
            or len(frames) == 0
        ):
            raise ValueError(
                f"episode {i}: frames must be (T >= 1, H, W, 3) uint8, got "
                f"{tuple(frames.shape)} {frames.dtype}"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with h5py.File(partial, "w") as f:
            root = f.create_group("episodes")
            root.attrs.update(format=EPISODE_FORMAT, version=EPISODE_FORMAT_VERSION, suite=suite)
            for i, video in enumerate(videos):
                group = root.create_group(f"ep_{i}")
                # one chunk per frame: a reader of a few sampled frames reads only those
                group.create_dataset(
                    "frames", data=video.frames, chunks=(1, *video.frames.shape[1:])
                )
                group.attrs.update(
                    task=int(video.task),
                    init_state=int(video.init_state),
                    success=bool(video.success),
                    instruction=str(video.instruction),
                    origin=str(video.origin),
                )
                if not math.isnan(video.progress):  # absent: unknown (read back as None)
                    group.attrs["privileged_progress"] = float(video.progress)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional_id(value: object) -> int | None:
    """A recorded id; ``None`` when absent or negative (unknown)."""
    return None if value is None or int(value) < 0 else int(value)


def _scan_episode_file(path: Path, root: object) -> list[VideoInfo]:
    version = int(root.attrs.get("version", -1))
    if _text(root.attrs.get("format", "")) != EPISODE_FORMAT or version != EPISODE_FORMAT_VERSION:
        raise EpisodeVideoError(
            f"{path}: 'episodes' group is not an episode video file of version "
            f"{EPISODE_FORMAT_VERSION} (format {root.attrs.get('format')!r}, version {version}). "
            "Fix: record it again with this version (configs/record_libero.yaml)"
        )
    infos = []
    for name in sorted(root, key=lambda n: int(n.rsplit("_", 1)[-1])):
        group = root[name]
        if "frames" not in group:
            raise EpisodeVideoError(
                f"{path}: episodes/{name} has no 'frames'. Fix: record it again"
            )
        shape = group["frames"].shape
        if len(shape) != 4 or shape[-1] != 3 or shape[0] < 1:
            raise EpisodeVideoError(
                f"{path}: episodes/{name}/frames is {shape}, expected (T >= 1, H, W, 3). "
                "Fix: record it again"
            )
        attrs = group.attrs
        missing = [k for k in ("success", "instruction") if k not in attrs]
        if missing:
            raise EpisodeVideoError(
                f"{path}: episodes/{name} lacks attribute(s) {missing}. Fix: record it again"
            )
        infos.append(
            VideoInfo(
                path=path,
                frames_key=f"episodes/{name}/frames",
                length=int(shape[0]),
                image_shape=tuple(int(d) for d in shape[1:]),
                convention=OBSERVATION_CONVENTION,
                instruction=_text(attrs["instruction"]),
                success=bool(attrs["success"]),
                task=_optional_id(attrs.get("task")),
                init_state=_optional_id(attrs.get("init_state")),
                origin=_text(attrs.get("origin", "rollout")),
                progress=_optional_float(attrs.get("privileged_progress")),
            )
        )
    return infos


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)


def _demo_videos(path: Path) -> list[VideoInfo]:
    return [
        VideoInfo(
            path=path,
            frames_key=f"data/{info.name}/{IMAGE_KEYS['agentview']}",
            length=info.length,
            image_shape=info.image_shape,
            convention=info.image_convention,
            instruction=info.instruction,
            success=True,
            task=info.task_id,
            init_state=info.init_state_id,
            origin="demo",
        )
        for info in scan_demo_file(path)
    ]


def scan_video_file(path: str | os.PathLike[str]) -> list[VideoInfo]:
    """The labelled videos of one file (a LIBERO demo file or an episode video file).

    Raises:
        EpisodeVideoError: the file is neither, or an episode lacks its frames or labels.
        DemoFormatError: a demo file breaks the LIBERO layout (from ``demos.py``).
        FileNotFoundError: no such file.
    """
    path = Path(path)
    handle = open_hdf5(
        path, "video file", EpisodeVideoError, "record it again, or remove it from the paths"
    )
    with handle as f:
        if "episodes" in f:
            return _scan_episode_file(path, f["episodes"])
        is_demo_file = "data" in f
    if is_demo_file:
        return _demo_videos(path)
    raise EpisodeVideoError(
        f"{path} has neither an 'episodes' group (an episode video file) nor a 'data' group "
        "(a LIBERO demo file). Fix: point at files from `embodied-rl demos` or "
        "configs/record_libero.yaml"
    )


def video_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The HDF5 files named by ``paths``: files as given, folders searched for ``*.hdf5``
    with their subfolders (a recording's ``episodes/step_N/rank_R.hdf5``), sorted.

    Raises:
        FileNotFoundError: a path does not exist, or nothing was found.
    """
    hint = "record them with configs/record_libero.yaml or generate demos with `embodied-rl demos`"
    return find_hdf5_files(paths, "video", hint, recursive=True)


def scan_videos(paths: Iterable[str | os.PathLike[str]]) -> list[VideoInfo]:
    """Every labelled video of ``paths`` (files, or folders searched for ``*.hdf5`` with their
    subfolders), in path order."""
    return [info for path in video_files(paths) for info in scan_video_file(path)]


def read_clip(info: VideoInfo, indices: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Frames ``indices`` (any order, repeats allowed; ``None``: all) of one video.

    Returns:
        (len(indices), H, W, 3) uint8 in the simulator's observation convention.
    """
    import h5py

    wanted = np.arange(info.length) if indices is None else np.asarray(indices, dtype=np.int64)
    if wanted.size and (wanted.min() < 0 or wanted.max() >= info.length):
        raise IndexError(f"{info.source}: frame indices must lie in [0, {info.length})")
    unique, inverse = np.unique(wanted, return_inverse=True)
    with h5py.File(info.path, "r") as f:
        frames = np.asarray(f[info.frames_key][unique.tolist()])[inverse]
    if info.convention == OBSERVATION_CONVENTION:
        return np.ascontiguousarray(frames)
    return to_observation_convention(frames, info.convention)
