"""``libero``: the LIBERO benchmark (robosuite/MuJoCo) as a vector env, OpenVLA conventions.

Env ``i`` holds one ``OffScreenRenderEnv`` built from its task's BDDL file. ``reset`` keeps
that env when the task is unchanged (building one takes 3-7 s) and otherwise rebuilds it,
then: ``env.seed(seed)``, ``env.reset()``, ``env.set_init_state(<official init state>)`` and
``settle_steps`` no-op actions (``[0, 0, 0, 0, 0, 0, -1]``) that are not counted as episode
steps. Seeding before *every* reset makes the same ``(task, init_state)`` give the same
episode in any process: the seed drives the scene layout (fixture placement) that the init
state does not set. (LIBERO's ``seed`` reseeds NumPy's global RNG.)

Observations (:class:`LiberoObs`): ``image (N, H, W, 3)`` the agentview camera rotated by
180 degrees, ``wrist_image`` the wrist camera likewise (when ``"wrist"`` is in ``cameras``),
``state (N, 8)`` = eef position, axis-angle of the eef quaternion, gripper finger positions.
Actions ``(N, 7)``: delta eef position (3), delta rotation (3), gripper (-1 open, +1 close),
as a LIBERO-fine-tuned OpenVLA outputs them after its gripper conversion; clipped to
``[-1, 1]``. Reward 1 on the step the task succeeds (``env.check_success()``), else 0; an
episode ends on success or after ``max_steps`` steps (per-suite default).

``wrist_image`` is an extra field of this simulator's observations: the process pool
(:mod:`simulators.workers`) carries ``image`` and ``state`` only.

Speed on 2 CPU cores (software rendering) is set by rendering: leave ``reflections`` off
(MuJoCo's reflective materials cost about as much as the rest of a frame; robosuite has no
option for them, so the scene flag ``mjRND_REFLECTION`` of the offscreen context is cleared
after each reset) and list only the cameras the policy reads; ``cameras=[]`` renders
nothing but ``render()`` frames.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied_rl.registry import SIMULATORS
from simulators.base import (
    EnvSpec,
    Obs,
    StepResult,
    VectorEnv,
    check_actions,
    check_reset_ids,
    config_from_options,
)
from simulators.libero_suites import (
    ACTION_DIM,
    CAMERAS,
    NOOP_ACTION,
    PROPRIO_DIM,
    SUITE_MAX_STEPS,
    flip_image,
    import_libero,
    proprio_from_obs,
)

# Headless rendering by default; must be set before mujoco is imported (a caller's choice,
# e.g. MUJOCO_GL=osmesa, wins).
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402


@dataclass
class LiberoConfig:
    """Options of the ``libero`` simulator.

    Attributes:
        suite: ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10`` or
            ``libero_90``; another suite of the installed benchmark (e.g. a LIBERO-PRO
            perturbation) needs an explicit ``max_steps``.
        image_size: side of the square camera observations in pixels.
        cameras: observed cameras, from ``agentview`` (the policy image, ``Obs.image``) and
            ``wrist`` (``LiberoObs.wrist_image``); ``wrist`` needs ``agentview``; empty =
            state only.
        reflections: render MuJoCo reflections (slower; the official evaluation has them).
        max_steps: episode length limit in env steps; ``None`` = the suite's default.
        settle_steps: uncounted no-op steps after setting the init state.
        seed: ``env.seed`` before every reset (scene layout).
        render_size: side of the agentview frames ``render()`` returns (videos); 0 = cannot
            render. Equal to ``image_size`` with ``agentview`` observed, it costs nothing.
    """

    suite: str = "libero_spatial"
    image_size: int = 128
    cameras: Sequence[str] = ("agentview", "wrist")
    reflections: bool = False
    max_steps: int | None = None
    settle_steps: int = 10
    seed: int = 0
    render_size: int = 128

    def __post_init__(self) -> None:
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
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"libero max_steps must be >= 1 or None, got {self.max_steps}")
        if self.image_size < 1 or self.render_size < 0 or self.settle_steps < 0:
            raise ValueError("libero needs image_size >= 1, render_size >= 0, settle_steps >= 0")

    @property
    def episode_steps(self) -> int:
        """The episode limit: ``max_steps`` or the suite's default."""
        return self.max_steps if self.max_steps is not None else SUITE_MAX_STEPS[self.suite]


@dataclass
class LiberoObs(Obs):
    """LIBERO observations: :class:`Obs` plus the wrist camera.

    Attributes:
        wrist_image: ``(N, H, W, 3)`` uint8 wrist images (rotated by 180 degrees), ``None``
            when ``"wrist"`` is not among the cameras.
    """

    wrist_image: np.ndarray | None = None


