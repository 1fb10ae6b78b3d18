"""LIBERO rollout speed: env steps/s of the ``srpo_libero`` rollout before and after cheap
resets and chunked rendering, side by side in one run.

What is measured: the ``rollout.env`` node of ``configs/srpo_libero.yaml`` as the config runs
it (in-process envs, agentview 64 px, reflections off, the tiny random-init OpenVLA-OFT
preset with chunks of 8 actions, ``torch_threads=1`` like a DAG worker), with a real run's
group size: ``group_size = num_envs = 8`` (one GRPO group of 8 episodes per wave) and
``--env-steps`` env steps per episode (default 160; libero_spatial's limit is 220). Each mode
runs the same ``--calls`` rollout calls (default 2), one (task, init state) pair each, the
tasks changing between calls as they do between training steps (libero_spatial tasks 0, 1,
...; init state 0, 5, ...), the same policy weights and sampling seed. Modes:

- ``before``: the simulator as it was before this change (``simulators/libero.py`` at commit
  :data:`BEFORE_COMMIT`, read from git): one robosuite env with its own GL context per env,
  a hard reset (model and GL context rebuilt) for every episode, an observation rendered
  after every env step (the rollout steps it one action at a time: its class has no
  ``step_chunk`` of its own, so the interface's default loops ``step``);
- ``hard``: today's simulator with ``reset_mode: hard`` and stepped one action at a time
  (a chunk of one per env action), i.e. the old behaviour through today's options;
  GL contexts are shared by task here, so it is faster than ``before``;
- ``after``: today's defaults: exact soft resets, one observation drawn per chunk.

Each mode starts from nothing built (the first call builds every env: as in a run, whose
first steps and every task change build envs) and closes its envs afterwards; modes run one
after the other. Env steps/s = env steps executed / wall seconds of the node's calls (resets
and builds included; ``steps only`` leaves resets and builds out). On a machine shared with
other jobs the wall time of modes run minutes apart drifts with the load, so the CPU seconds
of this process (all its threads: envs, renderer, policy) are reported too, and env steps
per CPU second is the load-robust comparison. Env steps are counted
from the episodes' lengths: ``STEP_MASK`` policy steps x the chunk, which is exact here
because no episode of a random policy succeeds (checked).

Checks: every mode saw the same first observation of every episode (pixels and state; the
resets are exact); the table says whether whole trajectories (states, images, actions) were
identical too (they should be: same policy, seed and observations). Peak RSS is this
process's (all envs live in it).

Run (before and after: about 12 minutes on 2 busy cores; peak about 8 GB)::

    .venv/bin/python scripts/bench/libero_rollout_speed.py
    .venv/bin/python scripts/bench/libero_rollout_speed.py --modes before,hard,after
    .venv/bin/python scripts/bench/libero_rollout_speed.py --policy mlp
    .venv/bin/python scripts/bench/libero_rollout_speed.py --quick --out /tmp/bench_rollout

Writes ``docs/benchmarks/libero_rollout_speed[_mlp].{json,png}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import common
import numpy as np
import torch
from omegaconf import OmegaConf

import embodied_rl.nodes  # noqa: F401
import policies  # noqa: F401
import rollout  # noqa: F401
import simulators  # noqa: F401
from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.registry import NODE_TYPES, POLICIES
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.context import MetricSink, NodeContext
from simulators.base import StepResult
from simulators.libero import LiberoConfig, LiberoVectorEnv

NAME = "libero_rollout_speed"
BEFORE_COMMIT = "25aff29"  # the branch point of the cheap-reset / chunked-rendering change
MODES = ("before", "hard", "after")
MLP_OPTIONS = "{state_dim: 8, image_size: 64, action_dim: 7, head: gaussian, hidden: [64, 64]}"
POLICY_OVERRIDES = {
    "openvla_oft": [],  # the config's tiny preset, chunk 8
    "mlp": [
        "models.actor.policy=mlp",
        "~models.actor.options",
        f"+models.actor.options={MLP_OPTIONS}",
    ],
}


class PerStepLibero(LiberoVectorEnv):
    """Today's LIBERO env stepped one action at a time (observed after every step)."""

    def step_chunk(self, actions: np.ndarray) -> StepResult:
        reward = np.zeros(self.num_envs, np.float32)
        for c in range(np.shape(actions)[1]):
            result = super().step_chunk(np.asarray(actions)[:, c : c + 1])
            reward += result.reward
        result.reward = reward
        return result


