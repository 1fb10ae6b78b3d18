"""LIBERO demonstration files (HDF5): the layout, a validating reader, statistics, and the
demo types every reader returns (:class:`DemoInfo`, :class:`Demo`).

One file holds the demonstrations of one task, in the layout LIBERO's ``create_dataset.py``
writes (so the same reader reads LIBERO's published ``*_demo.hdf5`` files from a local
directory, and the files our scripted planner writes)::

    data/                               attrs: env_name, problem_info (JSON: language_instruction,
                                        problem_name, domain_name), macros_image_convention,
                                        bddl_file_name, bddl_file_content, env_args (JSON),
                                        num_demos, total
    data/demo_<i>/                      attrs: num_samples, model_file, init_state
        actions          (T, 7)         delta eef position (3), delta rotation (3), gripper
                                        (-1 open, +1 close): the env's action convention
        states           (T, S)         flattened MuJoCo states (optional here)
        robot_states     (T, 9)         (optional here)
        rewards, dones   (T,)           (optional here)
        obs/agentview_rgb    (T, H, W, 3) uint8, camera images as MuJoCo renders them
        obs/eye_in_hand_rgb  (T, H, W, 3) uint8
        obs/ee_states        (T, 6)     eef position (3) + axis-angle of the eef quaternion (3)
        obs/gripper_states   (T, 2)     the two finger joint positions
        obs/joint_states     (T, 7)
        obs/ee_pos, obs/ee_ori          (T, 3) each (optional here)

Image orientation: ``macros_image_convention`` ``"opengl"`` (LIBERO's default) stores frames as
MuJoCo renders them, upside down; ``"opencv"`` stores them flipped vertically. The reader
returns frames in the simulator's observation convention (rotated by 180 degrees, see
``simulators/libero/suites.py::flip_image``), so a policy sees demonstrations and rollouts alike;
the writer (``demo_writer.py``) takes frames in that convention and stores them as
``"opengl"``, like LIBERO.

Demos we write add ``embodied_rl_init_state_id`` (the official init state the episode started
from) to each demo's attributes and ``embodied_rl_suite`` / ``embodied_rl_task_id`` to
``data``; LIBERO's own files have none of these and read the same.

Proprio of a step, as the simulator's observation: ``ee_states`` (6) + ``gripper_states`` (2).

This is the base of the demonstration readers: the LeRobot reader (``lerobot.py``) returns
the same types, and ``demo_formats.py``, above both, says which reader reads a path.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ACTION_DIM = 7
PROPRIO_DIM = 8
# Required datasets of a demo and the trailing shape of each (None: any image size).
REQUIRED: dict[str, tuple[int | None, ...]] = {
    "actions": (ACTION_DIM,),
    "obs/agentview_rgb": (None, None, 3),
    "obs/eye_in_hand_rgb": (None, None, 3),
    "obs/ee_states": (6,),
    "obs/gripper_states": (2,),
    "obs/joint_states": (7,),
}
IMAGE_KEYS = {"agentview": "obs/agentview_rgb", "wrist": "obs/eye_in_hand_rgb"}
IMAGE_CONVENTIONS = ("opengl", "opencv")
_DEMO_NAME = re.compile(r"^demo_(\d+)$")


class DemoFormatError(ValueError):
    """A demonstration file does not have the LIBERO layout; the message names the file,
    the demo and the key."""


def to_observation_convention(frames: np.ndarray, convention: str) -> np.ndarray:
    """Stored frames ``(..., H, W, 3)`` -> the simulator's convention (rotated by 180 deg)."""
    if convention == "opengl":
        return np.ascontiguousarray(frames[..., ::-1, ::-1, :])
    if convention == "opencv":  # already flipped vertically: a horizontal flip is left
        return np.ascontiguousarray(frames[..., :, ::-1, :])
    raise ValueError(
        f"unknown image convention {convention!r}; expected one of {IMAGE_CONVENTIONS}"
    )


@dataclass(frozen=True)
class DemoInfo:
    """One demo of a file, known from its metadata only (no pixels read).

    Attributes:
        path: the HDF5 file.
        name: ``demo_<i>``.
        length: ``T`` steps.
        instruction: the task's language instruction (``problem_info``).
        image_shape: ``(H, W, 3)`` of its frames.
        image_convention: the file's ``macros_image_convention``.
        init_state_id: the official init state it started from, when the file says so.
        task_id: the task's index in its suite, when the file says so
            (``embodied_rl_task_id``; LIBERO's published files do not).
        suite: the suite the file was recorded in, when it says so (``embodied_rl_suite``).
        lerobot: where the episode is, for a demo of a LeRobot dataset (``path`` is then the
            dataset folder and ``name`` ``episode_<i>``): a
            :class:`~embodied_rl.data.lerobot.LeRobotEpisode`; ``None`` for an HDF5 demo.
            Typed ``Any`` here because this module is below the LeRobot reader, which
            imports it.
    """

    path: Path
    name: str
    length: int
    instruction: str
    image_shape: tuple[int, int, int]
    image_convention: str
    init_state_id: int | None = None
    task_id: int | None = None
    suite: str | None = None
    lerobot: Any = None

    @property
    def source(self) -> str:
        """``<file>:<demo>``, how messages name it."""
        return f"{self.path}:{self.name}"


