"""Simulator throughput: LIBERO env steps/s, our simulator processes vs LIBERO's SubprocVectorEnv.

Measured: LIBERO env steps per second (``simulators x timed steps / seconds spent in step()``)
for 1, 2 and 4 simulators, one env per process, with rendering on (agentview + wrist camera,
128 px, the observations our default LIBERO setup returns) and off (no camera observations on
either side), for

- **ours**: ``SIMULATORS.get("libero")(options, num_envs=n, processes=n)``, i.e.
  :class:`simulators.workers.ProcessVectorEnv` over the ``libero`` simulator;
- **the reference**: the vector env that ships with LIBERO, ``SubprocVectorEnv`` of
  ``OffScreenRenderEnv`` factories (``libero.libero.envs``), driven as LIBERO's own evaluation
  drives it: ``seed``, ``reset``, ``set_init_state(init_states[indices])``, settle steps, then
  ``step(actions)`` with an ``(n, 7)`` array.

How: the same task (``libero_spatial`` task 0), init state ``i`` for env ``i``, seed, the same
10 no-op settle steps, the same seeded random actions (uniform in [-0.5, 0.5]) and the same
number of steps on both sides; episodes are long enough that none ends inside a run. Both
sides render with MuJoCo reflections, as LIBERO's evaluation does (our option
``reflections=True``); extra rows show ours with reflections off (our default setting,
different pixels) and our in-process env (``processes=0``). Both sides render both cameras;
our processes hand back the agentview image and the state (what the rollout reads), the
reference pickles its whole observation dict, wrist image included. Creation (starting the
processes, building the envs, the first reset to the init state) is timed apart and excluded
from steps/s; the first steps are a warm-up and not timed. Ours and the reference run one
after the other, never at the same time, and every env is closed before the next one starts.

Checks, so the numbers can be trusted: no env of ours finished early (a finished env would
skip its steps); ours and the reference give the same proprio state (8 floats per env) after
every step, so both simulated the same episodes step for step; with rendering on the last
agentview images are identical (ours rotated by 180 degrees, as our simulator returns them)
and not a flat colour.

Targets (issue 5): ours >= the reference for every configuration; ours from 1 to 2 simulators
with rendering off >= 1.8x (on 2 cores).

Run (estimated 5-6 minutes on 2 idle cores, most of it building envs; peak about 10 GB of
memory with 4 simulators)::

    .venv/bin/python scripts/bench/simulator_speed.py       # writes docs/benchmarks/simulators.*
    .venv/bin/python scripts/bench/simulator_speed.py --quick --out /tmp/bench_simulators
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; before mujoco is imported

import common  # noqa: E402  (sibling module: this folder is sys.path[0])

import simulators  # noqa: E402, F401  (registers "libero")
from embodied_rl.registry import SIMULATORS  # noqa: E402
from simulators.libero.suites import NOOP_ACTION, flip_image, proprio_from_obs  # noqa: E402

NAME = "simulators"  # the results keep their name: docs/benchmarks/simulators.{json,png}
SUITE, TASK, SEED = "libero_spatial", 0, 0
IMAGE_SIZE = 128
SETTLE_STEPS = 10  # no-op steps after setting the init state (part of the reset, untimed)
WARMUP_STEPS = 2  # untimed first steps (lazy allocations in MuJoCo and the renderer)
ACTION_SCALE = 0.5  # small random motions: no task succeeds, no episode ends early
SCALING_TARGET = 1.8  # ours, rendering off, 1 -> 2 simulators


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: simulator counts and timed steps per env."""

    sims: tuple[int, ...]
    steps_render_on: int
    steps_render_off: int
    reflections_off_sims: tuple[int, ...]  # extra rows: ours with reflections off
    in_process_renders: tuple[bool, ...]  # extra rows: ours in-process, 1 env

    def steps(self, render: bool) -> int:
        return self.steps_render_on if render else self.steps_render_off


FULL = Plan((1, 2, 4), 30, 300, (1, 2, 4), (False, True))
QUICK = Plan((1, 2), 8, 50, (1,), (False,))


