"""``embodied-rl demos``: scripted LIBERO demonstrations and a planner success report.

For each requested task the goal is read from its BDDL file
(:mod:`simulators.libero_goals`), and the scripted planner (:mod:`simulators.libero_planner`)
runs in the ``libero`` simulator itself (:class:`~simulators.libero.LiberoVectorEnv`, one
env): the same seeding, init states, settle steps, image flip, proprio and episode limit as
a policy's rollout, so a demo's observations and actions are exactly what a policy sees and
emits. Successful episodes are written in LIBERO's HDF5 layout, one file per task
(``<task name>_demo.hdf5``, :func:`embodied_rl.data.demos.write_demo_file`); a planner failure
is reported and skipped, never written.

Recording convention: step ``t`` stores the observation *before* action ``t`` (OpenVLA's
regenerated LIBERO data does the same; LIBERO's own ``create_dataset.py`` pairs each action
with the observation after it) and the episode ends on the step the task succeeds, like
LIBERO's demos. ``states[t]`` is the flattened MuJoCo state before action ``t``, and the
demo's ``init_state`` attribute is ``states[0]`` (after the settle steps); the official init
state is named by ``embodied_rl_init_state_id``.

``--report`` runs the planner on every official init state of each task without cameras
(about 10x faster) and writes ``report.json`` and ``report.md`` next to the files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from embodied_rl.data.demos import DemoEpisode, write_demo_file
from embodied_rl.registry import COMMANDS
from embodied_rl.runtime.config import ConfigError
from simulators.libero import LiberoConfig, LiberoVectorEnv
from simulators.libero_goals import (
    PickPlace,
    UnsupportedGoalError,
    parse_goal,
    pick_place_steps,
)
from simulators.libero_planner import PickPlacePlanner, PlannerConfig
from simulators.libero_scene import Scene
from simulators.libero_suites import CAMERAS, SUITE_MAX_STEPS, import_libero

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


@dataclass
class TaskReport:
    """Planner outcome on one task over the init states it ran on."""

    task_id: int
    name: str
    instruction: str
    episodes: int = 0
    successes: int = 0
    mean_steps: float | None = None  # over successful episodes
    failed_init_states: list[int] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    unsupported: str | None = None  # the goal is not pick-and-place

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


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
    benchmark = suites[suite]()
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


def check_request(
    tasks: Sequence[TaskInfo], task_ids: Sequence[int], init_ids: Sequence[int], out: Path
) -> None:
    """Refuse ids out of range and an output path that is a file, naming the fix."""
    bad = [t for t in task_ids if not 0 <= t < len(tasks)]
    if bad:
        raise ConfigError(
            f"task id(s) {bad} out of range", f"use ids 0..{len(tasks) - 1} (or 'all')"
        )
    limit = min(tasks[t].num_init_states for t in task_ids) if task_ids else 0
    bad = [i for i in init_ids if not 0 <= i < limit]
    if bad:
        raise ConfigError(
            f"init state id(s) {bad} out of range", f"use ids 0..{limit - 1} (or 'all')"
        )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file", "give a directory (it is created if missing)")


def _raw_env(vec: LiberoVectorEnv) -> Any:
    """The ``OffScreenRenderEnv`` behind env 0 of ``vec`` (the planner reads its sim state)."""
    envs = getattr(vec, "_envs", None)  # LiberoVectorEnv builds them in reset()
    if not envs or envs[0] is None:
        raise RuntimeError(
            "LiberoVectorEnv keeps no '_envs[0]' after reset; the demo recorder needs the "
            "raw LIBERO env of its single env: update simulators/libero_demos._raw_env"
        )
    return envs[0]


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


def _record(scene: Scene, obs: Any, frames: dict[str, list]) -> None:
    """Append the observation before an action (and the sim state) to ``frames``."""
    frames["agentview_rgb"].append(obs.image[0])
    frames["eye_in_hand_rgb"].append(obs.wrist_image[0])
    frames["ee_states"].append(obs.state[0, :6])
    frames["gripper_states"].append(obs.state[0, 6:8])
    frames["joint_states"].append(scene.joint_positions())
    frames["states"].append(scene.flat_state())
    frames["robot_states"].append(scene.robot_state_vector())


def _drive(
    vec: LiberoVectorEnv, planner: PickPlacePlanner, obs: Any, frames: dict[str, list] | None
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
    steps: tuple[PickPlace, ...],
    config: PlannerConfig,
) -> EpisodeResult:
    """Run the planner from one official init state; record it when ``vec`` has cameras.

    The episode ends on success, on the planner giving up, or at the suite's step limit.
    """
    obs = vec.reset([task.task_id], [init_state_id])
    scene = Scene(_raw_env(vec))
    frames = {key: [] for key in FRAME_KEYS} if vec.config.cameras else None
    try:
        actions, success, failure = _drive(vec, PickPlacePlanner(scene, steps, config), obs, frames)
    except UnsupportedGoalError as err:  # e.g. an object no grasp fits
        return EpisodeResult(init_state_id, False, 0, str(err))
    episode = None
    if success and frames is not None:
        episode = DemoEpisode(
            actions=np.stack(actions),
            **{key: np.stack(values) for key, values in frames.items()},
            model_file=scene.env.sim.model.get_xml(),
            init_state=frames["states"][0],
            attrs={"embodied_rl_init_state_id": init_state_id},
        )
    return EpisodeResult(init_state_id, success, len(actions), failure, episode)


def write_task_demos(
    out: Path, suite: str, task: TaskInfo, vec: LiberoVectorEnv, results: Sequence[EpisodeResult]
) -> Path | None:
    """Write the successful recorded episodes of ``task`` to ``<out>/<name>_demo.hdf5``.

    Returns:
        The file, or ``None`` when no episode succeeded (nothing is written).
    """
    episodes = [r.episode for r in results if r.episode is not None]
    if not episodes:
        return None
    raw = _raw_env(vec).env
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
        out / f"{task.name}_demo.hdf5",
        episodes,
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
            "embodied_rl_source": "scripted pick-and-place planner (simulators/libero_planner.py)",
        },
    )


def summarise(task: TaskInfo, results: Sequence[EpisodeResult]) -> TaskReport:
    """Success count, mean successful length and failures of one task's episodes."""
    lengths = [r.steps for r in results if r.success]
    failed = [r for r in results if not r.success]
    return TaskReport(
        task_id=task.task_id,
        name=task.name,
        instruction=task.instruction,
        episodes=len(results),
        successes=len(lengths),
        mean_steps=float(np.mean(lengths)) if lengths else None,
        failed_init_states=[r.init_state_id for r in failed],
        failures={r.init_state_id: str(r.failure) for r in failed},
    )