class LiberoVectorEnv(VectorEnv):
    """``num_envs`` LIBERO envs of one suite, stepped in turn in this process.

    Building this loads the suite's task list and init states (fast); the robosuite envs
    (and their GL contexts) are created by the first ``reset``, in the calling process.

    Args:
        config: the simulator options.
        num_envs: ``N``.

    Raises:
        ImportError: LIBERO is not installed (the message names the install command).
    """

    def __init__(self, config: LiberoConfig, num_envs: int) -> None:
        if num_envs < 1:
            raise ValueError(f"libero needs num_envs >= 1, got {num_envs}")
        self.config = config
        self.num_envs = num_envs
        self._api = import_libero()
        suites = self._api.benchmark.get_benchmark_dict()
        if config.suite not in suites:
            raise ValueError(
                f"unknown LIBERO suite {config.suite!r}; the installed benchmark has: "
                f"{', '.join(sorted(suites))}"
            )
        suite = suites[config.suite]()
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
        )
        self._envs: list[Any] = [None] * num_envs  # OffScreenRenderEnv, built by reset
        self._task = np.full(num_envs, -1, np.int64)  # task of each built env, -1 = none
        self._steps = np.zeros(num_envs, np.int64)
        self._done = np.zeros(num_envs, bool)
        self._success = np.zeros(num_envs, bool)
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

    def reset(self, task_ids: Sequence[int], init_state_ids: Sequence[int]) -> LiberoObs:
        tasks, inits = check_reset_ids(self.spec, self.num_envs, task_ids, init_state_ids)
        self._was_reset = False  # a failure below leaves the batch unusable until a reset
        for i in range(self.num_envs):
            self._start_episode(i, int(tasks[i]), int(inits[i]))
        self._steps[:] = 0
        self._done[:] = False
        self._success[:] = False
        self._descriptions = [str(self._tasks[t].language) for t in tasks]
        self._was_reset = True
        return self._obs()

    def step(self, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` ``(N, 7)`` (clipped to ``[-1, 1]``) to the envs not done."""
        if not self._was_reset:
            raise RuntimeError("libero: call reset() before step()")
        actions = np.clip(check_actions(self.spec, self.num_envs, actions), -1.0, 1.0)
        reward = np.zeros(self.num_envs, np.float32)
        for i in np.flatnonzero(~self._done):
            env = self._envs[i]
            raw_obs, _, _, _ = env.step(actions[i].tolist())
            self._steps[i] += 1
            self._success[i] = bool(env.check_success())
            self._done[i] = self._success[i] or self._steps[i] >= self.spec.max_steps
            reward[i] = float(self._success[i])
            self._store(i, raw_obs)
        return StepResult(self._obs(), reward, self._done.copy(), self._success.copy())

    def render(self) -> np.ndarray:
        """Return ``(N, render_size, render_size, 3)`` uint8 agentview frames, rotated."""
        size = self.config.render_size
        if not size:
            raise RuntimeError("libero: render() needs render_size > 0")
        if not self._was_reset:
            raise RuntimeError("libero: call reset() before render()")
        if self._image is not None and size == self.config.image_size:
            return self._image.copy()  # the observed frame is the requested one
        frames = [
            env.sim.render(camera_name=CAMERAS["agentview"], width=size, height=size)
            for env in self._envs
        ]
        return np.stack([flip_image(frame) for frame in frames])

    def close(self) -> None:
        for i, env in enumerate(self._envs):
            if env is not None:
                self._envs[i] = None
                self._task[i] = -1
                env.close()
        self._was_reset = False

    # --- internals ---------------------------------------------------------------------------

    def _start_episode(self, i: int, task: int, init: int) -> None:
        """Put env ``i`` into ``task`` at init state ``init`` and let the scene settle."""
        if self._envs[i] is None or self._task[i] != task:
            if self._envs[i] is not None:
                self._envs[i].close()
                self._envs[i], self._task[i] = None, -1
            self._envs[i] = self._make_env(task)
            self._task[i] = task
        env = self._envs[i]
        env.seed(self.config.seed)
        env.reset()  # rebuilds the sim and its render context
        if not self.config.reflections:
            _disable_reflections(env)
        raw_obs = env.set_init_state(self._init_states[task][init])
        for _ in range(self.config.settle_steps):
            raw_obs, _, _, _ = env.step(list(NOOP_ACTION))
        self._store(i, raw_obs)

    def _make_env(self, task: int) -> Any:
        """Build the ``OffScreenRenderEnv`` of ``task`` (3-7 s; creates a GL context)."""
        info = self._tasks[task]
        bddl = os.path.join(
            self._api.get_libero_path("bddl_files"), info.problem_folder, info.bddl_file
        )
        cameras = [CAMERAS[name] for name in self.config.cameras]
        return self._api.OffScreenRenderEnv(
            bddl_file_name=bddl,
            camera_names=cameras or [CAMERAS["agentview"]],
            camera_heights=self.config.image_size,
            camera_widths=self.config.image_size,
            use_camera_obs=bool(cameras),
            # robosuite refuses steps past its horizon: leave room for settle + episode.
            horizon=self.config.settle_steps + self.spec.max_steps,
        )

    def _store(self, i: int, raw_obs: Mapping[str, np.ndarray]) -> None:
        """Convert env ``i``'s raw observation into its rows of the batch arrays."""
        self._state[i] = proprio_from_obs(raw_obs)
        if self._image is not None:
            self._image[i] = flip_image(raw_obs[CAMERAS["agentview"] + "_image"])
        if self._wrist is not None:
            self._wrist[i] = flip_image(raw_obs[CAMERAS["wrist"] + "_image"])

    def _obs(self) -> LiberoObs:
        return LiberoObs(
            image=None if self._image is None else self._image.copy(),
            state=self._state.copy(),
            wrist_image=None if self._wrist is None else self._wrist.copy(),
        )


def _disable_reflections(env: Any) -> None:
    """Clear the reflection flag of the env's offscreen render context (after each reset)."""
    context = env.sim._render_context_offscreen  # robosuite's MjSim keeps it here
    if context is not None:
        context.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0


def build_libero(options: Mapping[str, Any] | None, num_envs: int) -> LiberoVectorEnv:
    """Registered builder of the ``libero`` simulator (options: the fields of LiberoConfig).

    Raises:
        ImportError: LIBERO is not installed (naming the install command).
    """
    return LiberoVectorEnv(config_from_options(LiberoConfig, options, "libero"), num_envs)


SIMULATORS.register("libero", build_libero)