@dataclass
class Measurement:
    """One configuration of one system.

    Attributes:
        states: ``(T, N, 8)`` proprio after every step (warm-up included), ``T`` = warm-up +
            timed steps.
        image: ``(N, H, W, 3)`` last agentview image as our simulator returns it (rotated),
            ``None`` with rendering off.
    """

    system: str
    render: bool
    sims: int
    timed_steps: int  # per env
    create_s: float
    step_s: float
    states: np.ndarray
    image: np.ndarray | None

    @property
    def env_steps(self) -> int:
        return self.sims * self.timed_steps

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.step_s


def make_actions(num_envs: int, steps: int) -> np.ndarray:
    """Seeded random actions ``(WARMUP_STEPS + steps, N, 7)`` float64, the same for both."""
    rng = np.random.default_rng(SEED)
    return rng.uniform(-ACTION_SCALE, ACTION_SCALE, (WARMUP_STEPS + steps, num_envs, 7))


def init_ids(num_envs: int) -> np.ndarray:
    """Init state ``i`` for env ``i``."""
    return np.arange(num_envs)


def timed_steps(step: Callable[[np.ndarray], Any], actions: np.ndarray) -> tuple[list, float]:
    """Apply every action batch; return the results and the seconds of the timed ones."""
    results = [step(action) for action in actions[:WARMUP_STEPS]]
    started = time.perf_counter()
    results += [step(action) for action in actions[WARMUP_STEPS:]]
    return results, time.perf_counter() - started


# --- ours ------------------------------------------------------------------------------------


def our_options(render: bool, reflections: bool, max_steps: int) -> dict[str, Any]:
    return {
        "suite": SUITE,
        "image_size": IMAGE_SIZE,
        "cameras": ["agentview", "wrist"] if render else [],
        "reflections": reflections,
        "max_steps": max_steps,
        "settle_steps": SETTLE_STEPS,
        "seed": SEED,
        "render_size": IMAGE_SIZE if render else 0,
    }


def run_ours(
    render: bool, actions: np.ndarray, processes: int, reflections: bool = True
) -> Measurement:
    """Time our vector env (``processes`` simulator processes, 0 = in this process)."""
    num_envs = actions.shape[1]
    options = our_options(render, reflections, max_steps=len(actions) + 1)
    started = time.perf_counter()
    env = SIMULATORS.get("libero")(options, num_envs, processes=processes)
    try:
        env.reset([TASK] * num_envs, init_ids(num_envs))
        create_s = time.perf_counter() - started
        results, step_s = timed_steps(env.step, actions)
    finally:
        env.close()
    if any(result.done.any() for result in results):
        raise RuntimeError("ours: an episode ended inside the run, so some steps were skipped")
    last = results[-1].obs
    return Measurement(
        system="ours",
        render=render,
        sims=num_envs,
        timed_steps=len(actions) - WARMUP_STEPS,
        create_s=create_s,
        step_s=step_s,
        states=np.stack([result.obs.state for result in results]),
        image=None if last.image is None else last.image.copy(),
    )


# --- reference -------------------------------------------------------------------------------


def reference_env_args(render: bool) -> tuple[dict[str, Any], np.ndarray]:
    """``OffScreenRenderEnv`` arguments of the task and its official init states."""
    from libero.libero import benchmark, get_libero_path

    suite = benchmark.get_benchmark_dict()[SUITE]()
    task = suite.get_task(TASK)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    env_args = {
        "bddl_file_name": bddl,
        "camera_heights": IMAGE_SIZE,
        "camera_widths": IMAGE_SIZE,
        "use_camera_obs": render,  # cameras: the default agentview + robot0_eye_in_hand
    }
    return env_args, np.asarray(suite.get_task_init_states(TASK))


def run_reference(render: bool, actions: np.ndarray) -> Measurement:
    """Time LIBERO's ``SubprocVectorEnv`` the way LIBERO's evaluation drives it."""
    from libero.libero.envs import OffScreenRenderEnv, SubprocVectorEnv

    num_envs = actions.shape[1]
    env_args, init_states = reference_env_args(render)
    started = time.perf_counter()
    env = SubprocVectorEnv([lambda: OffScreenRenderEnv(**env_args) for _ in range(num_envs)])
    try:
        # Seeded before the reset (LIBERO's eval seeds after its first reset): the seed sets
        # the scene layout, so both sides then simulate the very same episodes.
        env.seed([SEED] * num_envs)
        env.reset()
        env.set_init_state(init_states[init_ids(num_envs)])
        for _ in range(SETTLE_STEPS):
            env.step(np.tile(NOOP_ACTION, (num_envs, 1)))
        create_s = time.perf_counter() - started
        results, step_s = timed_steps(env.step, actions)
    finally:
        env.close()
    raw_obs = [result[0] for result in results]  # (N,) object arrays of observation dicts
    image = None
    if render:
        image = np.stack([flip_image(obs["agentview_image"]) for obs in raw_obs[-1]])
    return Measurement(
        system="reference",
        render=render,
        sims=num_envs,
        timed_steps=len(actions) - WARMUP_STEPS,
        create_s=create_s,
        step_s=step_s,
        states=np.stack([[proprio_from_obs(obs) for obs in batch] for batch in raw_obs]),
        image=image,
    )