def report_markdown(suite: str, reports: Sequence[TaskReport]) -> str:
    """A Markdown table: task, instruction, successes/episodes, rate, mean steps, failures."""
    lines = [
        f"# Scripted planner on {suite}",
        "",
        "| task | instruction | successes | rate | mean steps | failed init states |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in reports:
        if r.unsupported is not None:
            lines.append(
                f"| {r.task_id} | {r.instruction} | - | - | - | unsupported: {r.unsupported} |"
            )
            continue
        steps = "-" if r.mean_steps is None else f"{r.mean_steps:.1f}"
        failed = ", ".join(map(str, r.failed_init_states)) or "none"
        lines.append(
            f"| {r.task_id} | {r.instruction} | {r.successes}/{r.episodes} | "
            f"{r.rate:.0%} | {steps} | {failed} |"
        )
    ran = [r for r in reports if r.unsupported is None]
    total, wins = sum(r.episodes for r in ran), sum(r.successes for r in ran)
    if total:
        lines += ["", f"Overall: {wins}/{total} ({wins / total:.1%})."]
    return "\n".join(lines) + "\n"


def write_report(out: Path, suite: str, reports: Sequence[TaskReport]) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "suite": suite,
        "tasks": [{**asdict(r), "rate": r.rate} for r in reports],
    }
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(report_markdown(suite, reports), encoding="utf-8")
    return json_path, md_path


