"""``reach``: a fast MuJoCo task for learning tests and the CPU quickstart.

A white fingertip moves in a horizontal plane above a table with ``num_tasks`` coloured
target discs; task ``k`` is "reach the <colour k> target". The fingertip is a point mass on
two slide joints driven by velocity actuators (action ``(2,)`` in ``[-1, 1]`` = commanded
velocity as a fraction of ``max_speed``), so physics stays stable with a large frame skip and
about 20 policy steps cross the table. An episode succeeds (and ends) when the fingertip
centre is within ``success_radius`` of the target centre; it ends unsuccessfully after
``max_steps`` steps.

Init states are fixed seeded fingertip start positions, ``num_init_states`` per task, at
least ``min_start_distance`` from the task's target, so ``(task, init_state)`` is
reproducible in any process. A controller that moves straight to the target
(:func:`expert_actions`) succeeds in every episode; uniform random actions almost never do.

Observations: ``state (8,)`` = fingertip position (2), fingertip velocity (2), target minus
fingertip (2), target position (2), in metres and m/s; with ``image_size > 0`` also a
top-down ``(image_size, image_size, 3)`` uint8 camera image showing every target, so a
vision policy has to read the instruction to know which target to reach. State-only mode
never creates a GL context (the renderer is built on first use, in the process that uses it).

Privileged progress (``privileged_progress``): the share of the start distance to the target
the fingertip has covered, 1 at success.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embodied_rl.checks import check_range
from simulators.base import (
    EnvSpec,
    Obs,
    StepResult,
    VectorEnv,
    check_actions,
    check_active,
    check_env_ids,
    check_reset_ids,
    distance_fraction,
)
from simulators.registry import config_from_options, register_simulator

# Headless rendering by default; must be set before mujoco is imported (a caller's choice,
# e.g. MUJOCO_GL=osmesa, wins).
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.1),
    "blue": (0.1, 0.2, 0.9),
    "yellow": (0.9, 0.85, 0.1),
    "magenta": (0.85, 0.1, 0.85),
    "cyan": (0.1, 0.85, 0.85),
}
ARENA_HALF = 0.2  # m: the fingertip moves in [-0.2, 0.2]^2
TARGET_RING = 0.12  # m: targets sit on a circle of this radius around the table centre
TARGET_RADIUS = 0.03  # m: radius of a drawn target disc
CAMERA_HEIGHT = 0.6  # m above the table
CAMERA_FOVY = 45.0  # degrees; the camera sees [-0.25, 0.25]^2 at table height
STATE_DIM = 8


@dataclass
class ReachConfig:
    """Options of the ``reach`` simulator.

    Attributes:
        num_tasks: number of targets (one task each), at most ``len(COLOURS)``.
        num_init_states: seeded fingertip start positions per task.
        max_steps: episode length limit in policy steps.
        image_size: side of the square camera observation in pixels; 0 = state only.
        render_size: side of the frames ``render()`` returns (videos); 0 = cannot render.
        frame_skip: physics steps (2 ms each) per policy step.
        max_speed: fingertip speed in m/s commanded by an action of magnitude 1.
        success_radius: success when the fingertip is this close to the target (m).
        min_start_distance: init states start at least this far from the target (m).
        reward: ``"sparse"`` (1 on the success step, else 0) or ``"dense"`` (decrease of the
            distance to the target in metres, plus 1 on the success step).
        seed: seed of the init-state table.
        debug_hang_at_step: fault injection for reliability tests: sleep ``debug_hang_s``
            in episode step ``k`` (1-based) of any env; 0 = off.
        debug_raise_at_step: fault injection: raise ``InjectedSimulatorFault`` in episode
            step ``k``; 0 = off.
        debug_hang_s: how long the injected hang lasts.
        debug_fault_once_path: when set, an injected fault fires only if this file does not
            exist yet and creates it (atomically, across processes), so a restarted simulator
            replaying the episode does not fail again. Empty = fire every time.
    """

    num_tasks: int = 4
    num_init_states: int = 50
    max_steps: int = 50
    image_size: int = 0
    render_size: int = 128
    frame_skip: int = 20
    max_speed: float = 0.5
    success_radius: float = 0.025
    min_start_distance: float = 0.12
    reward: str = "sparse"
    seed: int = 0
    debug_hang_at_step: int = 0
    debug_raise_at_step: int = 0
    debug_hang_s: float = 3600.0
    debug_fault_once_path: str = ""

    def __post_init__(self) -> None:
        check_range("reach num_tasks", self.num_tasks, 1, len(COLOURS))
        check_range("reach seed", self.seed, 0)
        for name in ("debug_hang_at_step", "debug_raise_at_step", "debug_hang_s"):
            check_range(f"reach {name}", getattr(self, name), 0, note=" (0: off)")
        for name in ("num_init_states", "max_steps", "frame_skip"):
            check_range(f"reach {name}", getattr(self, name), 1)
        for name in ("image_size", "render_size"):
            check_range(f"reach {name}", getattr(self, name), 0, note=" (0 = off)")
        if self.reward not in ("sparse", "dense"):
            raise ValueError(f"reach reward must be 'sparse' or 'dense', got {self.reward!r}")
        farthest = TARGET_RING + ARENA_HALF * 0.8
        check_range("reach min_start_distance", self.min_start_distance, 0, farthest, low_open=True)
        for name in ("success_radius", "max_speed"):
            check_range(f"reach {name}", getattr(self, name), 0, low_open=True)

    def limits(self) -> dict[str, int]:
        """Tasks and init states per task of this configuration (``Simulator.limits``)."""
        return {
            "num_tasks": self.num_tasks,
            "num_init_states": self.num_init_states,
            "state_dim": STATE_DIM,
        }


class InjectedSimulatorFault(RuntimeError):
    """Raised by the ``debug_raise_at_step`` fault-injection option."""


def target_positions(num_tasks: int) -> np.ndarray:
    """Return the ``(num_tasks, 2)`` target centres, evenly spaced on a ring."""
    angles = np.pi / 4 + 2 * np.pi * np.arange(num_tasks) / num_tasks
    return TARGET_RING * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def init_positions(config: ReachConfig) -> np.ndarray:
    """Return the ``(num_tasks, num_init_states, 2)`` fingertip start positions.

    Each ``(task, init_state)`` draws from its own generator seeded with
    ``(seed, task, init_state)``, so a start does not depend on how many others exist.
    """
    targets = target_positions(config.num_tasks)
    limit = ARENA_HALF * 0.9  # keep starts off the joint limits
    starts = np.empty((config.num_tasks, config.num_init_states, 2))
    for task in range(config.num_tasks):
        for init in range(config.num_init_states):
            rng = np.random.default_rng([config.seed, task, init])
            while True:  # rejection sampling; the config check keeps acceptance likely
                start = rng.uniform(-limit, limit, size=2)
                if np.linalg.norm(start - targets[task]) >= config.min_start_distance:
                    break
            starts[task, init] = start
    return starts


def build_mjcf(config: ReachConfig) -> str:
    """Return the MJCF model of the table, targets, fingertip and camera."""
    targets = target_positions(config.num_tasks)
    names = list(COLOURS)[: config.num_tasks]
    discs = "\n".join(
        f'    <geom name="target_{name}" type="cylinder" size="{TARGET_RADIUS} 0.001" '
        f'pos="{x:.6f} {y:.6f} 0.001" rgba="{r} {g} {b} 1" contype="0" conaffinity="0"/>'
        for name, (x, y), (r, g, b) in zip(names, targets, (COLOURS[n] for n in names))
    )
    offscreen = max(config.image_size, config.render_size, 1)
    return f"""
