"""What an evaluation's videos cost: env steps/s of the evaluation with and without them.

Measured: wall seconds of the evaluation DAG's nodes, run in this process on one worker's
vector env as ``configs/eval_dag/env.yaml`` runs them (``rollout.env`` with
``keep_actions``, then ``rollout.videos``), on the same episodes, in one run, for

- **no videos**: ``eval.max_videos=0`` (the rollout alone; nothing replayed);
- **videos of k**: the chosen ``k`` episodes replayed one env step at a time, a frame of
  ``eval.video_size`` (256 px) drawn after every env step, written as MP4 with the
  instruction, step counter and outcome (``k`` = the config's ``eval.max_videos``);
- **videos of all**: every evaluated episode gets a video (the most a video can cost);
- **videos of k, generic replay** (LIBERO only): the same replays through
  ``VectorEnv.step_filmed``'s generic loop (``step`` then ``render``, one env step at a time),
  which also draws the policy's observation at every env step: how the replays ran before
  LIBERO's own ``step_filmed`` (one drawing per video frame);
- **before** (the reference: how evaluation videos were made until now): the rollout keeps
  the policy's frames (``keep_frames``: one per policy step, at the policy's image size) and
  the same ``k`` episodes are written from them (upscaled to about 256 px).

Columns: ``env steps`` evaluated (exact: the episodes' lengths, from the all-videos row's
frames), ``frames`` written, seconds in the rollout and in the videos, ``env steps/s`` of
the whole evaluation, and its slowdown against no videos.

Two setups: LIBERO as ``srpo_libero`` evaluates on CPUs (libero_spatial, agentview 64 px,
48 env steps, chunks of 8, 2 envs), with the fast MLP policy so that the simulator's share
shows; and the reach task as ``srpo_reach`` evaluates (40 held-out episodes of up to 50
steps, 16 envs, state-only policy, 32 px frames before). The policies are untrained and
greedy, so the episodes are the same in every row. Scenes are built by an untimed warm-up
rollout of the same episodes.

Run (about 3 minutes on 2 idle cores; LIBERO needs ``bash scripts/install.sh``)::

    .venv/bin/python scripts/bench/eval_videos.py          # writes docs/benchmarks/eval_videos.*
    .venv/bin/python scripts/bench/eval_videos.py --quick --out /tmp/bench_eval_videos
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; before mujoco is imported

import common  # noqa: E402  (sibling module: this folder is sys.path[0])
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

import embodied_rl.nodes  # noqa: E402, F401
import policies  # noqa: E402, F401
import rollout  # noqa: E402, F401
import simulators  # noqa: E402, F401
from embodied_rl import keys as K  # noqa: E402
from embodied_rl.data.batch import make_batch  # noqa: E402
from embodied_rl.eval_episodes import local_episodes, select_videos  # noqa: E402
from embodied_rl.registry import NODE_TYPES, POLICIES  # noqa: E402
from embodied_rl.runtime.context import MetricSink, NodeContext  # noqa: E402
from embodied_rl.video import read_video, write_video  # noqa: E402
from simulators.base import VectorEnv  # noqa: E402

NAME = "eval_videos"
VIDEO_SIZE = 256


@dataclass(frozen=True)
class Setup:
    """One simulator's evaluation: env, policy, episodes and how many get a video."""

    name: str
    simulator: str
    options: dict[str, Any]
    num_envs: int
    policy: dict[str, Any]
    pairs: tuple[tuple[int, int], ...]  # (task, init state) evaluated
    max_videos: int