def load_before_module() -> types.ModuleType:
    """``simulators/libero.py`` at :data:`BEFORE_COMMIT`, as a module (not registered)."""
    source = subprocess.run(
        ["git", "show", f"{BEFORE_COMMIT}:simulators/libero.py"],
        cwd=common.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    registration = 'SIMULATORS.register("libero", build_libero)'
    # Its helpers moved since: simulators/libero_suites.py is simulators/libero/suites.py.
    suites_import = "from simulators.libero_suites import ("
    if registration not in source or suites_import not in source:
        raise SystemExit(f"unexpected simulators/libero.py at {BEFORE_COMMIT}")
    source = source.replace(suites_import, "from simulators.libero.suites import (")
    # Imported from a file of its own (not the registry's module): the old code must not
    # register a second "libero" simulator.
    path = Path(tempfile.mkdtemp(prefix="libero_before_")) / "libero_before.py"
    path.write_text(source.replace(registration, ""))
    spec = importlib.util.spec_from_file_location("libero_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def build_env(mode: str, options: dict[str, Any], num_envs: int) -> Any:
    """The vector env of one mode (nothing built yet: scenes are built by the first reset)."""
    if mode == "before":
        old = load_before_module()
        return old.LiberoVectorEnv(old.LiberoConfig(**options), num_envs)
    if mode == "hard":
        return PerStepLibero(LiberoConfig(**options, reset_mode="hard"), num_envs)
    return LiberoVectorEnv(LiberoConfig(**options), num_envs)


def run_config(policy: str, env_steps: int, group: int) -> Any:
    cfg = compose(
        "srpo_libero",
        [
            *POLICY_OVERRIDES[policy],
            f"simulator.options.max_steps={env_steps}",
            f"rollout.group_size={group}",
            f"rollout.num_envs={group}",
        ],
    )
    return cfg


def measure(mode: str, cfg: Any, policy: Any, calls: int) -> tuple[dict[str, Any], list]:
    """Run ``calls`` rollout calls with one mode's env; the summary row and the outputs."""
    node = NODE_TYPES.get("rollout.env")
    node_cfg = node.build_config(OmegaConf.to_container(cfg.rollout, resolve=True))
    sink = MetricSink()
    ctx = NodeContext.single_process(
        "rollout", node_cfg, cfg=cfg, metrics=sink, seed_fn=lambda tag: 7, models={"actor": policy}
    )
    env = build_env(mode, dict(node_cfg.simulator_options), node_cfg.num_envs)
    ctx.state["vector_env"] = env
    outputs, phases = [], {"reset": 0.0, "simulate": 0.0, "policy": 0.0, "wall": 0.0, "cpu": 0.0}
    print(f"--- {mode}: {calls} calls of {node_cfg.group_size} episodes", flush=True)
    try:
        with common.PeakRss(interval=0.2) as memory:
            for call in range(calls):
                batch = make_batch(
                    {
                        K.TASK_ID: torch.tensor([call]),
                        K.INIT_STATE_ID: torch.tensor([5 * call]),
                        K.SAMPLE_ID: torch.tensor([call]),
                    }
                )
                started, cpu = time.perf_counter(), time.process_time()
                outputs.append(node.fn(ctx, batch))
                phases["wall"] += time.perf_counter() - started
                phases["cpu"] += time.process_time() - cpu  # all threads of this process
                metrics = sink.pop()
                for phase in ("reset", "simulate", "policy"):
                    phases[phase] += metrics[f"time/rollout/{phase}"][0]
                print(f"    call {call}: {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        env.close()
    return summarize(mode, outputs, phases, memory.peak_mb, chunk_of(cfg)), outputs


def chunk_of(cfg: Any) -> int:
    """Env actions per policy step: OFT's ``chunk`` option; the MLP policy acts one at a time."""
    return int(cfg.models.actor.options.get("chunk", 1))


def summarize(mode: str, outputs: list, phases: dict, peak_mb: float, chunk: int) -> dict:
    """One table row: env steps, seconds per phase, env steps/s."""
    if any(bool(out[K.SUCCESS].any()) for out in outputs):
        raise SystemExit(f"{mode}: an episode succeeded; env steps would not be exact")
    env_steps = sum(int(out[K.STEP_MASK].sum()) for out in outputs) * chunk
    steps_s = phases["simulate"] - phases["reset"]
    return {
        "mode": mode,
        "env_steps": env_steps,
        "wall_s": phases["wall"],
        "reset_s": phases["reset"],  # builds included (env.reset builds scenes)
        "step_s": steps_s,
        "policy_s": phases["policy"],
        "cpu_s": phases["cpu"],
        "env_steps_per_s": env_steps / phases["wall"],
        "steps_only_per_s": env_steps / steps_s,
        "env_steps_per_cpu_s": env_steps / phases["cpu"],
        "peak_rss_gb": peak_mb / 1024,
    }


def compare(outputs: dict[str, list]) -> dict[str, dict[str, Any]]:
    """Per mode, against the first: same first observations (required), same trajectories."""
    modes = list(outputs)
    reference = outputs[modes[0]]
    report = {}
    for mode in modes[1:]:
        first_same, whole_same, state_diff = True, True, 0.0
        for ref, out in zip(reference, outputs[mode]):
            first_same &= torch.equal(ref[K.OBS_IMAGE][:, 0], out[K.OBS_IMAGE][:, 0])
            first_same &= torch.equal(ref[K.OBS_STATE][:, 0], out[K.OBS_STATE][:, 0])
            same_shape = ref[K.OBS_STATE].shape == out[K.OBS_STATE].shape
            if same_shape:
                state_diff = max(
                    state_diff, float((ref[K.OBS_STATE] - out[K.OBS_STATE]).abs().max())
                )
            keys = [K.OBS_IMAGE, K.OBS_STATE, K.STEP_MASK]
            keys += [k for k in (K.ACTION_TOKENS, K.RAW_ACTIONS) if k in ref.keys()]
            whole_same &= same_shape and all(torch.equal(ref[k], out[k]) for k in keys)
        if not first_same:
            raise SystemExit(f"{mode}: first observations differ from {modes[0]}'s")
        report[mode] = {"first_obs_equal": True, "trajectories_equal": bool(whole_same),
                        "max_state_diff": state_diff}  # fmt: skip
    return report


def plot(rows: list[dict[str, Any]], title: str, name: str, out_dir: Path) -> None:
    """Env steps per second (three ways) per mode; where each mode's seconds went."""
    fig, (rates, parts) = common.new_figure(ncols=2, width=5.2, height=3.8)
    x = np.arange(len(rows))
    metrics = [
        ("env_steps_per_s", "per wall second"),
        ("steps_only_per_s", "per second of steps"),
        ("env_steps_per_cpu_s", "per CPU second"),
    ]
    for i, (key, label) in enumerate(metrics):
        rates.bar(x + (i - 1) * 0.27, [r[key] for r in rows], width=0.27, label=label)
    rates.set_xticks(x, [r["mode"] for r in rows])
    rates.set_ylabel("env steps / s")
    rates.set_title(title, fontsize=9)
    rates.legend(fontsize=8)
    bottom = np.zeros(len(rows))
    for i, (part, label) in enumerate(
        [("reset_s", "reset + build"), ("step_s", "step + render"), ("policy_s", "policy")]
    ):
        heights = np.array([r[part] for r in rows])
        parts.bar(x, heights, bottom=bottom, color=f"C{i + 3}", label=label)
        bottom += heights
    parts.set_xticks(x, [r["mode"] for r in rows])
    parts.set_ylabel("wall seconds (all calls)")
    parts.legend(fontsize=8)
    common.save_figure(fig, name, out_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=sorted(POLICY_OVERRIDES), default="openvla_oft")
    parser.add_argument(
        "--modes", default="before,after", help=f"comma-separated from {MODES}, first = base"
    )
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--env-steps", type=int, default=160)
    parser.add_argument("--group", type=int, default=8, help="group_size = num_envs")
    parser.add_argument("--quick", action="store_true", help="2 calls of 4 x 48 env steps")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    args = parser.parse_args()
    if args.quick:
        args.env_steps, args.group = 48, 4
    modes = args.modes.split(",")
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: comma-separated from {MODES}")
    torch.set_num_threads(1)  # a DAG worker's torch_threads
    cfg = run_config(args.policy, args.env_steps, args.group)
    torch.manual_seed(0)
    actor = cfg.models.actor
    policy = POLICIES.get(actor.policy)(OmegaConf.to_container(actor.options), torch.device("cpu"))
    policy.eval()
    started = time.perf_counter()
    rows, outputs = [], {}
    for mode in modes:
        row, outputs[mode] = measure(mode, cfg, policy, args.calls)
        rows.append(row)
    checks = compare(outputs)
    for row in rows:
        row["speedup"] = row["env_steps_per_s"] / rows[0]["env_steps_per_s"]
        row["cpu_speedup"] = row["env_steps_per_cpu_s"] / rows[0]["env_steps_per_cpu_s"]
        row["trajectories_equal"] = checks.get(row["mode"], {}).get("trajectories_equal", "-")
    columns = ["mode", "env_steps", "wall_s", "reset_s", "step_s", "policy_s", "cpu_s",
               "env_steps_per_s", "steps_only_per_s", "speedup", "env_steps_per_cpu_s",
               "cpu_speedup", "peak_rss_gb", "trajectories_equal"]  # fmt: skip
    table = common.print_table(rows, columns)
    name = NAME if args.policy == "openvla_oft" else f"{NAME}_{args.policy}"
    settings = {
        "policy": args.policy,
        "chunk": chunk_of(cfg),
        "calls": args.calls,
        "episodes_per_call": args.group,
        "num_envs": args.group,
        "env_steps_per_episode": args.env_steps,
        "simulator_options": OmegaConf.to_container(cfg.simulator.options, resolve=True),
        "before_commit": BEFORE_COMMIT,
        "torch_threads": 1,
    }
    total = time.perf_counter() - started
    print(f"total {total:.0f} s", flush=True)
    common.write_results(
        name,
        {"settings": settings, "rows": rows, "checks": checks, "table": table, "total_s": total},
        args.out,
    )
    title = f"srpo_libero rollout, {args.policy} (chunk {chunk_of(cfg)}), {args.group} envs"
    plot(rows, title, name, args.out)


if __name__ == "__main__":
    main()
