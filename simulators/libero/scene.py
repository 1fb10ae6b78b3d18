"""One built LIBERO env: exact cheap resets, and the state robosuite observes in each step.

A :class:`LiberoScene` wraps LIBERO's ``ControlEnv`` (robosuite underneath) built without a
GL context of its own and without camera observations: frames are drawn on demand by the
task's shared :class:`~simulators.libero.render.TaskRenderer`.

Resets. robosuite's hard reset (LIBERO's default) rebuilds the MuJoCo model from XML, its
render context and the robot models: seconds. The soft reset here takes milliseconds (plus
the init state and the settle steps both kinds of reset run) and leaves the env
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

Memory. A scene's MuJoCo model carries no texture pixels: its ``<texture>`` elements are
compiled as 1x1 flat textures of the same names and types (:func:`without_texture_pixels`;
textures of one image file are merged first, :func:`with_shared_textures`), so every model
array but the textures is the full model's and the physics is unchanged. Textures only
matter to drawing, and frames are drawn by the task's shared renderer, whose GL context is
made once from the full model with the same merged texture list
(:meth:`LiberoScene.textured_model`): the pixels are robosuite's (tested against a raw LIBERO
env). The model is a fraction of the full one's size (the decoded PNG textures are most of
it) and compiles several times faster (docs/benchmarks/worker_memory.md); without
this every built scene held its own copy of the task's textures.

Observations. robosuite samples observations inside a step, after the 24th of its 25
physics substeps (its observables' sampling clock), and renders camera observations there.
A scene captures the simulation at that moment instead (an identity "corrupter" on the
``robot0_eef_pos`` observable: robosuite calls it exactly when it samples; copying the
``mjData`` is cheap) so that an image drawn later, only when one is needed, shows
what robosuite's camera observation would have shown.
"""

from __future__ import annotations

import os
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

# Headless rendering by default; must be set before mujoco is imported (a caller's choice,
# e.g. MUJOCO_GL=osmesa, wins).
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402

from simulators.libero.lean_substeps import ArmSubsteps, ObservableClock  # noqa: E402
from simulators.libero.render import TaskRenderer  # noqa: E402
from simulators.libero.suites import NOOP_ACTION, LiberoApi  # noqa: E402

# The observable whose sampling moment is the observation's (all robosuite observables of
# LIBERO share the control-frequency clock; this one feeds the proprio).
OBSERVED_SENSOR = "robot0_eef_pos"
# Model fields robosuite/LIBERO write after building a model: object placement
# (bddl_base_domain._reset_internal), visualisation toggles (robosuite visualize,
# LIBERO set_visualization).
RESET_MODEL_FIELDS = ("body_pos", "body_quat", "site_rgba", "geom_rgba")

# What a texture-light model keeps of each <texture>: materials refer to textures by name,
# and the type (2d, cube, skybox) is part of what the compiled texture is.
KEPT_TEXTURE_ATTRIBUTES = ("name", "type")

# Set in a thread while it builds or hard-resets a scene (see _compiling_texture_light).
_COMPILING = threading.local()


def without_texture_pixels(xml: str) -> str:
    """``xml`` with its textures merged as :func:`with_shared_textures` merges them, then
    every ``<texture>`` made a 1x1 flat texture of the same name and type.

    Its compiled model has the same textures (count, order, names, types) and materials as
    the model of ``with_shared_textures(xml)``, and every other array equal to those of the
    model of ``xml``: only the texture pixels (``tex_data``, most of a LIBERO model's memory)
    and the texture list differ. Physics never reads them.
    """
    root = ET.fromstring(with_shared_textures(xml))
    for texture in root.iter("texture"):
        kept = {k: v for k, v in texture.attrib.items() if k in KEPT_TEXTURE_ATTRIBUTES}
        texture.attrib.clear()
        texture.attrib.update(kept, builtin="flat", width="1", height="1", rgb1="0 0 0")
    return ET.tostring(root, encoding="unicode")