LIBERO = Setup(
    "libero",
    "libero",
    {
        "suite": "libero_spatial",
        "image_size": 64,
        "cameras": ["agentview"],
        "render_size": 64,
        "max_steps": 48,
    },
    2,
    {"state_dim": 8, "action_dim": 7, "image_size": 64, "chunk": 8, "hidden": [256, 256]},
    ((0, 4), (1, 4), (0, 9), (1, 9)),  # env i keeps task i: no scene rebuilt between waves
    2,
)
REACH = Setup(
    "reach",
    "reach",
    {"image_size": 0, "render_size": 32, "success_radius": 0.05},
    16,
    {"state_dim": 8, "action_dim": 2, "hidden": [64, 64]},
    tuple((task, init) for task in range(4) for init in range(4, 50, 5)),
    4,
)


def _context(node: str, options: dict, shared: dict, run_dir: Path) -> NodeContext:
    node_type = NODE_TYPES.get(node)
    ctx = NodeContext.single_process(
        node,
        node_type.build_config(options),
        cfg=OmegaConf.create({"seed": 0}),
        metrics=MetricSink(),
        seed_fn=lambda _: 0,
        shared=shared,
        run_dir=run_dir,
    )
    if node_type.setup is not None:
        node_type.setup(ctx)
    return ctx


class Evaluation:
    """The evaluation DAG's nodes of one setup on one shared env (as a worker holds them)."""

    def __init__(self, setup: Setup, run_dir: Path) -> None:
        self.setup, self.run_dir, self.shared = setup, run_dir, {}
        self.env_options = {
            "simulator": setup.simulator,
            "simulator_options": setup.options,
            "num_envs": setup.num_envs,
        }
        policy = POLICIES.get("mlp")(setup.policy, torch.device("cpu"))
        self.rollouts = {}
        for keep_frames in (False, True):  # now (keep_actions) and before (keep_frames)
            options = {**self.env_options, "group_size": 1, "do_sample": False}
            options.update(keep_frames=keep_frames, keep_actions=not keep_frames)
            self.rollouts[keep_frames] = _context("rollout.env", options, self.shared, run_dir)
            self.rollouts[keep_frames].models = {"actor": policy}
        self.rows = make_batch(
            {
                K.TASK_ID: torch.tensor([t for t, _ in setup.pairs]),
                K.INIT_STATE_ID: torch.tensor([i for _, i in setup.pairs]),
                K.SAMPLE_ID: torch.arange(len(setup.pairs)),
            }
        )

    def rollout(self, keep_frames: bool) -> tuple[Any, float]:
        started = time.perf_counter()
        out = NODE_TYPES.get("rollout.env").fn(self.rollouts[keep_frames], self.rows.clone())
        return out, time.perf_counter() - started

    @property
    def env(self) -> VectorEnv:
        return self.rollouts[False].state["vector_env"]

    def videos(
        self, batch: Any, max_videos: int, folder: str, generic: bool = False
    ) -> tuple[float, int]:
        """``rollout.videos`` on ``batch``: (seconds, frames written); ``generic``: through
        ``VectorEnv.step_filmed``'s loop instead of the simulator's own."""
        run_dir = self.run_dir / folder
        options = {**self.env_options, "max_videos": max_videos, "video_size": VIDEO_SIZE}
        ctx = _context("rollout.videos", options, self.shared, run_dir)
        if generic:  # an instance attribute: this env only, removed below
            self.env.step_filmed = types.MethodType(VectorEnv.step_filmed, self.env)
        started = time.perf_counter()
        try:
            out = NODE_TYPES.get("rollout.videos").fn(ctx, batch)
        finally:
            self.env.__dict__.pop("step_filmed", None)
        seconds = time.perf_counter() - started
        assert int(out[K.HAS_VIDEO].sum()) == min(max_videos, len(self.setup.pairs))
        return seconds, _frames(run_dir)

    def videos_before(self, batch: Any, max_videos: int, folder: str) -> tuple[float, int]:
        """The previous way: the chosen episodes' policy frames (one per policy step)."""
        ctx = self.rollouts[True]
        started = time.perf_counter()
        for e in select_videos(local_episodes(ctx, batch), max_videos):
            frames = batch[K.FRAMES][e.index, : int(batch[K.FRAME_COUNT][e.index])]
            path = self.run_dir / folder / e.video_name
            write_video(path, frames, fps=10, caption=e.instruction, outcome=e.outcome.upper())
        return time.perf_counter() - started, _frames(self.run_dir / folder)

    def close(self) -> None:
        for ctx in self.rollouts.values():
            ctx.state["vector_env"].close()