<mujoco model="reach">
  <option timestep="0.002" integrator="implicitfast"/>
  <visual>
    <global offwidth="{offscreen}" offheight="{offscreen}"/>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient="0.4 0.4 0.4" diffuse="0.5 0.5 0.5" specular="0 0 0"/>
  </visual>
  <worldbody>
    <geom name="table" type="plane" size="0.3 0.3 0.01" rgba="0.45 0.45 0.45 1"
          contype="0" conaffinity="0"/>
    <camera name="top" pos="0 0 {CAMERA_HEIGHT}" xyaxes="1 0 0 0 1 0" fovy="{CAMERA_FOVY}"/>
{discs}
    <body name="finger" pos="0 0 0.02">
      <joint name="x" type="slide" axis="1 0 0" limited="true"
             range="{-ARENA_HALF} {ARENA_HALF}"/>
      <joint name="y" type="slide" axis="0 1 0" limited="true"
             range="{-ARENA_HALF} {ARENA_HALF}"/>
      <geom name="finger" type="sphere" size="0.02" mass="0.05" rgba="1 1 1 1"
            contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <velocity name="vx" joint="x" kv="2" ctrlrange="-{config.max_speed} {config.max_speed}"/>
    <velocity name="vy" joint="y" kv="2" ctrlrange="-{config.max_speed} {config.max_speed}"/>
  </actuator>