def _goal_steps(tasks: Sequence[TaskInfo]) -> dict[int, tuple[PickPlace, ...] | str]:
    """Each task's pick-and-place steps, or the reason its goal is unsupported."""
    goals: dict[int, tuple[PickPlace, ...] | str] = {}
    for task in tasks:
        try:
            goals[task.task_id] = pick_place_steps(parse_goal(task.bddl_text))
        except UnsupportedGoalError as err:
            goals[task.task_id] = str(err)
    return goals


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
    steps: tuple[PickPlace, ...],
    init_ids: Sequence[int],
    image_size: int | None,
    out: Path | None,
    bar: tqdm,
    config: PlannerConfig,
) -> tuple[list[EpisodeResult], Path | None]:
    """Run the planner on ``task`` from each init state in one env, then close it.

    Args:
        image_size: record both cameras at this size and write the successful episodes to
            ``out`` (``None``: no cameras, nothing written; the report's fast mode).
        bar: progress bar, advanced once per episode.

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
            path = write_task_demos(out, suite, task, vec, results)
        for result in results:
            result.episode = None  # frames are large; the file has them
        return results, path
    finally:
        vec.close()


def _resolve(ids: Sequence[int] | None, count: int) -> list[int]:
    """``None`` (all) -> ``0..count-1``; otherwise the ids, deduplicated in order."""
    return list(range(count)) if ids is None else list(dict.fromkeys(int(i) for i in ids))


def demos_command(
    *,
    suite: str,
    tasks: Sequence[int] | None,
    init_states: Sequence[int] | None,
    out: str | Path,
    image_size: int = 128,
    report: bool = False,
    progress: bool = True,
    config: PlannerConfig | None = None,
) -> int:
    """Write scripted demos of ``tasks`` from ``init_states`` and optionally the report.

    Args:
        tasks: task ids (``None``: every task of the suite).
        init_states: official init-state ids to record (``None``: all; empty: no demos).
        out: directory for ``<task name>_demo.hdf5`` and ``report.{json,md}``.
        image_size: side of both cameras' frames in the demos.
        report: also run every init state of each task without cameras and write the
            success report.

    Returns:
        The exit status (0).

    Raises:
        ConfigError: bad input (unknown suite, ids out of range, ``out`` is a file, no task
            with a pick-and-place goal), naming the fix.
    """
    out = Path(out)
    if image_size < 1:
        raise ConfigError(f"--image-size {image_size} must be >= 1", "use e.g. 128 or 64")
    infos = suite_tasks(suite)
    task_ids = _resolve(tasks, len(infos))
    check_request(infos, task_ids, [] if init_states is None else list(init_states), out)
    selected = [infos[t] for t in task_ids]
    goals = _goal_steps(selected)
    if all(isinstance(goal, str) for goal in goals.values()):
        raise ConfigError(
            f"no selected task of {suite} has a pick-and-place goal ({next(iter(goals.values()))})",
            "choose tasks whose goals are In/On predicates, e.g. --suite libero_object",
        )
    config = config or PlannerConfig()
    runnable = [t for t in selected if not isinstance(goals[t.task_id], str)]
    demo_ids = {t.task_id: _resolve(init_states, t.num_init_states) for t in runnable}
    total = sum(len(ids) for ids in demo_ids.values())
    total += sum(t.num_init_states for t in runnable) if report else 0
    reports = []
    with tqdm(total=total, desc=f"{suite} episodes", disable=not progress) as bar:
        for task in selected:
            steps = goals[task.task_id]
            if isinstance(steps, str):
                tqdm.write(f"task {task.task_id} ({task.name}): skipped, {steps}")
                reports.append(_unsupported(task, steps))
                continue
            if demo_ids[task.task_id]:
                results, path = run_task(
                    suite, task, steps, demo_ids[task.task_id], image_size, out, bar, config
                )
                tqdm.write(_demo_line(task, results, path))
            if report:
                ids = range(task.num_init_states)
                results, _ = run_task(suite, task, steps, ids, None, None, bar, config)
                reports.append(summarise(task, results))
                tqdm.write(_report_line(reports[-1]))
                write_report(out, suite, reports)  # so far: a long run shows its progress
    if report:
        json_path, md_path = write_report(out, suite, reports)
        print(report_markdown(suite, reports), end="")
        print(f"report: {json_path} and {md_path}")
    return 0


def _unsupported(task: TaskInfo, reason: str) -> TaskReport:
    return TaskReport(task.task_id, task.name, task.instruction, unsupported=reason)


def _report_line(report: TaskReport) -> str:
    steps = "-" if report.mean_steps is None else f"{report.mean_steps:.1f}"
    return (
        f"task {report.task_id} report: {report.successes}/{report.episodes} successes, "
        f"mean steps {steps}, failed init states {report.failed_init_states}"
    )


def _demo_line(task: TaskInfo, results: Sequence[EpisodeResult], path: Path | None) -> str:
    """One line per task: file, demo lengths, failed init states."""
    lengths = [r.steps for r in results if r.success]
    failed = {r.init_state_id: r.failure for r in results if not r.success}
    where = f"wrote {path}" if path is not None else "no file (no success)"
    text = f"task {task.task_id}: {where}: {len(lengths)}/{len(results)} demos, steps {lengths}"
    return text + (f"; failed {failed}" if failed else "")


COMMANDS.register("demos", demos_command)
