"""``libero``: the LIBERO benchmark (robosuite/MuJoCo) as a vector env, OpenVLA conventions.

Episodes. Env ``i`` runs its episode in a built scene of its task
(:class:`~simulators.libero.scene.LiberoScene`). A reset puts the scene at the official init
state after ``env.seed(seed)`` and a reset of the simulation, then takes ``settle_steps``
no-op actions (``[0, 0, 0, 0, 0, 0, -1]``) that are not counted as episode steps. Seeding
before *every* reset makes the same ``(task, init_state)`` give the same episode in any
process and any scene: the seed drives the scene layout (fixture placement) that the init
state does not set. (LIBERO's ``seed`` reseeds NumPy's global RNG.)

- ``reset_mode: soft`` (default) resets the built scene in place in milliseconds, then the
  init state and the settle steps (mostly the settle steps' physics). The result is bit for
  bit a hard reset's (see :mod:`simulators.libero.scene`). ``hard`` rebuilds the MuJoCo
  model for every episode as robosuite's default reset does (seconds more per env); it
  remains for comparisons.
- Built scenes are kept: the vector env holds at most ``num_envs * max_cached_tasks`` of
  them, by task, and a reset gives env ``i`` an idle scene of its task when there is one,
  builds one otherwise and closes the least recently used idle scenes beyond that, then
  gives the freed heap back to the OS (:func:`~embodied_rl.runtime.memory.release_free_heap`).
  What stays (figures for libero_spatial in docs/benchmarks/code_figures.md): each scene (its
  model has no texture pixels: :mod:`simulators.libero.scene`),
  the task's renderer, shared by its scenes and the larger part (the GL copy of the
  textures, each image once: :mod:`simulators.libero.render`), robosuite's numba and LLVM
  once per process, and MuJoCo's asset cache.
  2 workers x 8 envs thus hold 16 scenes plus a renderer per task in use; the default 1
  keeps only the scenes in use (a task change rebuilds), 2 pays off only when tasks recur
  within two waves (few tasks, evaluation). Episodes do not depend on which scene runs
  them.

Observations (:class:`Obs`): ``image (N, H, W, 3)`` the agentview camera rotated by
180 degrees, ``wrist_image`` the wrist camera likewise (when ``"wrist"`` is in ``cameras``),
``state (N, 8)`` = eef position, axis-angle of the eef quaternion, gripper finger positions;
all as robosuite samples them in a step (after its 24th of 25 physics substeps). Actions
``(N, 7)``: delta eef position (3), delta rotation (3), gripper (-1 open, +1 close), as a
LIBERO-fine-tuned OpenVLA outputs them after its gripper conversion; clipped to ``[-1, 1]``.
Reward 1 on the step the task succeeds (``env.check_success()``), else 0; an episode ends on
success or after ``max_steps`` steps (per-suite default).

Rendering sets the speed on CPUs (software rendering: a 64-128 px frame costs 2-4 times the
physics of a step), so images are drawn only when an observation is returned: once per
``step``, once per ``step_chunk`` (a policy's chunk of ``C`` actions: the intermediate steps
draw nothing; ``step_filmed`` likewise, plus its video frames) and once after a reset. Only
the observed ``cameras`` are drawn, at ``image_size``, without reflections unless asked
(robosuite has no option for them; they cost about as much as the rest of a frame).
``render()`` draws the agentview at ``render_size`` (the SRPO encoder's frames), or returns
the observed image when the sizes match; ``render(size)`` draws it at ``size`` (an
evaluation's videos; at most ``MAX_FRAME_SIZE``, 480).
``cameras=[]`` with ``render_size: 0`` creates no GL context at all.

The process pool (:mod:`simulators.workers`) carries ``wrist_image`` beside ``image`` and
``state`` (``EnvSpec.wrist_shape``).

``privileged_progress()``: each env's progress towards its task's BDDL goal, read from the
simulator state (:mod:`simulators.libero.progress`; recorded from each reset's state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied_rl.checks import check_range
from embodied_rl.runtime.memory import release_free_heap
from simulators.base import (
    EnvSpec,
    Obs,
    StepResult,
    VectorEnv,
    check_action_chunk,
    check_actions,
    check_active,
    check_env_ids,
    check_reset_ids,
    stack_frames,
)
from simulators.libero.privileged import PrivilegedScene
from simulators.libero.progress import PrivilegedProgress, env_progress
from simulators.libero.render import MAX_FRAME_SIZE, TaskRenderer
from simulators.libero.scene import LiberoScene, ResetSnapshot
from simulators.libero.suites import (
    ACTION_DIM,
    CAMERAS,
    PRETRAINING_SUITES,
    PROPRIO_DIM,
    SUITE_MAX_STEPS,
    SUITE_SIZES,
    flip_image,
    import_libero,
    make_suite,
    proprio_from_obs,
)
from simulators.registry import config_from_options, register_simulator

RESET_MODES = ("soft", "hard")


@dataclass
class LiberoConfig:
    """Options of the ``libero`` simulator.

    Attributes:
        suite: ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10`` or
            ``libero_90``; another suite of the installed benchmark (e.g. a LIBERO-PRO
            perturbation) needs an explicit ``max_steps``.
        image_size: side of the square camera observations in pixels.
        cameras: observed cameras, from ``agentview`` (the policy image, ``Obs.image``) and
            ``wrist`` (``Obs.wrist_image``); ``wrist`` needs ``agentview``; empty =
            state only.
        reflections: render MuJoCo reflections (slower; the official evaluation has them).
        max_steps: episode length limit in env steps; ``None`` = the suite's default.
        settle_steps: uncounted no-op steps after setting the init state.
        seed: ``env.seed`` before every reset (scene layout).
        render_size: side of the agentview frames ``render()`` returns (videos); 0 = cannot
            render. Equal to ``image_size`` with ``agentview`` observed, it costs nothing.
        reset_mode: ``soft`` resets a built scene in place (exactly a hard reset's result,
            an order of magnitude faster); ``hard`` rebuilds the MuJoCo model for every episode.
        max_cached_tasks: built scenes kept per env (by task, least recently used closed
            first); 1 keeps the scenes in use only. Each costs RAM (plus the task's renderer;
            sizes in docs/benchmarks/code_figures.md).
    """

    suite: str = "libero_spatial"
    image_size: int = 128
    cameras: Sequence[str] = ("agentview", "wrist")
    reflections: bool = False
    max_steps: int | None = None
    settle_steps: int = 10
    seed: int = 0
    render_size: int = 128
    reset_mode: str = "soft"
    max_cached_tasks: int = 1

    def __post_init__(self) -> None:
        check_range("libero seed", self.seed, 0)
        cameras = [self.cameras] if isinstance(self.cameras, str) else list(self.cameras)
        self.cameras = tuple(str(camera) for camera in cameras)
        unknown = sorted(set(self.cameras) - set(CAMERAS))
        if unknown or len(set(self.cameras)) != len(self.cameras):
            raise ValueError(
                f"libero cameras must be distinct names from {sorted(CAMERAS)}, "
                f"got {list(self.cameras)}"
            )
        if self.cameras and "agentview" not in self.cameras:
            raise ValueError("libero cameras: 'wrist' needs 'agentview' (the policy image)")
        if self.suite not in SUITE_MAX_STEPS and self.max_steps is None:
            raise ValueError(
                f"libero suite {self.suite!r} has no default max_steps; use one of "
                f"{sorted(SUITE_MAX_STEPS)} or set max_steps"
            )
        check_range("libero max_steps", self.max_steps, 1, note=" or None")
        check_range("libero image_size", self.image_size, 1)
        check_range("libero render_size", self.render_size, 0)
        check_range("libero settle_steps", self.settle_steps, 0)
        if self.reset_mode not in RESET_MODES:
            raise ValueError(
                f"libero reset_mode must be one of {list(RESET_MODES)}, got {self.reset_mode!r}"
            )
        only_in_use = " (1 = keep the scenes in use only)"
        check_range("libero max_cached_tasks", self.max_cached_tasks, 1, note=only_in_use)

    @property
    def pretraining_suite(self) -> str | None:
        """The suite when it is a pretraining corpus only (LIBERO-90), else ``None``."""
        return self.suite if self.suite in PRETRAINING_SUITES else None

    def limits(self) -> dict[str, int]:
        """Tasks and init states per task of the suite (``Simulator.limits``): known for
        LIBERO's own suites without importing LIBERO; only the frame size for others."""
        limits = {"max_render_size": MAX_FRAME_SIZE, "state_dim": PROPRIO_DIM}
        if self.suite in SUITE_SIZES:
            num_tasks, num_init_states = SUITE_SIZES[self.suite]
            limits.update(num_tasks=num_tasks, num_init_states=num_init_states)
        return limits

    @property
    def episode_steps(self) -> int:
        """The episode limit: ``max_steps`` or the suite's default."""
        return self.max_steps if self.max_steps is not None else SUITE_MAX_STEPS[self.suite]