@dataclass
class Demo:
    """One demonstration, read into memory in the simulator's conventions.

    Attributes:
        info: its metadata.
        actions: ``(T, 7)`` float32 env actions.
        proprio: ``(T, 8)`` float32, as the simulator's ``Obs.state``.
        images: camera name (``agentview``, ``wrist``) -> ``(T, H, W, 3)`` uint8, rotated by
            180 degrees like the simulator's observations.
    """

    info: DemoInfo
    actions: np.ndarray
    proprio: np.ndarray
    images: dict[str, np.ndarray]


def _attr_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _demo_names(path: Path, data: Any) -> list[str]:
    names = [name for name in data.keys() if _DEMO_NAME.match(name)]
    if not names:
        raise DemoFormatError(
            f"{path}: no demo_<i> groups under 'data' (found {sorted(data.keys())[:8]}); "
            "is this a LIBERO demonstration file?"
        )
    return sorted(names, key=lambda n: int(_DEMO_NAME.match(n).group(1)))


def _check_demo(path: Path, name: str, group: Any) -> int:
    """The demo's length ``T`` after checking every required key's presence and shape."""
    length = None
    for key, tail in REQUIRED.items():
        if key not in group:
            raise DemoFormatError(
                f"{path}: demo {name}: missing key {key!r} (a LIBERO demo has "
                f"{', '.join(REQUIRED)})"
            )
        shape = tuple(group[key].shape)
        fits = len(shape) == 1 + len(tail) and all(
            want is None or want == got for want, got in zip(tail, shape[1:])
        )
        if not fits or shape[0] < 1:
            wanted = "(T, " + ", ".join("*" if d is None else str(d) for d in tail) + ")"
            raise DemoFormatError(
                f"{path}: demo {name}: key {key!r} has shape {shape}, expected {wanted} with T >= 1"
            )
        if key.endswith("_rgb") and group[key].dtype != np.uint8:
            raise DemoFormatError(
                f"{path}: demo {name}: key {key!r} has dtype {group[key].dtype}, expected uint8"
            )
        if length is not None and shape[0] != length:
            raise DemoFormatError(
                f"{path}: demo {name}: key {key!r} has {shape[0]} steps, 'actions' has {length}"
            )
        length = shape[0]
    return int(length)


def _instruction(path: Path, data: Any) -> str:
    try:
        problem = json.loads(_attr_text(data.attrs["problem_info"]))
        return str(problem["language_instruction"])
    except (KeyError, ValueError, TypeError) as err:
        raise DemoFormatError(
            f"{path}: data attribute 'problem_info' must be JSON with 'language_instruction' "
            f"({type(err).__name__}: {err})"
        ) from None


