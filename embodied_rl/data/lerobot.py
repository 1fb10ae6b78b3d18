"""LeRobot datasets as demonstrations: a reader of the v2.0/v2.1 and v3.0 layouts.

A LeRobot dataset is a folder (read from local disk only; nothing is downloaded)::

    meta/info.json       codebase_version, fps, chunks_size, data_path and video_path
                         templates, features: name -> {dtype, shape, names}
    v2.x: meta/episodes.jsonl   {"episode_index", "tasks": [instruction], "length"} per line
          data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet   one per episode
          videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4
    v3.0: meta/episodes/chunk-*/file-*.parquet   a row per episode: episode_index, tasks,
                         length, data/chunk_index, data/file_index and, per video feature,
                         videos/<key>/chunk_index, file_index, from_timestamp
          data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet        many episodes
          videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4   many episodes,
                         one after the other (an episode starts at its from_timestamp)

A data file has a row per frame: the non-video features (vectors as lists) and
``episode_index``, ``frame_index``, ``timestamp``. A camera is a ``video`` feature (MP4 frames)
or an ``image`` feature (PNG/JPEG bytes in the parquet row).

:class:`LeRobotFeatures` (``data.lerobot`` of ``data.demos``) maps the dataset's feature names to
what a LIBERO demo holds: the agentview image, the wrist image, the 8-d proprio (eef position,
axis-angle, two gripper joints: the simulator's ``Obs.state``) and the 7-d env action; it also
says how the frames are oriented and which gripper convention the actions use. The defaults
are the names of the LeRobot LIBERO conversions (``observation.images.image``,
``observation.images.wrist_image``, ``observation.state``, ``action``; frames rotated by 180
degrees as OpenVLA's LIBERO data stores them, gripper in the env's -1 open / +1 close).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied_rl.checks import options_dataclass
from embodied_rl.data.demos import (
    ACTION_DIM,
    PROPRIO_DIM,
    Demo,
    DemoFormatError,
    DemoInfo,
    to_observation_convention,
)

SUPPORTED_VERSIONS = ("v2.0", "v2.1", "v3.0")
# rotated: frames already in the simulator's observation convention (rotated by 180 degrees,
# as OpenVLA's LIBERO conversions store them); opengl / opencv: as the HDF5 conventions.
IMAGE_CONVENTIONS = ("rotated", "opengl", "opencv")
# env: LIBERO's env actions (-1 open, +1 close); openvla: [0, 1] with 1 = open (OpenVLA's RLDS
# conversions), turned into the env's -1 / +1.
GRIPPER_CONVENTIONS = ("env", "openvla")
CAMERA_FEATURES = {"agentview": "image", "wrist": "wrist_image"}
INFO_FILE = "meta/info.json"


@dataclass(frozen=True)
class LeRobotFeatures:
    """How a LeRobot dataset's features map to a demo (``data.lerobot``).

    Attributes:
        image: the agentview camera (the policy image), a ``video`` or ``image`` feature.
        wrist_image: the wrist camera, or ``None`` if the dataset has none.
        state: the ``(8,)`` proprio: eef position (3), axis-angle (3), gripper joints (2).
        action: the ``(7,)`` action: delta position (3), delta rotation (3), gripper.
        image_convention: ``rotated`` | ``opengl`` | ``opencv`` (see IMAGE_CONVENTIONS).
        gripper: ``env`` | ``openvla`` (see GRIPPER_CONVENTIONS).
    """

    image: str = "observation.images.image"
    wrist_image: str | None = "observation.images.wrist_image"
    state: str = "observation.state"
    action: str = "action"
    image_convention: str = "rotated"
    gripper: str = "env"

    def __post_init__(self) -> None:
        if self.image_convention not in IMAGE_CONVENTIONS:
            raise ValueError(
                f"data.lerobot.image_convention={self.image_convention!r}; expected one of "
                f"{IMAGE_CONVENTIONS} (rotated: frames as the simulator observes them)"
            )
        if self.gripper not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"data.lerobot.gripper={self.gripper!r}; expected one of {GRIPPER_CONVENTIONS} "
                "(env: -1 open, +1 close; openvla: [0, 1] with 1 = open)"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> LeRobotFeatures:
        """From ``data.lerobot`` (``None``: the defaults); unknown keys are refused."""
        return options_dataclass(cls, options, "data.lerobot")

    def camera_feature(self, camera: str) -> str | None:
        return getattr(self, CAMERA_FEATURES[camera])


@dataclass(frozen=True)
class LeRobotEpisode:
    """Where one episode's rows and frames are (a :class:`DemoInfo`'s ``lerobot`` field).

    Attributes:
        root: the dataset folder.
        index: its ``episode_index``.
        data_file: the parquet file holding its rows.
        videos: camera (``agentview``, ``wrist``) -> (MP4 file, start time in seconds), for
            the cameras stored as videos.
        fps: the dataset's frame rate.
        features: the feature mapping it was scanned with.
    """

    root: Path
    index: int
    data_file: Path
    videos: tuple[tuple[str, Path, float], ...]
    fps: float
    features: LeRobotFeatures


def is_lerobot_dataset(path: str | Path) -> bool:
    """A folder with ``meta/info.json``."""
    return (Path(path) / INFO_FILE).is_file()


def read_info(root: Path) -> dict[str, Any]:
    """``meta/info.json``, its version checked."""
    try:
        info = json.loads((root / INFO_FILE).read_text())
    except (OSError, ValueError) as err:
        raise DemoFormatError(f"{root / INFO_FILE} cannot be read as JSON ({err})") from None
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise DemoFormatError(
            f"{root}: LeRobot codebase_version {version!r} is not supported; this reader knows "
            f"{SUPPORTED_VERSIONS}. Fix: convert the dataset with LeRobot's converter to v3.0"
        )
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise DemoFormatError(f"{root / INFO_FILE} has no {key!r}")
    return info


def check_features(root: Path, info: Mapping[str, Any], features: LeRobotFeatures) -> None:
    """Every mapped feature exists with the expected kind and shape, else refused naming the
    ``data.lerobot`` key to set and the dataset's features."""
    have = info["features"]
    wanted = {
        "state": (features.state, (PROPRIO_DIM,), ("float32", "float64")),
        "action": (features.action, (ACTION_DIM,), ("float32", "float64")),
        "image": (features.image, None, ("video", "image")),
    }
    if features.wrist_image is not None:
        wanted["wrist_image"] = (features.wrist_image, None, ("video", "image"))
    for option, (name, shape, dtypes) in wanted.items():
        if name not in have:
            raise DemoFormatError(
                f"{root}: no feature {name!r} (data.lerobot.{option}); the dataset has "
                f"{sorted(have)}. Fix: set data.lerobot.{option} to one of them"
            )
        dtype = have[name].get("dtype")
        if dtype not in dtypes:
            raise DemoFormatError(
                f"{root}: feature {name!r} (data.lerobot.{option}) has dtype {dtype!r}, "
                f"expected one of {dtypes}"
            )
        if shape is not None and tuple(have[name].get("shape", ())) != shape:
            raise DemoFormatError(
                f"{root}: feature {name!r} (data.lerobot.{option}) has shape "
                f"{have[name].get('shape')}, expected {list(shape)}"
                + (
                    " (eef position, axis-angle, 2 gripper joints)"
                    if option == "state"
                    else " (delta position, delta rotation, gripper)"
                )
            )