def with_shared_textures(xml: str) -> str:
    """``xml`` with the textures that load the same image files (every attribute but the
    name equal) merged into the first of them, and the materials pointing at that one.

    LIBERO gives each object instance a texture of its own: the two black bowls of every
    libero_spatial task are two copies of one large PNG, each again in a GL context (RGBA
    and mipmaps; sizes: docs/benchmarks/worker_memory.md). Merged, the pixels are
    the same (tested). A drawn geom takes its texture
    id from the model it is drawn from, so the scene models merge alike
    (:func:`without_texture_pixels`): all of a task's models share one texture list.
    """
    root = ET.fromstring(xml)
    first: dict[tuple[tuple[str, str], ...], str] = {}
    merged: dict[str, str] = {}  # texture name -> the name of the texture it is merged into
    for asset in root.iter("asset"):
        for texture in asset.findall("texture"):
            name = texture.get("name")
            if name is None or not any(key.startswith("file") for key in texture.attrib):
                continue  # only files: builtin textures may be drawn at random
            image = tuple(sorted((k, v) for k, v in texture.attrib.items() if k != "name"))
            if image in first:
                merged[name] = first[image]
                asset.remove(texture)
            else:
                first[image] = name
    for element in root.iter():  # materials (also in defaults) and their layers
        if element.get("texture") in merged:
            element.set("texture", merged[element.get("texture")])
    return ET.tostring(root, encoding="unicode")


@contextmanager
def _compiling_texture_light() -> Iterator[None]:
    """robosuite envs compile their models without texture pixels in this thread, inside."""
    _install_compile_hook()
    outer = getattr(_COMPILING, "texture_light", False)
    _COMPILING.texture_light = True
    try:
        yield
    finally:
        _COMPILING.texture_light = outer


def _install_compile_hook() -> None:
    """Let robosuite compile through a subclass of its ``MjSim`` (once per process).

    robosuite compiles in ``MujocoEnv._initialize_sim`` (at construction and at every hard
    reset) with ``robosuite.environments.base.MjSim.from_xml_string``. Its own XML hook
    (``set_xml_processor``) can only be set after construction has compiled the full model
    once, which costs the time and the memory this avoids. The subclass compiles exactly as
    robosuite's class does except in a thread inside :func:`_compiling_texture_light`, so
    other robosuite envs of the process (a raw LIBERO env in a test) are untouched.
    """
    from robosuite.environments import base

    if getattr(base.MjSim, "compiles_texture_light", False):
        return

    class SceneMjSim(base.MjSim):
        compiles_texture_light = True

        @classmethod
        def from_xml_string(cls, xml: str) -> Any:
            if getattr(_COMPILING, "texture_light", False):
                xml = without_texture_pixels(xml)
            return super().from_xml_string(xml)

    base.MjSim = SceneMjSim


