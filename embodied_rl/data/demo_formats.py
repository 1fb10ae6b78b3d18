"""Which reader reads a demonstration path: a LeRobot dataset folder, or HDF5 demo files.

``data.paths`` of ``data.demos`` may name either, mixed: a folder with ``meta/info.json`` is
a LeRobot dataset (``lerobot.py``), any other path holds LIBERO HDF5 files (``demos.py``).
Both readers return the same :class:`~embodied_rl.data.demos.DemoInfo` and
:class:`~embodied_rl.data.demos.Demo`, so the loader above (``demo_loader.py``) never asks
which format a demo came from. This module sits above both readers: they import neither it
nor each other's loading code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from embodied_rl.data.demos import (
    Demo,
    DemoFormatError,
    DemoInfo,
    find_demo_files,
    load_hdf5_demo,
    scan_demo_file,
)
from embodied_rl.data.lerobot import (
    INFO_FILE,
    LeRobotFeatures,
    is_lerobot_dataset,
    load_lerobot_demo,
    scan_lerobot_dataset,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def scan_demos(paths: Sequence[str], lerobot: LeRobotFeatures | None = None) -> list[DemoInfo]:
    """Every demo under ``paths``, in path order: a LeRobot dataset folder (``meta/info.json``)
    gives its episodes (mapped by ``lerobot``, default :class:`LeRobotFeatures`), any other
    path its HDF5 files' demos (a folder: its ``*.hdf5``)."""
    infos: list[DemoInfo] = []
    for path in paths:
        if is_lerobot_dataset(path):
            infos += scan_lerobot_dataset(path, lerobot or LeRobotFeatures())
        else:
            check_not_a_broken_lerobot_dataset(Path(path))
            infos += [info for file in find_demo_files([path]) for info in scan_demo_file(file)]
    return infos


def check_not_a_broken_lerobot_dataset(path: Path) -> None:
    """A folder with LeRobot's ``data/`` or ``meta/`` but no ``meta/info.json`` is a LeRobot
    dataset copied without its metadata: say so, rather than that it holds no HDF5 files."""
    if not path.is_dir() or any(path.glob("*.hdf5")):
        return
    if (path / "meta").is_dir() or any((path / "data").glob("**/*.parquet")):
        raise DemoFormatError(
            f"{path} looks like a LeRobot dataset (it has {'meta/' if (path / 'meta').is_dir() else 'data/*.parquet'}) "
            f"but has no {INFO_FILE}, which says its version, features and files. Fix: copy "
            "the whole dataset (meta/ with info.json, data/, videos/), or point data.paths at "
            "a folder of LIBERO *.hdf5 demo files"
        )


def load_demo(info: DemoInfo, cameras: Sequence[str] = ("agentview",)) -> Demo:
    """Read one demo's actions, proprio and the frames of ``cameras`` into memory, with the
    reader that scanned it: an episode of a LeRobot dataset (``info.lerobot`` set), else an
    HDF5 demo."""
    if info.lerobot is not None:
        return load_lerobot_demo(info, cameras)
    return load_hdf5_demo(info, cameras)


def resolve_demo_paths(paths: list[str]) -> list[Path]:
    """Each path as given if it exists, else relative to the repo root; a clear error if not."""
    out = []
    for path in paths:
        candidate = Path(path).expanduser()
        if not candidate.exists() and (REPO_ROOT / path).exists():
            candidate = REPO_ROOT / path
        if not candidate.exists():
            raise FileNotFoundError(
                f"demonstration path {path!r} does not exist (looked in {Path.cwd()} and "
                f"{REPO_ROOT}); set data.paths to demo files or folders (generate them with "
                "`embodied-rl demos`)"
            )
        out.append(candidate)
    return out