def image_shape(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(H, W, 3)`` of an image/video feature whose shape is HWC or CHW (by its names)."""
    shape = [int(d) for d in spec["shape"]]
    names = spec.get("names") or []
    channels_first = (names and names[0] in ("channel", "channels")) or (
        not names and shape[0] == 3 and shape[-1] != 3
    )
    if channels_first:
        shape = shape[1:] + shape[:1]
    return shape[0], shape[1], shape[2]


# ----------------------------------------------------------------------------- scanning
def scan_lerobot_dataset(root: str | Path, features: LeRobotFeatures) -> list[DemoInfo]:
    """Validate a LeRobot dataset's metadata and list its episodes as demos (no frames read).

    Raises:
        DemoFormatError: an unsupported version, a missing or misshapen feature, missing
            episode metadata or files (naming the item and the fix).
    """
    root = Path(root)
    info = read_info(root)
    check_features(root, info, features)
    rows = _episode_rows(root, info)
    shape = image_shape(info["features"][features.image])
    infos = []
    for row in rows:
        episode = _locate(root, info, row, features)
        tasks = row.get("tasks") or []
        if not tasks:
            raise DemoFormatError(f"{root}: episode {row['episode_index']} has no task")
        infos.append(
            DemoInfo(
                path=root,
                name=f"episode_{int(row['episode_index']):06d}",
                length=int(row["length"]),
                instruction=str(tasks[0]),
                image_shape=shape,
                image_convention=features.image_convention,
                lerobot=episode,
            )
        )
    return infos


def _episode_rows(root: Path, info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per episode (episode_index order): tasks, length and, for v3.0, where its
    rows and videos are."""
    if info["codebase_version"].startswith("v2"):
        path = root / "meta" / "episodes.jsonl"
        if not path.is_file():
            raise DemoFormatError(
                f"{root}: no meta/episodes.jsonl (a {info['codebase_version']} "
                "dataset lists its episodes there)"
            )
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        import pyarrow.parquet as pq

        files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DemoFormatError(
                f"{root}: no meta/episodes/chunk-*/file-*.parquet (a v3.0 "
                "dataset lists its episodes there)"
            )
        rows = [row for f in files for row in pq.read_table(f).to_pylist()]
    for row in rows:
        missing = [k for k in ("episode_index", "tasks", "length") if k not in row]
        if missing:
            raise DemoFormatError(f"{root}: episode metadata {row} lacks {missing}")
    return sorted(rows, key=lambda r: int(r["episode_index"]))


def _locate(
    root: Path, info: Mapping[str, Any], row: Mapping[str, Any], features: LeRobotFeatures
) -> LeRobotEpisode:
    """The episode's data file and, per camera stored as video, its MP4 and start time."""
    index = int(row["episode_index"])
    v2 = info["codebase_version"].startswith("v2")
    chunk = index // int(info.get("chunks_size", 1000))
    if v2:
        data = info["data_path"].format(episode_chunk=chunk, episode_index=index)
    else:
        data = info["data_path"].format(
            chunk_index=int(row["data/chunk_index"]), file_index=int(row["data/file_index"])
        )
    videos = []
    for camera in CAMERA_FEATURES:
        name = features.camera_feature(camera)
        if name is None or info["features"][name]["dtype"] != "video":
            continue
        if v2:
            video = info["video_path"].format(
                episode_chunk=chunk, video_key=name, episode_index=index
            )
            start = 0.0
        else:
            video = info["video_path"].format(
                video_key=name,
                chunk_index=int(row[f"videos/{name}/chunk_index"]),
                file_index=int(row[f"videos/{name}/file_index"]),
            )
            start = float(row[f"videos/{name}/from_timestamp"])
        videos.append((camera, root / video, start))
    for path in [root / data] + [v[1] for v in videos]:
        if not path.is_file():
            raise DemoFormatError(
                f"{root}: episode {index}'s file {path.relative_to(root)} does not exist. "
                "Fix: copy the whole dataset (data/ and videos/ too)"
            )
    return LeRobotEpisode(
        root=root,
        index=index,
        data_file=root / data,
        videos=tuple(videos),
        fps=float(info["fps"]),
        features=features,
    )


# ----------------------------------------------------------------------------- loading
def load_lerobot_demo(info: DemoInfo, cameras: Sequence[str] = ("agentview",)) -> Demo:
    """One episode's actions, proprio and the frames of ``cameras``, in the simulator's
    conventions (like :func:`embodied_rl.data.demos.load_hdf5_demo` for HDF5 files).

    Raises:
        DemoFormatError: the data rows, frame indices or decoded frames do not match the
            episode's length, naming the episode and the file.
    """
    episode: LeRobotEpisode = info.lerobot
    features = episode.features
    unknown = sorted(set(cameras) - set(CAMERA_FEATURES))
    if unknown:
        raise ValueError(f"unknown camera(s) {unknown}; demos have {sorted(CAMERA_FEATURES)}")
    rows = _episode_table(episode)
    n = len(rows["frame_index"])
    if n != info.length or rows["frame_index"] != list(range(n)):
        raise DemoFormatError(
            f"{info.source}: {n} rows in {episode.data_file.name} (frame_index "
            f"{_span(rows['frame_index'])}), but the episode metadata says {info.length} frames"
        )
    actions = np.asarray(rows[features.action], dtype=np.float32).reshape(n, ACTION_DIM)
    if features.gripper == "openvla":
        actions[:, -1] = np.where(actions[:, -1] >= 0.5, -1.0, 1.0)
    proprio = np.asarray(rows[features.state], dtype=np.float32).reshape(n, PROPRIO_DIM)
    images = {}
    videos = {camera: (path, start) for camera, path, start in episode.videos}
    for camera in cameras:
        name = features.camera_feature(camera)
        if name is None:
            raise ValueError(
                f"{info.source}: camera {camera!r} is not mapped (data.lerobot."
                f"{CAMERA_FEATURES[camera]} is null)"
            )
        if camera in videos:
            frames = decode_video(*videos[camera], n, episode.fps, info.source)
        else:
            frames = np.stack([_decode_image(cell, info.source, name) for cell in rows[name]])
        images[camera] = _to_observation(frames, features.image_convention)
    return Demo(info=info, actions=actions, proprio=proprio, images=images)


def _episode_table(episode: LeRobotEpisode) -> dict[str, list]:
    """The episode's rows of its data file as columns (lists), in frame order."""
    features = episode.features
    table = _read_data_file(episode.data_file)
    names = set(table.column_names)
    wanted = [features.action, features.state, "episode_index", "frame_index"]
    wanted += [
        name
        for camera in CAMERA_FEATURES
        if (name := features.camera_feature(camera)) is not None
        and name in names
        and camera not in {c for c, _, _ in episode.videos}
    ]
    missing = [name for name in wanted if name not in names]
    if missing:
        raise DemoFormatError(
            f"{episode.data_file}: no column(s) {missing}; it has {sorted(names)}"
        )
    import pyarrow.compute as pc

    rows = table.filter(pc.equal(table["episode_index"], episode.index)).select(wanted)
    rows = rows.sort_by("frame_index").to_pydict()
    return {name: rows[name] for name in wanted}


@functools.lru_cache(maxsize=2)
def _read_data_file(path: Path) -> Any:
    """A whole parquet data file (a v3.0 file holds many episodes: read once, not per episode)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a bad file
        raise DemoFormatError(f"{path} cannot be read as parquet ({err})") from None


def decode_video(path: Path, start: float, frames: int, fps: float, source: str) -> np.ndarray:
    """``frames`` RGB frames ``(T, H, W, 3)`` uint8 of an MP4 from ``start`` seconds.

    Seeks half a frame before ``start``: ffmpeg then outputs the frames whose timestamps are
    at or after that time, so the first is the frame at ``start`` whatever the rounding.
    """
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(
        str(path),
        input_params=["-ss", f"{max(0.0, start - 0.5 / fps):.6f}"],
        output_params=["-frames:v", str(frames)],
    )
    meta = next(reader)
    width, height = meta["size"]
    decoded = [np.frombuffer(raw, np.uint8).reshape(height, width, 3) for raw in reader]
    if len(decoded) != frames:
        raise DemoFormatError(
            f"{source}: {path.name} has {len(decoded)} frames from {start:.3f} s, the episode "
            f"has {frames} rows. Fix: re-export the dataset's videos, or remove the episode"
        )
    return np.stack(decoded)


def _decode_image(cell: Any, source: str, name: str) -> np.ndarray:
    """An ``image`` feature's cell (``{"bytes", "path"}``) as ``(H, W, 3)`` uint8."""
    from PIL import Image

    data = cell.get("bytes") if isinstance(cell, Mapping) else None
    if not data:
        raise DemoFormatError(f"{source}: feature {name!r} has a frame without image bytes")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _to_observation(frames: np.ndarray, convention: str) -> np.ndarray:
    if convention == "rotated":
        return np.ascontiguousarray(frames)
    return to_observation_convention(frames, convention)


def _span(indices: Sequence[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if indices else "none"
