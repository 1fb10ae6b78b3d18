"""Scripted LIBERO demonstrations: planner episodes in the ``libero`` simulator, demo files.

For each requested task the goal is read from its BDDL file
(:mod:`simulators.libero.goals`), and the scripted planner (:mod:`simulators.libero.planner`)
runs in the ``libero`` simulator itself (:class:`~simulators.libero.env.LiberoVectorEnv`, one
env): the same seeding, init states, settle steps, image flip, proprio and episode limit as
a policy's rollout, so a demo's observations and actions are exactly what a policy sees and
emits. Successful episodes are written in LIBERO's HDF5 layout, one file per task
(``<task name>_demo.hdf5``, :func:`embodied_rl.data.demo_writer.write_demo_file`); a planner
failure is reported and skipped, never written.

Recording convention: step ``t`` stores the observation *before* action ``t`` (OpenVLA's
regenerated LIBERO data does the same; LIBERO's own ``create_dataset.py`` pairs each action
with the observation after it) and the episode ends on the step the task succeeds, like
LIBERO's demos. ``states[t]`` is the flattened MuJoCo state before action ``t``, and the
demo's ``init_state`` attribute is ``states[0]`` (after the settle steps); the official init
state is named by ``embodied_rl_init_state_id``.

The command itself (task selection, the report) is :mod:`simulators.libero.demos_cli`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from embodied_rl.data.demo_writer import DemoEpisode, write_demo_file
from embodied_rl.runtime.config import ConfigError
from embodied_rl.video import write_video
from simulators.libero.env import LiberoConfig, LiberoVectorEnv
from simulators.libero.goals import Step, UnsupportedGoalError
from simulators.libero.planner import ScriptedPlanner
from simulators.libero.planner_config import PlannerConfig
from simulators.libero.privileged import PrivilegedScene
from simulators.libero.suites import CAMERAS, SUITE_MAX_STEPS, import_libero, make_suite

SEED = 0  # env.seed before every reset, as the simulator's default


@dataclass(frozen=True)
class TaskInfo:
    """A task of the suite as the demos need it.

    Attributes:
        task_id: index in the suite.
        name: LIBERO's task name (the demo file is ``<name>_demo.hdf5``).
        instruction: the language instruction a policy is given (``task.language``).
        bddl_path: the task's BDDL file; bddl_text its content.
        num_init_states: official init states of the task.
    """

    task_id: int
    name: str
    instruction: str
    bddl_path: str
    bddl_text: str
    num_init_states: int


@dataclass
class EpisodeResult:
    """One planner episode: success, length, why it failed, and the recording (if any)."""

    init_state_id: int
    success: bool
    steps: int
    failure: str | None = None
    episode: DemoEpisode | None = None


def suite_tasks(suite: str) -> list[TaskInfo]:
    """Every task of ``suite`` (LIBERO's benchmark; no env is built).

    Raises:
        ConfigError: the installed benchmark has no such suite.
    """
    api = import_libero()
    suites = api.benchmark.get_benchmark_dict()
    if suite not in suites:
        raise ConfigError(
            f"unknown LIBERO suite {suite!r}",
            f"use one of {', '.join(sorted(SUITE_MAX_STEPS))} (installed: {len(suites)} suites)",
        )
    benchmark = make_suite(api, suite)
    root = api.get_libero_path("bddl_files")
    tasks = []
    for i in range(benchmark.n_tasks):
        task = benchmark.get_task(i)
        path = os.path.join(root, task.problem_folder, task.bddl_file)
        tasks.append(
            TaskInfo(
                task_id=i,
                name=str(task.name),
                instruction=str(task.language),
                bddl_path=path,
                bddl_text=Path(path).read_text(encoding="utf-8"),
                num_init_states=len(benchmark.get_task_init_states(i)),
            )
        )
    return tasks


def _raw_env(vec: LiberoVectorEnv) -> Any:
    """The robosuite (BDDL) env behind env 0 of ``vec`` (the planner reads its sim state)."""
    return vec.scene(0).env


# What a recorded step stores besides its action (DemoEpisode fields, LIBERO's keys).
FRAME_KEYS = (
    "agentview_rgb",
    "eye_in_hand_rgb",
    "ee_states",
    "gripper_states",
    "joint_states",
    "states",
    "robot_states",
)


def _record(scene: PrivilegedScene, obs: Any, frames: dict[str, list]) -> None:
    """Append the observation before an action (and the sim state) to ``frames``."""
    frames["agentview_rgb"].append(obs.image[0])
    frames["eye_in_hand_rgb"].append(obs.wrist_image[0])
    frames["ee_states"].append(obs.state[0, :6])
    frames["gripper_states"].append(obs.state[0, 6:8])
    frames["joint_states"].append(scene.joint_positions())
    frames["states"].append(scene.flat_state())
    frames["robot_states"].append(scene.robot_state_vector())


def _drive(
    vec: LiberoVectorEnv, planner: ScriptedPlanner, obs: Any, frames: dict[str, list] | None
) -> tuple[list[np.ndarray], bool, str | None]:
    """Step ``vec`` with the planner's actions until success, failure or the step limit.

    Returns:
        ``(actions, success, failure reason)``; ``frames`` (when given) gets each step.
    """
    actions: list[np.ndarray] = []
    while len(actions) < vec.spec.max_steps:
        action = planner.act()
        if planner.failure is not None:
            return actions, False, planner.failure
        if frames is not None:
            _record(planner.scene, obs, frames)
        actions.append(action)
        result = vec.step(action[None])
        obs = result.obs
        if result.done[0]:
            break
    if result.success[0]:
        return actions, True, None
    return actions, False, f"no success in {vec.spec.max_steps} steps (phase {planner.phase!r})"


def run_episode(
    vec: LiberoVectorEnv,
    task: TaskInfo,
    init_state_id: int,
    steps: tuple[Step, ...],
    config: PlannerConfig,
) -> EpisodeResult:
    """Run the planner from one official init state; record it when ``vec`` has cameras.

    The episode ends on success, on the planner giving up, or at the suite's step limit.
    """
    obs = vec.reset([task.task_id], [init_state_id])
    scene = PrivilegedScene(_raw_env(vec))
    frames = {key: [] for key in FRAME_KEYS} if vec.config.cameras else None
    try:
        actions, success, failure = _drive(vec, ScriptedPlanner(scene, steps, config), obs, frames)
    except UnsupportedGoalError as err:  # e.g. an object no grasp fits
        return EpisodeResult(init_state_id, False, 0, str(err))
    episode = None
    if success and frames is not None:
        episode = DemoEpisode(
            actions=np.stack(actions),
            **{key: np.stack(values) for key, values in frames.items()},
            model_file=vec.scene(0).xml(),
            init_state=frames["states"][0],
            attrs={"embodied_rl_init_state_id": init_state_id},
        )
    return EpisodeResult(init_state_id, success, len(actions), failure, episode)


def write_demo_videos(out: Path, task: TaskInfo, results: Sequence[EpisodeResult]) -> list[Path]:
    """One MP4 per recorded episode, ``<out>/videos/<task name>_init<k>.mp4``: the agent
    camera as the demo file holds it, the instruction above, the step below, SUCCESS on the
    last second (LIBERO runs at 20 Hz; the video plays at that rate)."""
    paths = []
    for result in results:
        if result.episode is None:
            continue
        frames = result.episode.agentview_rgb
        path = out / "videos" / f"{task.name}_init{result.init_state_id}.mp4"
        labels = [f"step {t}" for t in range(len(frames))]
        paths.append(write_video(path, frames, 20, task.instruction, "SUCCESS", labels=labels))
    return paths


def demo_path(out: Path, task: TaskInfo) -> Path:
    """``<out>/<task name>_demo.hdf5``: where the demos of ``task`` are written."""
    return out / f"{task.name}_demo.hdf5"


def write_task_demos(
    out: Path,
    suite: str,
    task: TaskInfo,
    vec: LiberoVectorEnv,
    results: Sequence[EpisodeResult],
    overwrite: bool = False,
) -> Path | None:
    """Write the successful recorded episodes of ``task`` to ``<out>/<name>_demo.hdf5``
    (an existing file only with ``overwrite``).

    Returns:
        The file, or ``None`` when no episode succeeded (nothing is written).
    """
    episodes = [r.episode for r in results if r.episode is not None]
    if not episodes:
        return None
    raw = _raw_env(vec)
    size = vec.config.image_size
    env_kwargs = {
        "bddl_file_name": task.bddl_path,
        "camera_names": [CAMERAS[name] for name in vec.config.cameras],
        "camera_heights": size,
        "camera_widths": size,
        "controller": raw.robots[0].controller_config["type"],
        "control_freq": raw.control_freq,
        "seed": vec.config.seed,
        "settle_steps": vec.config.settle_steps,
        "reflections": vec.config.reflections,
    }
    problem_name = raw.parsed_problem["problem_name"]
    return write_demo_file(
        demo_path(out, task),
        episodes,
        overwrite=overwrite,
        problem_info={
            "problem_name": problem_name,
            "domain_name": "robosuite",  # the (:domain ...) of every LIBERO task file
            "language_instruction": task.instruction,
        },
        bddl_file_name=task.bddl_path,
        bddl_file_content=task.bddl_text,
        env_name=type(raw).__name__,
        env_args={
            "type": 1,
            "env_name": type(raw).__name__,
            "problem_name": problem_name,
            "bddl_file": task.bddl_path,
            "env_kwargs": env_kwargs,
        },
        attrs={
            "embodied_rl_suite": suite,
            "embodied_rl_task_id": task.task_id,
            "embodied_rl_source": "scripted planner (simulators/libero/planner.py)",
        },
    )


def _env_options(suite: str, image_size: int | None) -> dict[str, Any]:
    """Simulator options: both cameras at ``image_size``, or no camera (``None``)."""
    if image_size:
        return {
            "suite": suite,
            "seed": SEED,
            "cameras": ("agentview", "wrist"),
            "image_size": image_size,
            "render_size": image_size,
        }
    return {"suite": suite, "seed": SEED, "cameras": (), "render_size": 0}


def run_task(
    suite: str,
    task: TaskInfo,
    steps: tuple[Step, ...],
    init_ids: Sequence[int],
    image_size: int | None,
    out: Path | None,
    bar: tqdm,
    config: PlannerConfig,
    overwrite: bool = False,
    videos: bool = False,
) -> tuple[list[EpisodeResult], Path | None]:
    """Run the planner on ``task`` from each init state in one env, then close it.

    Args:
        image_size: record both cameras at this size and write the successful episodes to
            ``out`` (``None``: no cameras, nothing written; the report's fast mode).
        bar: progress bar, advanced once per episode.
        overwrite: replace an existing demo file of the task.
        videos: also write an MP4 of each written episode (:func:`write_demo_videos`).

    Returns:
        The episode results and the demo file written (``None`` if none).
    """
    vec = LiberoVectorEnv(LiberoConfig(**_env_options(suite, image_size)), 1)
    try:
        results = []
        for init in init_ids:
            results.append(run_episode(vec, task, int(init), steps, config))
            bar.update(1)
            bar.set_postfix(task=task.task_id, ok=sum(r.success for r in results))
        path = None
        if image_size and out is not None:
            path = write_task_demos(out, suite, task, vec, results, overwrite)
            if videos and path is not None:
                write_demo_videos(out, task, results)
        for result in results:
            result.episode = None  # frames are large; the file has them
        return results, path
    finally:
        vec.close()
