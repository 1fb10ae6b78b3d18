"""Write LIBERO demonstration files (HDF5), in the layout ``demos.py`` describes and reads.

The writer takes episodes in the simulator's conventions (frames rotated by 180 degrees, as
the observations) and stores them as LIBERO does (``"opengl"``, un-rotated), so a file we
write and one of LIBERO's published ``*_demo.hdf5`` files read the same
(:func:`~embodied_rl.data.demos.scan_demo_file`). The scripted planner's
``embodied-rl demos`` writes its demonstrations with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied_rl.data.demos import scan_demo_file


@dataclass
class DemoEpisode:
    """One episode to write, in the simulator's conventions (see :func:`write_demo_file`).

    Attributes:
        actions: ``(T, 7)`` env actions.
        agentview_rgb / eye_in_hand_rgb: ``(T, H, W, 3)`` uint8 frames rotated by 180 degrees,
            as the simulator's observations (stored un-rotated, as LIBERO does).
        ee_states: ``(T, 6)``; gripper_states: ``(T, 2)``; joint_states: ``(T, 7)``.
        states: ``(T, S)`` flattened MuJoCo states, or ``None``.
        robot_states: ``(T, R)``, or ``None``.
        model_file: the MuJoCo XML of the episode's model.
        init_state: ``(S,)`` the flattened state the episode started from, or ``None``.
        attrs: extra demo attributes (e.g. ``embodied_rl_init_state_id``).
    """

    actions: np.ndarray
    agentview_rgb: np.ndarray
    eye_in_hand_rgb: np.ndarray
    ee_states: np.ndarray
    gripper_states: np.ndarray
    joint_states: np.ndarray
    states: np.ndarray | None = None
    robot_states: np.ndarray | None = None
    model_file: str = ""
    init_state: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


def write_demo_file(
    path: str | Path,
    episodes: Sequence[DemoEpisode],
    *,
    problem_info: Mapping[str, Any],
    bddl_file_name: str,
    bddl_file_content: str,
    env_name: str,
    env_args: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``episodes`` as a LIBERO demonstration file (atomically: temp name, then rename).

    An interrupted write leaves at most the hidden ``.<name>.partial``, never a half file under
    the real name; an existing file is replaced only with ``overwrite``.

    Args:
        problem_info: ``{"problem_name", "domain_name", "language_instruction"}``.
        attrs: extra ``data`` attributes (e.g. ``embodied_rl_suite``).
        overwrite: replace an existing file at ``path``.

    Returns:
        The path written. The file reads back with :func:`~embodied_rl.data.demos.scan_demo_file`
        and :func:`~embodied_rl.data.demo_formats.load_demo`.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is false (nothing is written).
    """
    if not episodes:
        raise ValueError("write_demo_file needs at least one episode")
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        _write_file(
            partial,
            episodes,
            problem_info,
            bddl_file_name,
            bddl_file_content,
            env_name,
            env_args,
            attrs,
        )
        _move_into_place(partial, path, overwrite)
    finally:
        partial.unlink(missing_ok=True)
    scan_demo_file(path)  # what we wrote must read back
    return path


def _move_into_place(partial: Path, path: Path, overwrite: bool) -> None:
    """Rename the complete ``partial`` to ``path``; without ``overwrite`` a file that appeared
    at ``path`` meanwhile is kept (a hard link fails on an existing name, atomically)."""
    if overwrite:
        partial.replace(path)
        return
    try:
        os.link(partial, path)
    except FileExistsError:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it") from None


def _write_file(
    partial: Path,
    episodes: Sequence[DemoEpisode],
    problem_info: Mapping[str, Any],
    bddl_file_name: str,
    bddl_file_content: str,
    env_name: str,
    env_args: Mapping[str, Any],
    attrs: Mapping[str, Any] | None,
) -> None:
    """The HDF5 content of :func:`write_demo_file`, written to ``partial``."""
    import h5py

    with h5py.File(partial, "w") as f:
        data = f.create_group("data")
        data.attrs["env_name"] = env_name
        data.attrs["problem_info"] = json.dumps(dict(problem_info))
        data.attrs["macros_image_convention"] = "opengl"
        data.attrs["bddl_file_name"] = bddl_file_name
        data.attrs["bddl_file_content"] = bddl_file_content
        data.attrs["env_args"] = json.dumps(dict(env_args))
        for key, value in (attrs or {}).items():
            data.attrs[key] = value
        for i, episode in enumerate(episodes):
            _write_episode(data.create_group(f"demo_{i}"), episode)
        data.attrs["num_demos"] = len(episodes)
        data.attrs["total"] = int(sum(len(e.actions) for e in episodes))


def _write_episode(group: Any, episode: DemoEpisode) -> None:
    length = len(episode.actions)
    obs = group.create_group("obs")
    for name in ("agentview_rgb", "eye_in_hand_rgb"):
        frames = np.asarray(getattr(episode, name), dtype=np.uint8)
        obs.create_dataset(name, data=np.ascontiguousarray(frames[:, ::-1, ::-1]))  # opengl
    ee_states = np.asarray(episode.ee_states, dtype=np.float64)
    obs.create_dataset("ee_states", data=ee_states)
    obs.create_dataset("ee_pos", data=ee_states[:, :3])
    obs.create_dataset("ee_ori", data=ee_states[:, 3:])
    obs.create_dataset("gripper_states", data=np.asarray(episode.gripper_states, np.float64))
    obs.create_dataset("joint_states", data=np.asarray(episode.joint_states, np.float64))
    group.create_dataset("actions", data=np.asarray(episode.actions, np.float64))
    if episode.states is not None:
        group.create_dataset("states", data=np.asarray(episode.states, np.float64))
    if episode.robot_states is not None:
        group.create_dataset("robot_states", data=np.asarray(episode.robot_states, np.float64))
    ends = np.zeros(length, np.uint8)
    ends[-1] = 1  # LIBERO keeps successful demos only: reward and done on the last step
    group.create_dataset("rewards", data=ends)
    group.create_dataset("dones", data=ends.copy())
    group.attrs["num_samples"] = length
    group.attrs["model_file"] = episode.model_file
    if episode.init_state is not None:
        group.attrs["init_state"] = np.asarray(episode.init_state, np.float64)
    for key, value in episode.attrs.items():
        group.attrs[key] = value
