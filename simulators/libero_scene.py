"""One built LIBERO env: exact cheap resets, and the state robosuite observes in each step.

A :class:`LiberoScene` wraps LIBERO's ``ControlEnv`` (robosuite underneath) built without a
GL context of its own and without camera observations: frames are drawn on demand by the
task's shared :class:`~simulators.libero_render.TaskRenderer`.

Resets. robosuite's hard reset (LIBERO's default) rebuilds the MuJoCo model from XML, its
render context and the robot models: 2-3 s on 2 CPU cores. The soft reset here takes about
6 ms (plus the init state and the settle steps both kinds of reset run) and leaves the env
bit for bit where a hard reset leaves it (tested: every ``mjData`` and ``mjModel`` array,
the pixels and the following steps), also after other episodes ran in it. It runs
robosuite's own reset without the rebuild (``hard_reset=False``: ``mj_resetData``, new
controllers and robot buffers, objects placed again, observables reset) and then restores
what that leaves different from a hard reset, all recorded once per task right after a real
hard reset (:class:`ResetSnapshot`):

- the Panda gripper's ``current_action``: its model integrates the open/close command over
  steps and a hard reset builds a new gripper model, so a soft reset kept the previous
  episode's grip command (a closed gripper pulled the fingers and, through contacts, the
  arm: the ~1 cm drift a first soft-reset attempt showed after one episode);
- the model fields that object placement and visualisation write (fixture poses
  ``body_pos``/``body_quat``, colours ``site_rgba``/``geom_rgba``): the init state sets
  joint positions only, fixtures are placed in the model;
- NumPy's global RNG state (LIBERO's ``seed`` reseeds it; a hard reset leaves it at a
  state the soft reset's placement draws would not).

``mjData`` fields outside the init state (``qacc_warmstart``, ``act``, ``ctrl``, ``mocap_*``,
applied forces, ``time``) are reset by ``mj_resetData`` exactly as in a newly made
``mjData``.

Observations. robosuite samples observations inside a step, after the 24th of its 25
physics substeps (its observables' sampling clock), and renders camera observations there.
A scene captures the simulation at that moment instead (an identity "corrupter" on the
``robot0_eef_pos`` observable: robosuite calls it exactly when it samples; copying the
``mjData`` takes about 0.03 ms) so that an image drawn later, only when one is needed, shows
what robosuite's camera observation would have shown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Headless rendering by default; must be set before mujoco is imported (a caller's choice,
# e.g. MUJOCO_GL=osmesa, wins).
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402

from simulators.libero_render import TaskRenderer  # noqa: E402
from simulators.libero_suites import NOOP_ACTION, LiberoApi  # noqa: E402

# The observable whose sampling moment is the observation's (all robosuite observables of
# LIBERO share the control-frequency clock; this one feeds the proprio).
OBSERVED_SENSOR = "robot0_eef_pos"
# Model fields robosuite/LIBERO write after building a model: object placement
# (bddl_base_domain._reset_internal), visualisation toggles (robosuite visualize,
# LIBERO set_visualization).
RESET_MODEL_FIELDS = ("body_pos", "body_quat", "site_rgba", "geom_rgba")


@dataclass(frozen=True)
class ResetSnapshot:
    """What a soft reset restores, recorded right after a hard reset of the task's env.

    Attributes:
        model_fields: copies of the :data:`RESET_MODEL_FIELDS` arrays of the model.
        rng_state: ``np.random.get_state()`` (LIBERO draws placements from NumPy's global RNG).
    """

    model_fields: Mapping[str, np.ndarray]
    rng_state: tuple

    @classmethod
    def record(cls, model: mujoco.MjModel) -> ResetSnapshot:
        fields = {name: getattr(model, name).copy() for name in RESET_MODEL_FIELDS}
        return cls(model_fields=fields, rng_state=np.random.get_state())


class LiberoScene:
    """A built LIBERO env of one task.

    Building takes 1-3 s and about 0.3 GB of RAM (robosuite writes the scene XML, MuJoCo
    compiles it and decodes its textures). The first scene of a task in a process is given
    no snapshot: it does one hard reset more and records one (:attr:`snapshot`) for the
    others.

    Args:
        api: the LIBERO entry points.
        bddl_file: the task's BDDL file.
        horizon: robosuite's episode limit (env steps, settle steps included).
        seed: ``env.seed`` before every reset (the scene layout).
        snapshot: the task's snapshot from another scene, ``None`` to record one.
    """

    def __init__(
        self,
        api: LiberoApi,
        bddl_file: str,
        horizon: int,
        seed: int,
        snapshot: ResetSnapshot | None,
    ) -> None:
        self._wrapper = api.ControlEnv(
            bddl_file_name=bddl_file,
            has_offscreen_renderer=False,  # frames come from the task's shared renderer
            use_camera_obs=False,
            horizon=horizon,
        )
        self._env = self._wrapper.env  # the robosuite env
        self._seed = seed
        self._observed: mujoco.MjData | None = None
        self._observed_site_rgba: np.ndarray | None = None
        self._env.modify_observable(OBSERVED_SENSOR, "corrupter", self._capture)
        if snapshot is None:
            self._hard_reset()
            snapshot = ResetSnapshot.record(self.model)
        self.snapshot = snapshot
        self._env.hard_reset = False  # the wrapper's reset() is robosuite's soft reset now

    @classmethod
    def build(cls, api: LiberoApi, task: Any, horizon: int, seed: int, snapshot=None):
        """Build the scene of a LIBERO task (``suite.get_task(i)``)."""
        folder = api.get_libero_path("bddl_files")
        bddl = os.path.join(folder, task.problem_folder, task.bddl_file)
        return cls(api, bddl, horizon, seed, snapshot)

    @property
    def env(self) -> Any:
        """The robosuite env (LIBERO's problem class): object states, joint setters."""
        return self._env

    @property
    def model(self) -> mujoco.MjModel:
        """The current MuJoCo model (a hard reset replaces it)."""
        return self._env.sim.model._model

    @property
    def data(self) -> mujoco.MjData:
        """The current MuJoCo data."""
        return self._env.sim.data._data

    def reset(self, init_state: np.ndarray, settle_steps: int, hard: bool = False) -> dict:
        """Start an episode at ``init_state`` (the flattened MuJoCo state of LIBERO's files).

        Args:
            init_state: ``(1 + nq + nv,)`` time, joint positions and velocities.
            settle_steps: no-op steps after setting it (gripper open).
            hard: rebuild the model (robosuite's hard reset) instead of the soft reset.

        Returns:
            robosuite's raw observation dict after the last of them.
        """
        if hard:
            self._hard_reset()
        else:
            self._soft_reset()
        raw_obs = self._wrapper.set_init_state(init_state)
        for _ in range(settle_steps):
            raw_obs = self.step(NOOP_ACTION)
        return raw_obs

    def step(self, action: Sequence[float]) -> dict:
        """One env step (25 physics substeps); robosuite's raw observation dict."""
        raw_obs, _, _, _ = self._wrapper.step(list(action))
        return raw_obs

    def success(self) -> bool:
        """Whether the task's goal holds now (LIBERO's ``check_success``)."""
        return bool(self._wrapper.check_success())

    def draw_observed(self, renderer: TaskRenderer, camera: str, size: int) -> np.ndarray:
        """The camera image of the last observation, as robosuite would have rendered it.

        Returns:
            ``(size, size, 3)`` uint8, bottom row first.
        """
        model = self.model
        current = model.site_rgba.copy()
        # A step's end (LIBERO's set_visualization) may toggle site colours after the
        # observation was sampled: draw the colours of the sampling moment.
        model.site_rgba[:] = self._observed_site_rgba
        try:
            return renderer.render(model, self._observed, camera, size)
        finally:
            model.site_rgba[:] = current

    def draw_current(self, renderer: TaskRenderer, camera: str, size: int) -> np.ndarray:
        """The camera image of the state now (the end of the last step)."""
        return renderer.render(self.model, self.data, camera, size)

    def close(self) -> None:
        """Free the MuJoCo model and data."""
        self._wrapper.close()
        self._observed = None

    # --- internals ---------------------------------------------------------------------------

    def _capture(self, value: Any) -> Any:
        """robosuite's corrupter hook: called when it samples; keep a copy of the state."""
        model = self.model
        if self._observed is None or self._observed.qpos.shape != (model.nq,):
            self._observed = mujoco.MjData(model)
        mujoco.mj_copyData(self._observed, model, self.data)
        self._observed_site_rgba = model.site_rgba.copy()
        return value

    def _hard_reset(self) -> None:
        self._env.hard_reset = True
        try:
            self._wrapper.seed(self._seed)
            self._wrapper.reset()  # retries until the objects could be placed
        finally:
            self._env.hard_reset = False

    def _soft_reset(self) -> None:
        self._wrapper.seed(self._seed)
        self._wrapper.reset()
        model = self.model
        for name, value in self.snapshot.model_fields.items():
            getattr(model, name)[:] = value
        np.random.set_state(self.snapshot.rng_state)
        for robot in self._env.robots:
            grippers = (
                robot.gripper.values() if isinstance(robot.gripper, dict) else [robot.gripper]
            )
            for gripper in grippers:  # a new gripper model starts with a zero command
                gripper.current_action = np.zeros(gripper.dof)