</mujoco>
"""


def expert_actions(state: np.ndarray, gain: float = 20.0) -> np.ndarray:
    """Scripted controller: head straight for the target, slowing down when close.

    Args:
        state: ``(N, 8)`` reach state observations.
        gain: action per metre of remaining distance (saturates at 1 = ``max_speed``).

    Returns:
        ``(N, 2)`` float32 actions in ``[-1, 1]``.
    """
    return np.clip(gain * state[:, 4:6], -1.0, 1.0).astype(np.float32)


class ReachVectorEnv(VectorEnv):
    """``num_envs`` reach environments sharing one compiled model (one ``MjData`` each).

    Args:
        config: the task options.
        num_envs: ``N``.
    """

    def __init__(self, config: ReachConfig, num_envs: int) -> None:
        check_range("reach num_envs", num_envs, 1)
        self.config = config
        self.num_envs = num_envs
        size, render = config.image_size, config.render_size
        self.spec = EnvSpec(
            image_shape=(size, size, 3) if size else None,
            state_dim=STATE_DIM,
            action_dim=2,
            action_low=-1.0,
            action_high=1.0,
            max_steps=config.max_steps,
            num_tasks=config.num_tasks,
            num_init_states=config.num_init_states,
            render_shape=(render, render, 3) if render else None,
        )
        self.model = mujoco.MjModel.from_xml_string(build_mjcf(config))
        self._data = [mujoco.MjData(self.model) for _ in range(num_envs)]
        self._targets = target_positions(config.num_tasks)
        self._starts = init_positions(config)
        self._colours = list(COLOURS)[: config.num_tasks]
        self._renderers: dict[int, mujoco.Renderer] = {}  # size -> renderer, built lazily
        self._task = np.full(num_envs, -1, np.int64)  # -1: never reset, or left out
        self._was_reset = False
        self._steps = np.zeros(num_envs, np.int64)
        self._done = np.zeros(num_envs, bool)
        self._success = np.zeros(num_envs, bool)
        self._start_distance = np.zeros(num_envs)  # fingertip-target distance at the reset (m)
        self._image = np.zeros((num_envs, size, size, 3), np.uint8) if size else None
        self._descriptions: list[str] = []

    @property
    def task_descriptions(self) -> list[str]:
        return list(self._descriptions)

    def reset(
        self,
        task_ids: Sequence[int],
        init_state_ids: Sequence[int],
        active: Sequence[bool] | None = None,
    ) -> Obs:
        tasks, inits = check_reset_ids(self.spec, self.num_envs, task_ids, init_state_ids)
        on = check_active(self.num_envs, active)
        for i in np.flatnonzero(on):
            data = self._data[i]
            # mj_resetData also clears the solver warm start, which keeps a re-run of the
            # same (task, init_state, actions) bit-identical.
            mujoco.mj_resetData(self.model, data)
            data.qpos[:] = self._starts[tasks[i], inits[i]]
            mujoco.mj_forward(self.model, data)
        self._task[:] = np.where(on, tasks, -1)  # -1: left out, zero observation rows
        self._start_distance[:] = [self._distance(i) if o else 0.0 for i, o in enumerate(on)]
        self._steps[:] = 0
        self._done[:] = ~on
        self._success[:] = False
        self._descriptions = [
            f"reach the {self._colours[t]} target" if o else "" for t, o in zip(tasks, on)
        ]
        if self._image is not None:
            self._image[~on] = 0
            for i in np.flatnonzero(on):
                self._image[i] = self._render_one(i, self.config.image_size)
        self._was_reset = True
        return self._obs()

    def step(self, actions: np.ndarray) -> StepResult:
        if not self._was_reset:
            raise RuntimeError("reach: call reset() before step()")
        actions = np.clip(check_actions(self.spec, self.num_envs, actions), -1.0, 1.0)
        reward = np.zeros(self.num_envs, np.float32)
        for i in np.flatnonzero(~self._done):
            data = self._data[i]
            self._steps[i] += 1
            self._inject_faults(int(self._steps[i]))
            before = self._distance(i)
            data.ctrl[:] = self.config.max_speed * actions[i]
            mujoco.mj_step(self.model, data, nstep=self.config.frame_skip)
            after = self._distance(i)
            self._success[i] = after < self.config.success_radius
            self._done[i] = self._success[i] or self._steps[i] >= self.config.max_steps
            if self.config.reward == "dense":
                reward[i] = before - after
            reward[i] += float(self._success[i])
            if self._image is not None:
                self._image[i] = self._render_one(i, self.config.image_size)
        return StepResult(self._obs(), reward, self._done.copy(), self._success.copy())

    def render(self, size: int | None = None, envs: Sequence[int] | None = None) -> np.ndarray:
        """Return ``(N, S, S, 3)`` uint8 top-down frames, ``S`` = ``size`` or ``render_size``
        (``N`` = ``len(envs)`` when given)."""
        if size is None:
            size = self.config.render_size
            if not size:
                raise RuntimeError("reach: render() needs render_size > 0 (or a size)")
        check_range("reach render size", size, 1)
        ids = check_env_ids(self.num_envs, envs, self._task < 0 if self._was_reset else None)
        frames = [self._render_one(i, int(size)) for i in ids]
        return np.stack(frames) if frames else np.zeros((0, size, size, 3), np.uint8)

    def privileged_progress(self) -> np.ndarray:
        """``(N,)`` float32: the share of the start distance to the target covered,
        ``clip(1 - distance / start distance, 0, 1)``; 1.0 at success, 0 for envs left out.

        Without success the fingertip is at least ``success_radius`` away, so the value stays
        below 1. A done env is not stepped: its value stays the one of its final step.
        """
        if not self._was_reset:
            raise RuntimeError("reach: call reset() before privileged_progress()")
        progress = np.zeros(self.num_envs, np.float32)
        for i in np.flatnonzero(self._task >= 0):
            covered = distance_fraction(self._distance(i), self._start_distance[i])
            progress[i] = 1.0 if self._success[i] else covered
        return progress

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()

    def _distance(self, i: int) -> float:
        return float(np.linalg.norm(self._targets[self._task[i]] - self._data[i].qpos))

    def _obs(self) -> Obs:
        """Build the observation of every env from its current ``MjData``."""
        state = np.zeros((self.num_envs, STATE_DIM), np.float32)
        for i in np.flatnonzero(self._task >= 0):  # the others were left out of the reset
            data, target = self._data[i], self._targets[self._task[i]]
            state[i, 0:2] = data.qpos
            state[i, 2:4] = data.qvel
            state[i, 4:6] = target - data.qpos
            state[i, 6:8] = target
        image = None if self._image is None else self._image.copy()
        return Obs(image=image, state=state)

    def _render_one(self, i: int, size: int) -> np.ndarray:
        renderer = self._renderers.get(size)
        if renderer is None:  # first frame of this size: the GL context is made here
            renderer = _make_renderer(self.model, size)
            self._renderers[size] = renderer
        renderer.update_scene(self._data[i], camera="top")
        return renderer.render()

    def _inject_faults(self, step: int) -> None:
        """Fault-injection hooks (see ``ReachConfig``); no-ops unless configured."""
        config = self.config
        hang = config.debug_hang_at_step == step
        fail = config.debug_raise_at_step == step
        if not (hang or fail) or not _claim_fault(config.debug_fault_once_path):
            return
        if hang:
            time.sleep(config.debug_hang_s)
        if fail:
            raise InjectedSimulatorFault(f"reach: injected fault at episode step {step}")


def _make_renderer(model: mujoco.MjModel, size: int) -> mujoco.Renderer:
    """A ``size x size`` renderer; a larger offscreen buffer than the model's is made for it
    alone (a video size), so the observation renderers keep theirs and their pixels."""
    visual = model.vis.global_
    buffer = (visual.offwidth, visual.offheight)
    visual.offwidth, visual.offheight = max(buffer[0], size), max(buffer[1], size)
    try:
        return mujoco.Renderer(model, height=size, width=size)
    finally:
        visual.offwidth, visual.offheight = buffer


def _claim_fault(once_path: str) -> bool:
    """Return whether an injected fault may fire (always, or once per ``once_path``)."""
    if not once_path:
        return True
    try:  # O_EXCL: exactly one process wins, even when several reach the step together
        os.close(os.open(once_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


@register_simulator("reach", config=ReachConfig)
def build_reach(options: Mapping[str, Any] | None, num_envs: int) -> ReachVectorEnv:
    """Registered builder of the ``reach`` simulator (options: the fields of ReachConfig)."""
    return ReachVectorEnv(config_from_options(ReachConfig, options, "reach"), num_envs)