# --- checks, rows, plot ----------------------------------------------------------------------


def check_same_episodes(ours: Measurement, ref: Measurement, compare_images: bool) -> dict:
    """Both sides simulated the same steps of the same episodes; raise if not."""
    where = f"render={'on' if ours.render else 'off'}, {ours.sims} simulators"
    if ours.states.shape != ref.states.shape or ours.env_steps != ref.env_steps:
        raise RuntimeError(
            f"{where}: step counts differ: {ours.states.shape} vs {ref.states.shape}"
        )
    state_diff = float(np.abs(ours.states - ref.states).max())
    if state_diff > 1e-5:
        raise RuntimeError(
            f"{where}: ours and the reference diverged (max |state diff| {state_diff})"
        )
    check = {"env_steps": ours.env_steps, "max_state_diff": state_diff}
    if ours.render:
        for m in (ours, ref):
            if m.image is None or int(m.image.max()) == int(m.image.min()):
                raise RuntimeError(f"{where}: {m.system} returned no or a flat image")
        if compare_images:
            equal = bool(np.array_equal(ours.image, ref.image))
            if not equal:
                raise RuntimeError(f"{where}: the last agentview images differ")
            check["images_equal"] = equal
    return check


def comparison_rows(ours: dict, refs: dict) -> list[dict[str, Any]]:
    """One table row per (render, simulators) with ratios, scaling and targets."""
    rows = []
    for (render, sims), mine in ours.items():
        ref = refs[(render, sims)]
        mine_1, ref_1 = ours[(render, 1)], refs[(render, 1)]
        scaling = mine.steps_per_s / mine_1.steps_per_s
        target, met = "ours >= ref", mine.steps_per_s >= ref.steps_per_s
        if not render and sims == 2:
            target += f"; ours 1->2 >= {SCALING_TARGET}x"
            met = met and scaling >= SCALING_TARGET
        rows.append(
            {
                "render": "on" if render else "off",
                "simulators": sims,
                "ours steps/s": mine.steps_per_s,
                "reference steps/s": ref.steps_per_s,
                "ours/reference": mine.steps_per_s / ref.steps_per_s,
                "ours scaling vs 1": scaling,
                "reference scaling vs 1": ref.steps_per_s / ref_1.steps_per_s,
                "ours creation s": mine.create_s,
                "reference creation s": ref.create_s,
                "env steps": mine.env_steps,
                "target": target,
                "met": "yes" if met else "NO",
            }
        )
    return rows


def extra_row(variant: str, mine: Measurement, ref: Measurement) -> dict[str, Any]:
    return {
        "variant": variant,
        "render": "on" if mine.render else "off",
        "simulators": mine.sims,
        "steps/s": mine.steps_per_s,
        "reference steps/s": ref.steps_per_s,
        "vs reference": mine.steps_per_s / ref.steps_per_s,
        "creation s": mine.create_s,
    }


