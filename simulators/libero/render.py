"""Offscreen rendering of LIBERO scenes: one GL context per task, shared by the envs of it.

robosuite gives every env its own GL context and MuJoCo render context, recreated by every
hard reset (costly in RAM and time with software rendering, mostly the scene's
textures), and draws a frame with whichever GL context was made current
last: with several envs of different tasks in one process, an env was drawn with another
env's meshes and textures. Here the envs of one task share one :class:`TaskRenderer` (they
are built from the same XML, so one upload of its meshes and textures serves all of them),
and the renderer makes its own GL context current before every frame. The envs' own models
carry no texture pixels (:mod:`simulators.libero.scene`): the renderer is made from a full
model of the task's XML and draws any of them, which have the same texture ids. Its context
has no shadow map when no light casts shadows (LIBERO's lights do not): MuJoCo would
allocate one of the model's ``shadowsize`` (4096 x 4096 in LIBERO) and never
draw into it. Renderer sizes before and after both: docs/benchmarks/worker_memory.md.

A frame is drawn as robosuite draws its camera observations: the named fixed camera, the
visual geom group only (robosuite's defaults ``render_visual_mesh=True``,
``render_collision_mesh=False``), MuJoCo's default scene flags and an offscreen buffer of
the model's ``offwidth x offheight``. So for the same model and data the pixels are the
ones robosuite returns (tested against a raw LIBERO env). Reflections can be turned off
(the scene flag ``mjRND_REFLECTION``; robosuite has no option for it): on software
rendering they cost about as much as the rest of a frame.

Geoms whose bounding sphere lies wholly outside the camera's view are left out of a frame
(:func:`outside_view`): MuJoCo sends every geom of the scene to the GL pipeline, and on
software rendering a frame costs about its triangle count (a libero_object scene: 309 k, the
meshes out of the agentview camera's view 31 k, out of the wrist camera's 109 k). A geom
outside the view frustum draws no pixel, so the frame is the same (tested); only without
reflections and shadows, where a geom out of view could still show through a mirror or cast
a shadow into it.

Frames come as MuJoCo gives them: ``(H, W, 3)`` uint8, bottom row first (robosuite's default
``opengl`` image convention); the simulator rotates them for the policy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

# Headless rendering by default; must be set before mujoco is imported (a caller's choice,
# e.g. MUJOCO_GL=osmesa, wins).
os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco  # noqa: E402

MAX_SCENE_GEOMS = 1000  # robosuite's MjvScene size: more geoms would be dropped from a frame
# LIBERO's models keep MuJoCo's default offscreen buffer, 640 x 480: square frames up to 480.
MAX_FRAME_SIZE = 480


class TaskRenderer:
    """A GL context with one task's meshes and textures, drawing any env of that task.

    Args:
        model: a model of the task with its texture pixels (its meshes and textures are
            uploaded; :meth:`~simulators.libero.scene.LiberoScene.textured_model`).
        reflections: draw MuJoCo's reflective materials.

    Raises:
        RuntimeError: no GL context could be created (``MUJOCO_GL``: ``egl`` or ``osmesa``).
    """

    def __init__(self, model: mujoco.MjModel, reflections: bool) -> None:
        # robosuite's GL context class for MUJOCO_GL (egl, osmesa or glfw): the same EGL
        # configuration and device choice as robosuite's own rendering.
        from robosuite.utils.binding_utils import GLContext

        self._gl = GLContext(max_width=640, max_height=480, device_id=-1)
        shadow_size = model.vis.quality.shadowsize
        if not model.light_castshadow.any():  # (LIBERO's lights) a shadow map is never drawn
            model.vis.quality.shadowsize = 0  # 4096 x 4096 in LIBERO, never drawn into
        try:
            with self._current():
                self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
                mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        finally:
            model.vis.quality.shadowsize = shadow_size
        self._scene = mujoco.MjvScene(model, maxgeom=MAX_SCENE_GEOMS)
        self._scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = int(reflections)
        # Culling is exact only where nothing out of view can change a pixel (see the module).
        self.culls = not reflections and not model.light_castshadow.any()
        self._option = mujoco.MjvOption()
        self._option.geomgroup[0] = 0  # collision meshes off
        self._option.geomgroup[1] = 1  # visual meshes on
        self._option.geomgroup[HIDDEN_GROUP] = 0  # out of view (outside_view)
        self._perturb = mujoco.MjvPerturb()
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED

    def render(
        self, model: mujoco.MjModel, data: mujoco.MjData, camera: str, size: int
    ) -> np.ndarray:
        """Draw ``data`` of an env of this renderer's task from the fixed camera ``camera``.

        Args:
            model: that env's model (the same XML as the renderer's).
            data: the state to draw; only its positions (``xpos``, ``geom_xpos``, ...) are
                read, as computed by the last ``mj_forward``/``mj_step``.
            camera: camera name in the model, e.g. ``agentview``.
            size: side of the square frame in pixels, at most the offscreen buffer's.

        Returns:
            ``(size, size, 3)`` uint8, bottom row first.
        """
        if size > min(self._context.offWidth, self._context.offHeight):
            raise ValueError(
                f"libero frames can be at most {self._context.offWidth} x "
                f"{self._context.offHeight} pixels (the model's offscreen buffer), got {size}"
            )
        camera_id = model.camera(camera).id
        self._camera.fixedcamid = camera_id
        hidden = outside_view(model, data, camera_id) if self.culls else _NONE
        with self._current(), _hidden_geoms(model, hidden):  # several renderers: draw with ours
            mujoco.mjv_updateScene(
                model,
                data,
                self._option,
                self._perturb,
                self._camera,
                mujoco.mjtCatBit.mjCAT_ALL,
                self._scene,
            )
            viewport = mujoco.MjrRect(0, 0, size, size)
            mujoco.mjr_render(viewport, self._scene, self._context)
            frame = np.empty((size, size, 3), np.uint8)
            mujoco.mjr_readPixels(frame, None, viewport, self._context)
        return frame

    @contextmanager
    def _current(self) -> Iterator[None]:
        """Make our GL context current for the block, then release it from this thread.

        An EGL context is current in at most one thread, and making it current in another
        fails (``EGL_BAD_ACCESS``): a DAG worker steps its envs in one thread and is asked to
        close them from another (Ray runs actor calls in a thread pool), so the context is
        never left bound to a thread.
        """
        self._gl.make_current()
        try:
            yield
        finally:
            _release_egl_context(self._gl)

    def close(self) -> None:
        """Free the MuJoCo render context and the GL context; idempotent.

        MuJoCo frees a render context's GL objects (textures, buffers: numbered per GL
        context) in whichever GL context is current, so ours is made current first: freeing
        it under another context would delete that context's objects of the same numbers.
        (robosuite frees its contexts without doing so.)
        """
        context: Any = getattr(self, "_context", None)
        if context is not None:
            with self._current():
                context.free()
            self._context = None
            self._gl.free()

    def __del__(self) -> None:
        # At interpreter exit robosuite's atexit hook may have terminated the EGL display
        # already, and the process is about to free every GL object anyway.
        if not sys.is_finalizing():
            self.close()  # not left to MjrContext's destructor: see close()


def outside_view(model: mujoco.MjModel, data: mujoco.MjData, camera_id: int) -> np.ndarray:
    """The visual geoms a square frame of fixed camera ``camera_id`` cannot show.

    A geom is outside when its bounding sphere (``geom_rbound`` around ``geom_xpos``, as the
    last ``mj_forward``/``mj_step`` placed it) lies wholly behind the camera or beyond one of
    the four side planes of the view frustum (vertical field of view ``cam_fovy``, the same
    horizontally in a square frame). Planes (radius 0: infinite) are never outside.

    Returns:
        ``(K,)`` int geom ids, in the visual group (1) only.
    """
    candidates = np.flatnonzero((model.geom_group == 1) & (model.geom_rbound > 0))
    rotation = data.cam_xmat[camera_id].reshape(3, 3)  # columns: the camera's axes
    # Camera coordinates: x right, y up, the camera looks along -z.
    local = (data.geom_xpos[candidates] - data.cam_xpos[camera_id]) @ rotation
    radius = model.geom_rbound[candidates]
    half = np.deg2rad(model.cam_fovy[camera_id]) / 2.0
    # Signed distance to a side plane through the camera, outward normal (cos h, 0, sin h)
    # for the right one (x), likewise for the other three.
    side = np.abs(local[:, :2]) * np.cos(half) + local[:, 2:3] * np.sin(half)
    outside = (local[:, 2] > radius) | (side > radius[:, None]).any(axis=1)
    return candidates[outside]


_NONE = np.zeros(0, np.int64)
HIDDEN_GROUP = 5  # a geom group MjvOption leaves off (our option shows groups 1 and 2)


@contextmanager
def _hidden_geoms(model: mujoco.MjModel, geoms: np.ndarray) -> Iterator[None]:
    """Move ``geoms`` to a group the renderer does not draw, inside; their groups after.

    The group is read by ``mjv_updateScene`` only: physics never sees it.
    """
    if geoms.size == 0:
        yield
        return
    groups = model.geom_group[geoms].copy()
    model.geom_group[geoms] = HIDDEN_GROUP
    try:
        yield
    finally:
        model.geom_group[geoms] = groups


def _release_egl_context(gl: Any) -> None:
    """Unbind the current EGL context from this thread (other GL back-ends need nothing)."""
    if type(gl).__name__ != "EGLGLContext":
        return
    from robosuite.renderers.context import egl_context

    egl = egl_context.EGL
    egl.eglMakeCurrent(
        egl_context.EGL_DISPLAY, egl.EGL_NO_SURFACE, egl.EGL_NO_SURFACE, egl.EGL_NO_CONTEXT
    )