def step_with_split_substeps(env: Any, action: Sequence[float], lean: bool = True) -> dict:
    """robosuite's ``MujocoEnv.step`` of ``env`` with each physics substep computed once.

    robosuite runs a substep as ``sim.forward(); env._pre_action(); sim.step()``, and the arm
    controller's update (robosuite's, and LIBERO's compatibility version of it) begins with
    another ``sim.forward()``: every substep runs MuJoCo's whole pipeline three times (two
    ``mj_forward`` and the one inside ``mj_step``) where the controller needs only the position
    and velocity stages once. Here a substep is MuJoCo's documented split for controllers
    that read the state: ``mj_step1`` (positions, velocities: the kinematics, Jacobians, mass
    matrix and bias forces the controller reads), the controller (its ``sim.forward()``
    skipped, the stages it needs are fresh), ``mj_step2`` (actuation, acceleration,
    constraints, Euler integration). The first substep of each env step runs a whole
    ``mj_forward`` instead of ``mj_step1``: on a policy step the robot also records its
    force-torque sensors, which belong to the acceleration stage and which robosuite's loop
    reads from its forward with the previous controls. The constraint solver's warm start
    (``qacc_warmstart``) is written by the integration alone, so the extra forwards of
    robosuite's loop never changed the result: every ``mjData`` array and observation is the
    same (tested).

    With ``lean``, the 24 substeps after the policy step compute the arm's control and the
    observables' timers without robosuite's per-call Python where the robot and observables
    are LIBERO's (:mod:`simulators.libero.lean_substeps`; the same numbers, tested).

    Args:
        env: a robosuite env with the Euler integrator (LIBERO's), no viewer.
        action: ``(action_dim,)``.
        lean: use :mod:`~simulators.libero.lean_substeps` where it applies.

    Returns:
        robosuite's observation dict, as ``env.step`` returns it.

    Raises:
        ValueError: the episode had ended (robosuite's error), or another integrator.
    """
    model, data = env.sim.model._model, env.sim.data._data
    if model.opt.integrator != mujoco.mjtIntegrator.mjINT_EULER:
        raise ValueError("split substeps need the Euler integrator (mj_step2 integrates with it)")
    if env.done:
        raise ValueError("executing action in terminated episode")
    env.timestep += 1
    arm, clock = (ArmSubsteps.of(env), ObservableClock.of(env)) if lean else (None, None)
    for substep in range(int(env.control_timestep / env.model_timestep)):
        policy_step = substep == 0
        if policy_step:
            mujoco.mj_forward(model, data)
        else:
            mujoco.mj_step1(model, data)
        if policy_step or arm is None:
            with _forward_skipped(env.sim):
                env._pre_action(action, policy_step)
        else:
            arm.control(action)
        mujoco.mj_step2(model, data)
        if clock is None:
            env._update_observables()
        else:
            clock.advance()
    if clock is not None:
        clock.write_back()
    env.cur_time += env.control_timestep  # once per step, as robosuite does (rounding)
    env._post_action(action)
    return env._get_observations()


@contextmanager
def _forward_skipped(sim: Any) -> Iterator[None]:
    """``sim.forward()`` does nothing inside (the caller has just run the stages it computes)."""
    sim.forward = _no_forward
    try:
        yield
    finally:
        del sim.forward  # the class's method again


def _no_forward() -> None:
    """Stands in for ``MjSim.forward`` while its result is fresh."""


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

    Building costs seconds and RAM (robosuite writes the scene XML, MuJoCo
    compiles it without texture pixels). The first scene of a task in a process is given
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
        with _compiling_texture_light():
            self._wrapper = api.ControlEnv(
                bddl_file_name=bddl_file,
                has_offscreen_renderer=False,  # frames come from the task's shared renderer
                use_camera_obs=False,
                horizon=horizon,
            )
        self._env = self._wrapper.env  # the robosuite env
        self.bddl_file = bddl_file  # the task's goal, for its privileged progress
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
        """The current MuJoCo model (a hard reset replaces it), without texture pixels."""
        return self._env.sim.model._model

    def xml(self) -> str:
        """The scene's MuJoCo XML as robosuite writes it, with its texture files: what a LIBERO
        demo file stores as ``model_file`` (the compiled models of this scene differ from it
        in their textures only: see :func:`without_texture_pixels`)."""
        return self._env.model.get_xml()

    def textured_model(self) -> mujoco.MjModel:
        """A new model of this scene's XML with its texture pixels, each image file once
        (:func:`with_shared_textures`), for a renderer's GL context (costly in time and RAM
        while it lives). MuJoCo keeps the decoded textures in its process-wide asset cache
        (500 MB at most, with the meshes): the next renderer of any task that uses them is
        made faster (docs/benchmarks/code_figures.md)."""
        return mujoco.MjModel.from_xml_string(with_shared_textures(self.xml()))

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
        """One env step (25 physics substeps); robosuite's raw observation dict.

        The same numbers as robosuite's own ``env.step`` (tested bit for bit), faster
        (:func:`step_with_split_substeps`; docs/benchmarks/libero_step_parts.md).
        """
        return step_with_split_substeps(self._env, list(action))

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
            with _compiling_texture_light():
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