def plot(rows: Sequence[dict], extras: Sequence[dict], out_dir: Path | None) -> None:
    """Steps/s vs simulators, one panel per rendering setting, both systems and extras."""
    fig, axes = common.new_figure(ncols=2)
    for ax, render in zip(axes, ("off", "on")):
        mine = [r for r in rows if r["render"] == render]
        sims = [r["simulators"] for r in mine]
        ax.plot(sims, [r["ours steps/s"] for r in mine], "o-", label="ours (processes)")
        ax.plot(
            sims, [r["reference steps/s"] for r in mine], "s--", label="LIBERO SubprocVectorEnv"
        )
        for variant, style in (("reflections off", "^:"), ("in-process", "x")):
            points = [e for e in extras if e["render"] == render and variant in e["variant"]]
            if points:
                xs = [e["simulators"] for e in points]
                ax.plot(xs, [e["steps/s"] for e in points], style, label=points[0]["variant"])
        camera = "agentview + wrist 128 px" if render == "on" else "no cameras"
        ax.set_title(f"rendering {render} ({camera})")
        ax.set_xlabel("simulators (one env per process)")
        ax.set_ylabel("env steps / s (all envs)")
        ax.set_xticks(sims)
        top = max([r["ours steps/s"] for r in mine] + [r["reference steps/s"] for r in mine])
        top = max([top] + [e["steps/s"] for e in extras if e["render"] == render])
        ax.set_ylim(0, 1.15 * top)  # room above the highest point for the legend
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    common.save_figure(fig, NAME, out_dir)


# --- driver ----------------------------------------------------------------------------------


def measure_pair(render: bool, sims: int, plan: Plan) -> tuple[Measurement, Measurement, dict]:
    """Ours, then the reference (never both at once), on the same actions; checked."""
    actions = make_actions(sims, plan.steps(render))
    mine = run_ours(render, actions, processes=sims)
    gc.collect()
    ref = run_reference(render, actions)
    gc.collect()
    check = check_same_episodes(mine, ref, compare_images=True)
    print(
        f"render {'on ' if render else 'off'} sims {sims}: ours {mine.steps_per_s:.1f}, "
        f"reference {ref.steps_per_s:.1f} env steps/s; creation {mine.create_s:.1f} s, "
        f"{ref.create_s:.1f} s (states match over {check['env_steps']} env steps)",
        flush=True,
    )
    return mine, ref, check


def measure_extras(plan: Plan, refs: dict) -> list[dict[str, Any]]:
    """Ours with reflections off (processes), then ours in-process (last: it makes a GL
    context in this process, and the reference forks from it)."""
    extras = []
    for sims in plan.reflections_off_sims:
        actions = make_actions(sims, plan.steps(True))
        mine = run_ours(True, actions, processes=sims, reflections=False)
        check_same_episodes(mine, refs[(True, sims)], compare_images=False)
        extras.append(extra_row("ours, reflections off (our default)", mine, refs[(True, sims)]))
        print(
            f"extra, reflections off, sims {sims}: {mine.steps_per_s:.1f} env steps/s", flush=True
        )
        gc.collect()
    for render in plan.in_process_renders:
        mine = run_ours(render, make_actions(1, plan.steps(render)), processes=0)
        check_same_episodes(mine, refs[(render, 1)], compare_images=True)
        extras.append(extra_row("ours, in-process (processes=0)", mine, refs[(render, 1)]))
        print(f"extra, in-process, render {render}: {mine.steps_per_s:.1f} env steps/s", flush=True)
        gc.collect()
    return extras


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 simulators, few steps")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    ours, refs, checks = {}, {}, []
    for render in (False, True):
        for sims in plan.sims:
            mine, ref, check = measure_pair(render, sims, plan)
            ours[(render, sims)], refs[(render, sims)] = mine, ref
            checks.append({"render": render, "simulators": sims, **check})
    extras = measure_extras(plan, refs)
    rows = comparison_rows(ours, refs)
    print()
    table = common.print_table(rows)
    print()
    extras_table = common.print_table(extras)
    settings = {
        "suite": SUITE,
        "task": TASK,
        "seed": SEED,
        "image_size": IMAGE_SIZE,
        "cameras_render_on": ["agentview", "wrist (robot0_eye_in_hand)"],
        "reflections": "on for both sides (LIBERO's default); off only in the extra rows",
        "settle_steps": SETTLE_STEPS,
        "warmup_steps": WARMUP_STEPS,
        "timed_steps_per_env": {
            "render_on": plan.steps_render_on,
            "render_off": plan.steps_render_off,
        },
        "action": f"uniform(-{ACTION_SCALE}, {ACTION_SCALE}), seed {SEED}",
        "quick": args.quick,
        "wall_s": time.perf_counter() - started,
    }
    payload = {
        "settings": settings,
        "rows": rows,
        "extras": extras,
        "checks": checks,
        "table": table,
        "extras_table": extras_table,
    }
    common.write_results(NAME, payload, args.out)
    plot(rows, extras, args.out)


if __name__ == "__main__":
    main()