@dataclass
class _Built:
    """A built scene and its task."""

    task: int
    scene: LiberoScene


@dataclass
class _TaskAssets:
    """What the scenes of one task share in this process (while one of them is built)."""

    snapshot: ResetSnapshot
    renderer: TaskRenderer | None  # None: nothing to draw (no cameras, render_size 0)


class LiberoVectorEnv(VectorEnv):
    """``num_envs`` LIBERO envs of one suite, stepped in turn in this process.

    Building this loads the suite's task list and init states (fast); scenes (and GL
    contexts) are created by ``reset``, in the calling process.

    Args:
        config: the simulator options.
        num_envs: ``N``.

    Raises:
        ImportError: LIBERO is not installed (the message names the install command).
    """

    def __init__(self, config: LiberoConfig, num_envs: int) -> None:
        check_range("libero num_envs", num_envs, 1)
        self.config = config
        self.num_envs = num_envs
        self._api = import_libero()
        suites = self._api.benchmark.get_benchmark_dict()
        if config.suite not in suites:
            raise ValueError(
                f"unknown LIBERO suite {config.suite!r}; the installed benchmark has: "
                f"{', '.join(sorted(suites))}"
            )
        suite = make_suite(self._api, config.suite)
        self._tasks = [suite.get_task(i) for i in range(suite.n_tasks)]
        self._init_states = [
            np.asarray(suite.get_task_init_states(i)) for i in range(suite.n_tasks)
        ]
        size, render = config.image_size, config.render_size
        self.spec = EnvSpec(
            image_shape=(size, size, 3) if config.cameras else None,
            state_dim=PROPRIO_DIM,
            action_dim=ACTION_DIM,
            action_low=-1.0,
            action_high=1.0,
            max_steps=config.episode_steps,
            num_tasks=len(self._tasks),
            num_init_states=min(len(states) for states in self._init_states),
            render_shape=(render, render, 3) if render else None,
            wrist_shape=(size, size, 3) if "wrist" in config.cameras else None,
        )
        self._scene_of: list[_Built | None] = [None] * num_envs  # None: no reset, or left out
        self._progress: list[PrivilegedProgress | None] = [None] * num_envs  # None: left out
        self._idle: list[_Built] = []  # kept scenes, least recently used first
        self._assets: dict[int, _TaskAssets] = {}
        self._steps = np.zeros(num_envs, np.int64)
        self._done = np.zeros(num_envs, bool)
        self._success = np.zeros(num_envs, bool)
        self._inactive = np.zeros(num_envs, bool)  # left out of the last reset
        self._state = np.zeros((num_envs, PROPRIO_DIM), np.float32)
        shape = (num_envs, size, size, 3)
        self._image = np.zeros(shape, np.uint8) if config.cameras else None
        self._wrist = np.zeros(shape, np.uint8) if "wrist" in config.cameras else None
        self._descriptions: list[str] = []
        self._was_reset = False

    @property
    def task_descriptions(self) -> list[str]:
        """The language instruction of each env's task (``task.language``)."""
        return list(self._descriptions)

    def scene(self, i: int) -> LiberoScene:
        """The built scene env ``i`` runs its episode in (after a reset): MuJoCo model/data,
        robosuite env, for tools that read object poses (a scripted planner, tests)."""
        built = self._scene_of[i]
        if built is None:
            raise RuntimeError(
                f"libero: env {i} has no scene: call reset() first, with env {i} active"
            )
        return built.scene

    def reset(
        self,
        task_ids: Sequence[int],
        init_state_ids: Sequence[int],
        active: Sequence[bool] | None = None,
    ) -> Obs:
        tasks, inits = check_reset_ids(self.spec, self.num_envs, task_ids, init_state_ids)
        self._inactive = ~check_active(self.num_envs, active)
        self._was_reset = False  # a failure below leaves the batch unusable until a reset
        # An inactive env gets no scene: nothing is built, settled or drawn for it.
        self._assign_scenes([None if off else int(t) for t, off in zip(tasks, self._inactive)])
        hard = self.config.reset_mode == "hard"
        for i in np.flatnonzero(~self._inactive):
            built = self._scene_of[i]
            init_state = self._init_states[built.task][int(inits[i])]
            raw_obs = built.scene.reset(init_state, self.config.settle_steps, hard=hard)
            self._store(i, raw_obs)
            scene = PrivilegedScene(built.scene.env)  # bound to this reset's model (hard: new)
            self._progress[i] = PrivilegedProgress.of_file(built.scene.bddl_file).start(scene)
        self._progress = [None if off else p for p, off in zip(self._progress, self._inactive)]
        self._clear_rows(self._inactive)
        self._steps[:] = 0
        self._done[:] = self._inactive
        self._success[:] = False
        self._descriptions = [
            "" if off else str(self._tasks[t].language) for t, off in zip(tasks, self._inactive)
        ]
        self._was_reset = True
        return self._obs()

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` ``(N, 7)`` (clipped to ``[-1, 1]``) to the envs not done."""
        actions = check_actions(self.spec, self.num_envs, actions)
        return self.step_chunk(actions[:, None])

    def step_chunk(self, actions: np.ndarray) -> StepResult:
        """Apply ``C`` actions per env, ``(N, C, 7)``, drawing the observations once, after.

        An env that finishes mid-chunk skips the rest of its actions and keeps the
        observation of its final step; the reward is 1 for the chunk the task succeeds in.
        """
        return self._run_chunk(actions, 0, [])[0]

    def step_filmed(
        self, actions: np.ndarray, size: int, envs: Sequence[int]
    ) -> tuple[StepResult, list[np.ndarray]]:
        """``step_chunk`` plus an agentview frame of each of ``envs`` after each env step.

        The policy's observation is still drawn once per chunk: a video frame costs one
        drawing (a replay that stepped one action at a time drew both, every env step).
        """
        check_range("libero render size", size, 1, MAX_FRAME_SIZE)
        return self._run_chunk(actions, size, check_env_ids(self.num_envs, envs, self._inactive))

    def _run_chunk(
        self, actions: np.ndarray, size: int, filmed: list[int]
    ) -> tuple[StepResult, list[np.ndarray]]:
        """``step_chunk`` of ``actions`` ``(N, C, 7)``; a ``size`` frame of each env of
        ``filmed`` after each of its env steps (``(K, size, size, 3)`` per env)."""
        if not self._was_reset:
            raise RuntimeError("libero: call reset() before step()")
        chunk = np.clip(check_action_chunk(self.spec, self.num_envs, actions), -1.0, 1.0)
        reward = np.zeros(self.num_envs, np.float32)
        frames: dict[int, list[np.ndarray]] = {i: [] for i in filmed}
        for i in np.flatnonzero(~self._done):
            built = self._scene_of[i]
            for action in chunk[i]:
                raw_obs = built.scene.step(action.tolist())
                self._steps[i] += 1
                self._success[i] = built.scene.success()
                self._done[i] = self._success[i] or self._steps[i] >= self.spec.max_steps
                if i in frames:
                    frames[i].append(self._draw_current(built, size))
                if self._done[i]:
                    break
            reward[i] = float(self._success[i])
            self._store(i, raw_obs)
        result = StepResult(self._obs(), reward, self._done.copy(), self._success.copy())
        return result, [stack_frames(frames[i], size) for i in filmed]

    def privileged_progress(self) -> np.ndarray:
        """``(N,)`` float32 privileged progress of each env's state now (1.0 at success;
        :mod:`simulators.libero.progress`); 0 for envs left out; NaN for an env whose task's
        goal has a predicate without a measure (``Turnoff``, ...: its rollouts record NaN,
        and ``reward.progress_oracle`` refuses them). A done env is not stepped, so its value
        stays the one its episode ended with.
        """
        if not self._was_reset:
            raise RuntimeError("libero: call reset() before privileged_progress()")
        return np.array([env_progress(p) for p in self._progress], np.float32)

    def render(self, size: int | None = None, envs: Sequence[int] | None = None) -> np.ndarray:
        """Return ``(N, S, S, 3)`` uint8 agentview frames of the current states, rotated.

        Args:
            size: ``S``, at most ``MAX_FRAME_SIZE``; ``None`` = ``render_size``, which
                returns the observed image when it equals ``image_size``.
            envs: the envs to draw (``N`` = ``len(envs)``); ``None`` = all.
        """
        if not self._was_reset:
            raise RuntimeError("libero: call reset() before render()")
        ids = check_env_ids(self.num_envs, envs, self._inactive)
        if size is None:
            size = self.config.render_size
            if not size:
                raise RuntimeError("libero: render() needs render_size > 0 (or a size)")
            if self._image is not None and size == self.config.image_size:
                return self._image[ids]  # the observed frames are the requested ones (a copy)
        check_range("libero render size", size, 1, MAX_FRAME_SIZE)
        if not ids:
            return np.zeros((0, size, size, 3), np.uint8)
        return np.stack([self._draw_current(self._scene_of[i], size) for i in ids])

    def close(self) -> None:
        for built in [b for b in self._scene_of if b is not None] + self._idle:
            built.scene.close()
        self._scene_of, self._idle = [None] * self.num_envs, []
        self._drop_unused_assets()
        self._was_reset = False

    # --- internals ---------------------------------------------------------------------------

    def _assign_scenes(self, tasks: list[int | None]) -> None:
        """Give env ``i`` a built scene of ``tasks[i]``: an idle one, else a new one (none
        for ``None``: an inactive env).

        Idle scenes beyond ``num_envs * max_cached_tasks`` built ones are closed (least
        recently used first) before new ones are built, so memory never exceeds that many.
        """
        self._idle.extend(b for b in self._scene_of if b is not None)  # most recent last
        self._scene_of = [None] * self.num_envs
        for i, task in enumerate(tasks):
            mine = [k for k, built in enumerate(self._idle) if built.task == task]
            if mine:
                self._scene_of[i] = self._idle.pop(mine[-1])
        capacity = self.num_envs * self.config.max_cached_tasks
        changed = False
        while self._idle and len(self._idle) + self.num_envs > capacity:
            self._idle.pop(0).scene.close()
            changed = True
        self._drop_unused_assets()
        for i, task in enumerate(tasks):
            if self._scene_of[i] is None and task is not None:
                self._scene_of[i] = _Built(task, self._build(task))
                changed = True
        if changed:  # building and closing scenes frees hundreds of MB of temporaries
            release_free_heap()

    def _build(self, task: int) -> LiberoScene:
        """A new scene of ``task`` (seconds); the task's renderer and snapshot on its first."""
        assets = self._assets.get(task)
        scene = LiberoScene.build(
            self._api,
            self._tasks[task],
            # robosuite refuses steps past its horizon: leave room for settle + episode.
            horizon=self.config.settle_steps + self.spec.max_steps,
            seed=self.config.seed,
            snapshot=assets.snapshot if assets is not None else None,
        )
        if assets is None:
            draws = bool(self.config.cameras) or self.config.render_size > 0
            renderer = None
            if draws:  # the scene's model has no texture pixels: upload the full model's
                renderer = TaskRenderer(scene.textured_model(), self.config.reflections)
            self._assets[task] = _TaskAssets(scene.snapshot, renderer)
        return scene

    def _drop_unused_assets(self) -> None:
        """Free the renderers (GL contexts) of tasks no built scene has anymore."""
        kept = {b.task for b in self._scene_of if b is not None} | {b.task for b in self._idle}
        for task in [t for t in self._assets if t not in kept]:
            renderer = self._assets.pop(task).renderer
            if renderer is not None:
                renderer.close()

    def _draw_current(self, built: _Built, size: int) -> np.ndarray:
        """``(size, size, 3)`` uint8: the agentview of ``built``'s state now, rotated."""
        renderer = self._assets[built.task].renderer
        if renderer is None:
            raise RuntimeError("libero: cameras=[] and render_size 0 draw nothing; set render_size")
        return flip_image(built.scene.draw_current(renderer, CAMERAS["agentview"], size))

    def _store(self, i: int, raw_obs: Mapping[str, np.ndarray]) -> None:
        """Env ``i``'s observation into its rows: proprio from ``raw_obs``, images drawn."""
        self._state[i] = proprio_from_obs(raw_obs)
        if self._image is None:
            return
        built = self._scene_of[i]
        renderer, size = self._assets[built.task].renderer, self.config.image_size
        self._image[i] = flip_image(built.scene.draw_observed(renderer, CAMERAS["agentview"], size))
        if self._wrist is not None:
            wrist = built.scene.draw_observed(renderer, CAMERAS["wrist"], size)
            self._wrist[i] = flip_image(wrist)

    def _clear_rows(self, envs: np.ndarray) -> None:
        """Zero the observation rows of ``envs`` (``(N,)`` bool): the inactive ones."""
        self._state[envs] = 0.0
        for images in (self._image, self._wrist):
            if images is not None:
                images[envs] = 0

    def _obs(self) -> Obs:
        return Obs(
            image=None if self._image is None else self._image.copy(),
            state=self._state.copy(),
            wrist_image=None if self._wrist is None else self._wrist.copy(),
        )


@register_simulator("libero", config=LiberoConfig)
def build_libero(options: Mapping[str, Any] | None, num_envs: int) -> LiberoVectorEnv:
    """Registered builder of the ``libero`` simulator (options: the fields of LiberoConfig).

    Raises:
        ImportError: LIBERO is not installed (naming the install command).
    """
    return LiberoVectorEnv(config_from_options(LiberoConfig, options, "libero"), num_envs)
