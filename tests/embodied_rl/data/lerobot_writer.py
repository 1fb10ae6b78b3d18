"""Writes small LeRobot datasets for the reader's tests, following the format's specification
(LeRobot's own writer needs torch < 2.11, which cannot sit beside our pinned torch).

v2.1: a parquet file and an MP4 per episode, ``meta/episodes.jsonl`` and ``meta/tasks.jsonl``.
v3.0: every episode in one data file and one MP4 per camera (episodes one after the other),
``meta/episodes/chunk-000/file-000.parquet`` with each episode's offsets, ``meta/tasks.parquet``
(the task strings as the pandas index, as LeRobot writes it).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FPS = 10
SIZE = 32  # frame side (a multiple of the codec's macroblock)
IMAGE, WRIST = "observation.images.image", "observation.images.wrist_image"


@dataclass
class Episode:
    """actions (T, 7), state (T, 8), frames (T, S, S, 3) uint8 per camera feature, a task."""

    actions: np.ndarray
    state: np.ndarray
    frames: dict[str, np.ndarray]
    task: str


def make_episode(length: int, seed: int, task: str) -> Episode:
    """Values that tell frames, steps and episodes apart: frame t of episode ``seed`` is a
    flat grey ``40 + 20 t + 5 seed`` with a bright top-left quadrant (orientation checks)."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1, 1, (length, 7)).astype(np.float32)
    actions[:, -1] = np.where(rng.uniform(size=length) < 0.5, -1.0, 1.0)
    state = rng.normal(size=(length, 8)).astype(np.float32)
    frames = {}
    for offset, name in enumerate((IMAGE, WRIST)):
        grey = np.full((length, SIZE, SIZE, 3), 0, np.uint8)
        for t in range(length):
            grey[t] = 40 + 20 * t + 5 * seed + 2 * offset
            grey[t, : SIZE // 2, : SIZE // 2] = 250
        frames[name] = grey
    return Episode(actions=actions, state=state, frames=frames, task=task)


def features(image_dtype: str = "video") -> dict:
    video_info = {"video.fps": float(FPS), "video.codec": "h264", "video.pix_fmt": "yuv444p"}
    camera = {
        "dtype": image_dtype,
        "shape": [SIZE, SIZE, 3],
        "names": ["height", "width", "channels"],
    }
    if image_dtype == "video":
        camera["info"] = video_info
    return {
        IMAGE: camera,
        WRIST: dict(camera),
        "observation.state": {"dtype": "float32", "shape": [8], "names": None},
        "action": {"dtype": "float32", "shape": [7], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }


def write_mp4(path: Path, frames: np.ndarray) -> None:
    """Near-lossless H.264 (yuv444p, constant quality 0) at FPS."""
    import imageio_ffmpeg

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = imageio_ffmpeg.write_frames(
        str(path), (frames.shape[2], frames.shape[1]), fps=FPS, codec="libx264",
        pix_fmt_out="yuv444p", macro_block_size=1, output_params=["-qp", "0"],
    )  # fmt: skip
    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))
    writer.close()


def png_bytes(frame: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def frame_table(episodes: list[Episode], first: int, start_index: int, image_dtype: str,
                tasks: list[str]) -> pa.Table:  # fmt: skip
    """The rows of ``episodes`` (episode indices from ``first``, global index from
    ``start_index``) as LeRobot stores them."""
    columns: dict[str, list] = {k: [] for k in ("observation.state", "action", "timestamp",
                                                 "frame_index", "episode_index", "index",
                                                 "task_index")}  # fmt: skip
    if image_dtype == "image":
        columns[IMAGE], columns[WRIST] = [], []
    index = start_index
    for e, episode in enumerate(episodes):
        for t in range(len(episode.actions)):
            columns["observation.state"].append(episode.state[t].tolist())
            columns["action"].append(episode.actions[t].tolist())
            columns["timestamp"].append(t / FPS)
            columns["frame_index"].append(t)
            columns["episode_index"].append(first + e)
            columns["index"].append(index)
            columns["task_index"].append(tasks.index(episode.task))
            if image_dtype == "image":
                for name in (IMAGE, WRIST):
                    columns[name].append({"bytes": png_bytes(episode.frames[name][t]),
                                          "path": None})  # fmt: skip
            index += 1
    return pa.table(columns)


def write_v21(root: Path, episodes: list[Episode], image_dtype: str = "video") -> Path:
    """A v2.1 dataset of ``episodes`` at ``root``."""
    tasks = list(dict.fromkeys(e.task for e in episodes))
    info = {
        "codebase_version": "v2.1", "robot_type": "panda", "total_episodes": len(episodes),
        "total_frames": sum(len(e.actions) for e in episodes), "total_tasks": len(tasks),
        "total_videos": 2 * len(episodes), "total_chunks": 1, "chunks_size": 1000, "fps": FPS,
        "splits": {"train": f"0:{len(episodes)}"},
        "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
        "features": features(image_dtype),
    }  # fmt: skip
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    lines = [{"episode_index": i, "tasks": [e.task], "length": len(e.actions)}
             for i, e in enumerate(episodes)]  # fmt: skip
    (root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(tasks))
    )
    start = 0
    for i, episode in enumerate(episodes):
        data = root / f"data/chunk-000/episode_{i:06d}.parquet"
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(frame_table([episode], i, start, image_dtype, tasks), data)
        start += len(episode.actions)
        if image_dtype == "video":
            for name in (IMAGE, WRIST):
                write_mp4(root / f"videos/chunk-000/{name}/episode_{i:06d}.mp4",
                          episode.frames[name])  # fmt: skip
    return root


def write_v30(root: Path, episodes: list[Episode]) -> Path:
    """A v3.0 dataset of ``episodes`` at ``root``: one data file, one MP4 per camera."""
    tasks = list(dict.fromkeys(e.task for e in episodes))
    info = {
        "codebase_version": "v3.0", "robot_type": "panda", "total_episodes": len(episodes),
        "total_frames": sum(len(e.actions) for e in episodes), "total_tasks": len(tasks),
        "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
        "fps": FPS, "splits": {"train": f"0:{len(episodes)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features("video"),
    }  # fmt: skip
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    pq.write_table(
        pa.table({"task_index": list(range(len(tasks))), "__index_level_0__": tasks}),
        root / "meta" / "tasks.parquet",
    )
    data = root / "data/chunk-000/file-000.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(frame_table(episodes, 0, 0, "video", tasks), data)
    rows, start = [], 0
    for i, episode in enumerate(episodes):
        n = len(episode.actions)
        row = {"episode_index": i, "tasks": [episode.task], "length": n,
               "data/chunk_index": 0, "data/file_index": 0,
               "dataset_from_index": start, "dataset_to_index": start + n,
               "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}  # fmt: skip
        for name in (IMAGE, WRIST):
            row[f"videos/{name}/chunk_index"] = 0
            row[f"videos/{name}/file_index"] = 0
            row[f"videos/{name}/from_timestamp"] = start / FPS
            row[f"videos/{name}/to_timestamp"] = (start + n) / FPS
        rows.append(row)
        start += n
    pq.write_table(pa.Table.from_pylist(rows), root / "meta/episodes/chunk-000/file-000.parquet")
    for name in (IMAGE, WRIST):
        frames = np.concatenate([e.frames[name] for e in episodes])
        write_mp4(root / f"videos/{name}/chunk-000/file-000.mp4", frames)
    return root