def open_hdf5(path: Path, kind: str, error: type[ValueError], fix: str) -> Any:
    """``h5py.File(path, "r")``; a missing file raises FileNotFoundError, a file that is not
    HDF5 (truncated, garbage, a half-written copy) raises ``error`` naming ``fix``."""
    import h5py

    if not path.is_file():
        raise FileNotFoundError(f"{kind} {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise error(f"{path} cannot be read as HDF5 ({err}). Fix: {fix}") from None


def scan_demo_file(path: str | Path) -> list[DemoInfo]:
    """Validate a demonstration file and list its demos (metadata only, no pixels read).

    Raises:
        DemoFormatError: naming the file, the demo and the key that is missing or misshapen.
        FileNotFoundError: no such file.
    """
    path = Path(path)
    handle = open_hdf5(
        path,
        "demonstration file",
        DemoFormatError,
        "copy or generate it again (`embodied-rl demos`), or remove it from data.paths",
    )
    with handle as f:
        if "data" not in f:
            raise DemoFormatError(f"{path}: no 'data' group; is this a LIBERO demonstration file?")
        data = f["data"]
        instruction = _instruction(path, data)
        convention = _attr_text(data.attrs.get("macros_image_convention", "opengl"))
        if convention not in IMAGE_CONVENTIONS:
            raise DemoFormatError(
                f"{path}: data attribute 'macros_image_convention' is {convention!r}, expected "
                f"one of {IMAGE_CONVENTIONS}"
            )
        task_id = data.attrs.get("embodied_rl_task_id")
        suite = data.attrs.get("embodied_rl_suite")
        infos = []
        for name in _demo_names(path, data):
            group = data[name]
            length = _check_demo(path, name, group)
            init = group.attrs.get("embodied_rl_init_state_id")
            infos.append(
                DemoInfo(
                    path=path,
                    name=name,
                    length=length,
                    instruction=instruction,
                    image_shape=tuple(int(d) for d in group[IMAGE_KEYS["agentview"]].shape[1:]),
                    image_convention=convention,
                    init_state_id=None if init is None else int(init),
                    task_id=None if task_id is None else int(task_id),
                    suite=None if suite is None else _attr_text(suite),
                )
            )
    return infos


def content_digest(path: str | Path) -> str:
    """SHA-256 over every dataset of every demo of a demonstration file (name, dtype, shape
    and bytes, in sorted order): equal for two files with the same demos, whatever HDF5's
    object timestamps, chunking or attributes (the model XML names local paths)."""
    import h5py

    digest = hashlib.sha256()
    with h5py.File(path, "r") as f:
        data = f["data"]

        def add(name: str, item: Any) -> None:
            if isinstance(item, h5py.Dataset):
                value = np.asarray(item)
                digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
                digest.update(np.ascontiguousarray(value).tobytes())

        for demo in _demo_names(Path(path), data):
            data[demo].visititems(lambda name, item, demo=demo: add(f"{demo}/{name}", item))
    return digest.hexdigest()


def find_hdf5_files(
    paths: Iterable[str | Path], kind: str, hint: str, recursive: bool = False
) -> list[Path]:
    """HDF5 files named by ``paths``: files as given, folders searched for ``*.hdf5`` (with
    their subfolders when ``recursive``), each folder's files sorted.

    Raises:
        FileNotFoundError: a path does not exist, or nothing was found (``hint`` says how to
            make ``kind`` files).
    """
    paths = list(paths)
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = path.rglob("*.hdf5") if recursive else path.glob("*.hdf5")
            files += sorted(f for f in found if f.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{kind} path {path} does not exist")
    if not files:
        where = " or their subfolders" if recursive else ""
        raise FileNotFoundError(
            f"no *.hdf5 {kind} files in {[str(p) for p in paths]}{where}; {hint}"
        )
    return files


def find_demo_files(paths: Iterable[str | Path]) -> list[Path]:
    """Demonstration files named by ``paths`` (folders: their ``*.hdf5``, not recursive)."""
    hint = "generate them with `embodied-rl demos` or point at LIBERO's demo files"
    return find_hdf5_files(paths, "demonstration", hint)


def load_hdf5_demo(info: DemoInfo, cameras: Sequence[str] = ("agentview",)) -> Demo:
    """Read one HDF5 demo's actions, proprio and the frames of ``cameras`` into memory
    (:func:`embodied_rl.data.demo_formats.load_demo` reads a demo of either format)."""
    import h5py

    unknown = sorted(set(cameras) - set(IMAGE_KEYS))
    if unknown:
        raise ValueError(f"unknown camera(s) {unknown}; demo files have {sorted(IMAGE_KEYS)}")
    with h5py.File(info.path, "r") as f:
        group = f["data"][info.name]
        actions = np.asarray(group["actions"], dtype=np.float32)
        proprio = np.concatenate(
            [np.asarray(group["obs/ee_states"]), np.asarray(group["obs/gripper_states"])], axis=1
        ).astype(np.float32)
        images = {
            camera: to_observation_convention(
                np.asarray(group[IMAGE_KEYS[camera]]), info.image_convention
            )
            for camera in cameras
        }
    return Demo(info=info, actions=actions, proprio=proprio, images=images)


# -------------------------------------------------------------------------------- statistics
def dataset_statistics(actions: Sequence[np.ndarray], proprio: Sequence[np.ndarray]) -> dict:
    """Normalisation statistics of demonstrations, in OpenVLA's ``norm_stats`` entry format.

    Actions use BOUNDS_Q99 on every dimension but the gripper (``mask`` False: the gripper
    is already -1/+1); proprio on every dimension.

    Args:
        actions: per demo ``(T_i, 7)``; proprio: per demo ``(T_i, 8)``.

    Returns:
        ``{"action": {...}, "proprio": {...}, "num_transitions", "num_trajectories"}`` where
        each entry has ``mean, std, min, max, q01, q99, mask`` as lists of floats.
    """
    all_actions = np.concatenate([np.asarray(a, np.float64) for a in actions])
    all_proprio = np.concatenate([np.asarray(p, np.float64) for p in proprio])
    action_mask = [True] * (ACTION_DIM - 1) + [False]
    return {
        "action": _stats(all_actions, action_mask),
        "proprio": _stats(all_proprio, [True] * all_proprio.shape[1]),
        "num_transitions": int(len(all_actions)),
        "num_trajectories": len(actions),
    }


def _stats(values: np.ndarray, mask: list[bool]) -> dict[str, list]:
    return {
        "mean": values.mean(0).tolist(),
        "std": values.std(0).tolist(),
        "min": values.min(0).tolist(),
        "max": values.max(0).tolist(),
        "q01": np.quantile(values, 0.01, axis=0).tolist(),
        "q99": np.quantile(values, 0.99, axis=0).tolist(),
        "mask": list(mask),
    }