def _frames(folder: Path) -> int:
    return sum(read_video(path).shape[0] for path in folder.rglob("*.mp4"))


def measure(setup: Setup, run_dir: Path) -> list[dict[str, Any]]:
    """The rows of one setup, same episodes (an untimed warm-up builds the scenes)."""
    evaluation = Evaluation(setup, run_dir)
    try:
        evaluation.rollout(keep_frames=False)  # warm-up: scene builds, lazy allocations
        n, k = len(setup.pairs), setup.max_videos
        rows = []
        for label, max_videos in (("no videos", 0), (f"videos of {k}", k), ("videos of all", n)):
            batch, rollout_s = evaluation.rollout(keep_frames=False)
            videos_s, frames = evaluation.videos(batch, max_videos, f"{setup.name}_{max_videos}")
            rows.append(_row(setup, label, max_videos, rollout_s, videos_s, frames))
        if type(evaluation.env).step_filmed is not VectorEnv.step_filmed:
            batch, rollout_s = evaluation.rollout(keep_frames=False)
            folder = f"{setup.name}_{k}_generic"
            videos_s, frames = evaluation.videos(batch, k, folder, generic=True)
            label = f"videos of {k}, generic replay"
            rows.append(_row(setup, label, k, rollout_s, videos_s, frames))
        batch, rollout_s = evaluation.rollout(keep_frames=True)
        videos_s, frames = evaluation.videos_before(batch, k, f"{setup.name}_before")
        rows.append(_row(setup, f"before: policy frames, {k}", k, rollout_s, videos_s, frames))
    finally:
        evaluation.close()
    env_steps = rows[2]["frames"] - n  # every episode's video: its env steps + 1 frames
    for row in rows:
        row["env steps"] = env_steps
        row["env steps/s"] = env_steps / row["total s"]
        row["slowdown"] = row["total s"] / rows[0]["total s"]
    return rows


def _row(setup: Setup, label: str, videos: int, rollout_s: float, videos_s: float, frames: int):
    return {
        "simulator": setup.name,
        "evaluation": label,
        "episodes": len(setup.pairs),
        "videos": min(videos, len(setup.pairs)),
        "frames": frames,
        "rollout s": rollout_s,
        "videos s": videos_s,
        "total s": rollout_s + videos_s,
    }


COLUMNS = [
    "simulator", "evaluation", "episodes", "videos", "env steps", "frames", "rollout s",
    "videos s", "total s", "env steps/s", "slowdown",
]  # fmt: skip


def plot(rows: list[dict[str, Any]], out_dir: Path) -> None:
    fig, axes = common.new_figure(ncols=2, width=5.5)
    for ax, name in zip(axes, ("libero", "reach")):
        mine = [r for r in rows if r["simulator"] == name]
        ax.barh([r["evaluation"] for r in mine], [r["env steps/s"] for r in mine], color="#3a7")
        ax.set_title(f"{name}: evaluation env steps/s", fontsize=10)
        ax.invert_yaxis()
    common.save_figure(fig, NAME, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="reach only (no LIBERO)")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args()
    torch.set_num_threads(1)
    setups = [REACH] if args.quick else [LIBERO, REACH]
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for setup in setups for row in measure(setup, Path(tmp))]
    table = common.print_table(rows, COLUMNS)
    payload = {"video_size": VIDEO_SIZE, "rows": rows, "table": table}
    common.write_results(NAME, payload, args.out)
    if not args.quick:
        plot(rows, args.out)


if __name__ == "__main__":
    main()
