"""What a LIBERO env chunk costs, with and without the three exact shortcuts, side by side.

Comparisons in one process, alternating the sides so that a noisy machine affects them alike:

- **physics**: an env chunk (8 env steps of seeded random actions; no frame: the frames are
  timed apart, and on software rendering their noise would swamp the physics) of 4 envs of
  one task stepped three ways: robosuite's own ``env.step`` loop;
  :func:`simulators.libero.scene.step_with_split_substeps` with robosuite's Python on every
  substep (MuJoCo's pipeline once per physics substep instead of three times); and the same
  with the non-policy substeps' control and observable timers computed without robosuite's
  per-call Python (:mod:`simulators.libero.lean_substeps`; our scenes' step). Two rows:
  split against robosuite, lean against split. Checked: all three end every repeat in the
  same proprio states.
- **frames**: one frame of each camera drawn with and without leaving out the geoms outside
  the camera's view (:func:`simulators.libero.render.outside_view`). Checked: the same pixels.
- **anti-aliasing** (not a shortcut we take): the agentview frame with LIBERO's 4x
  multisampling against a GL context without it, and how many pixels differ.

Run (about 4 minutes on 2 idle cores)::

    .venv/bin/python scripts/bench/libero_step_parts.py            # docs/benchmarks/libero_step_parts.json
    .venv/bin/python scripts/bench/libero_step_parts.py --suites libero_goal --out /tmp/parts
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import common
import numpy as np

NAME = "libero_step_parts"
CAMERAS = ("agentview", "robot0_eye_in_hand")
CHUNK = 8
ENVS = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", nargs="+", default=["libero_object", "libero_goal"])
    parser.add_argument("--chunks", type=int, default=10, help="env chunks per repeat")
    parser.add_argument("--repeats", type=int, default=2, help="per side, alternating")
    parser.add_argument("--frames", type=int, default=8, help="per camera and side")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks")
    return parser.parse_args(argv)


def robosuite_step(scene, action) -> dict:
    """robosuite's own step loop (LIBERO's ``ControlEnv.step``), for the reference side."""
    return scene.env.step(list(action))[0]


def split_step(scene, action) -> dict:
    """Split substeps with robosuite's Python on every substep (the lean side's reference)."""
    from simulators.libero.scene import step_with_split_substeps

    return step_with_split_substeps(scene.env, list(action), lean=False)


def time_chunks(env, chunks: int) -> tuple[float, np.ndarray]:
    """Seconds per env chunk over ``chunks`` chunks from the init states, and the final states."""
    env.reset([0] * ENVS, list(range(ENVS)))
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for c in range(chunks):
        actions = rng.uniform(-0.5, 0.5, size=(ENVS, CHUNK, 7)).astype(np.float32)
        actions[..., 6] = 1.0 if c >= chunks // 2 else -1.0  # open, then close the gripper
        result = env.step_chunk(actions)
    return (time.perf_counter() - start) / (chunks * ENVS), result.obs.state.copy()


def physics_rows(suite: str, args: argparse.Namespace) -> list[dict]:
    """Env chunks stepped three ways, alternating: robosuite's loop, split substeps, and split
    substeps with the lean non-policy substeps (our scenes' step)."""
    from embodied_rl.registry import SIMULATORS
    from simulators.libero import scene as scene_module

    options = {"suite": suite, "image_size": 64, "max_steps": 400, "cameras": []}
    env = SIMULATORS.get("libero")(options, ENVS)
    our_step = scene_module.LiberoScene.step
    steps = {"robosuite": robosuite_step, "split": split_step, "lean": our_step}
    seconds = {side: [] for side in steps}
    states = {}
    try:
        for _ in range(args.repeats):
            for side, step in steps.items():
                scene_module.LiberoScene.step = step
                spent, states[side] = time_chunks(env, args.chunks)
                seconds[side].append(spent)
    finally:
        scene_module.LiberoScene.step = our_step
        env.close()
    for side in ("split", "lean"):
        if not np.array_equal(states["robosuite"], states[side]):
            raise AssertionError(f"{suite}: the {side} step reached other states than robosuite's")
    ms = {side: 1000 * min(spent) for side, spent in seconds.items()}
    part = f"env chunk ({CHUNK} steps, no frame)"
    return [
        _row(
            suite,
            part,
            ("robosuite step loop", ms["robosuite"]),
            ("split substeps", ms["split"]),
            "same states",
        ),
        _row(
            suite,
            part,
            ("split substeps", ms["split"]),
            ("split + lean non-policy substeps", ms["lean"]),
            "same states",
        ),
    ]


def _row(suite: str, part: str, reference: tuple, ours: tuple, check: str) -> dict:
    """A table row: ``reference`` and ``ours`` are ``(what, ms)``."""
    return {
        "suite": suite,
        "part": part,
        "reference": reference[0],
        "reference ms": reference[1],
        "ours": ours[0],
        "ours ms": ours[1],
        "ours/reference": ours[1] / reference[1],
        "check": check,
    }


def time_frames(draws: dict, frames: int) -> tuple[dict, dict]:
    """Each side's ``draw()`` ``frames`` times after a warm-up, the sides alternating.

    Returns:
        milliseconds per frame by side, and each side's last frame.
    """
    seconds = dict.fromkeys(draws, 0.0)
    last = {}
    for repeat in range(frames + 1):  # the first of each side is a warm-up
        for side, draw in draws.items():
            start = time.perf_counter()
            last[side] = draw()
            if repeat:
                seconds[side] += time.perf_counter() - start
    return {side: 1000 * spent / frames for side, spent in seconds.items()}, last


def frame_rows(suite: str, args: argparse.Namespace) -> list[dict]:
    """Each camera's frame with and without the geoms out of view (the same pixels), and the
    agentview with and without LIBERO's multisampling (:func:`antialias_row`)."""
    from embodied_rl.registry import SIMULATORS
    from simulators.libero.render import outside_view

    env = SIMULATORS.get("libero")({"suite": suite, "image_size": 64, "max_steps": 400}, 1)
    rows = []
    try:
        env.reset([0], [0])
        scene, renderer = env.scene(0), env._assets[0].renderer
        model, data = scene.model, scene.data
        for camera in CAMERAS:

            def draw(culls: bool, camera: str = camera):
                renderer.culls = culls
                return renderer.render(model, data, camera, 64)

            ms, frames = time_frames(
                {"culled": lambda: draw(True), "whole": lambda: draw(False)}, args.frames
            )
            renderer.culls = True
            if not np.array_equal(frames["culled"], frames["whole"]):
                raise AssertionError(f"{suite} {camera}: culled pixels differ")
            left_out = len(outside_view(model, data, model.camera(camera).id))
            rows.append(
                _row(
                    suite,
                    f"{camera} frame, 64 px",
                    ("every geom", ms["whole"]),
                    (f"{left_out} geoms out of view left out", ms["culled"]),
                    "same pixels",
                )
            )
        rows.append(antialias_row(suite, scene, renderer, args.frames))
    finally:
        env.close()
    return rows


def antialias_row(suite: str, scene, renderer, frames: int) -> dict:
    """The agentview frame with LIBERO's 4x multisampling (``renderer``, the env's) against a
    GL context without it: what anti-aliasing costs on this machine's renderer. Not an exact
    shortcut (edge pixels differ; counted): a measurement for a speed-versus-fidelity choice
    no config makes today."""
    from simulators.libero.render import TaskRenderer

    plain_model = scene.textured_model()
    samples = plain_model.vis.quality.offsamples
    plain_model.vis.quality.offsamples = 0  # read when the GL context is made
    plain = TaskRenderer(plain_model, reflections=False)
    try:
        draws = {
            side: lambda drawer=drawer: drawer.render(scene.model, scene.data, "agentview", 64)
            for side, drawer in {"msaa": renderer, "plain": plain}.items()
        }
        ms, last = time_frames(draws, frames)
    finally:
        plain.close()
    differ = np.any(last["msaa"] != last["plain"], axis=-1)
    return _row(
        suite,
        "agentview frame, 64 px",
        (f"{samples}x multisampling (LIBERO's)", ms["msaa"]),
        ("no multisampling (not exact)", ms["plain"]),
        f"{int(differ.sum())} of {differ.size} pixels differ",
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for suite in args.suites:
        rows.extend(physics_rows(suite, args))
        rows.extend(frame_rows(suite, args))
    common.print_table(rows)
    payload = {
        "command": " ".join(
            [".venv/bin/python", "scripts/bench/libero_step_parts.py", *sys.argv[1:]]
        ),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "rows": rows,
    }
    common.write_results(NAME, payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
