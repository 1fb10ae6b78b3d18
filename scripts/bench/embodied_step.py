"""Embodied step breakdown: where one SRPO training step on LIBERO spends its wall time.

What is measured: short SRPO trainings (``configs/srpo_libero.yaml``, DAG ``dag/srpo.yaml``)
on ONE worker, for two policies, each with 1, 2 and 4 LIBERO simulators per worker (one env
per simulator process: ``rollout.num_envs = rollout.processes = S``):

- ``mlp``: the MLP policy (``policies/mlp``) reading the 64 px agentview camera image (three
  stride-2 convolutions) and the 8-d proprio state; Gaussian head over the 7 action
  dimensions, one action per policy step.
- ``openvla_oft``: the tiny random-init OpenVLA-OFT preset of ``srpo_libero`` (two 3-block
  ViTs at 32 px, a 2-layer Llama, the Qwen2.5 tokenizer), a chunk of 8 actions per step.

The work per step is FIXED: 4 episodes (2 init states of LIBERO-spatial task 0 x a group of
2) of ``--env-steps`` env steps each (default 24 = 3 OFT chunks; 16 with ``--quick``), for
every policy and simulator count, so step times compare directly (with S simulators the
episodes run in 4/S waves). One task only, so each simulator builds its env once, when the
worker sets up, and every reset reuses it (rebuilding an env for a new task costs 3-7 s and
would swamp the stepping this measures). Camera: agentview 64 px, reflections off.

How: each setting is a real training run through ``launch`` (embedded Ray, one ``DAGWorker``,
``torch_threads=1`` as in the config, the cheap video encoder, no evaluation, no
checkpoints); ``<run_dir>/metrics.jsonl`` gives per step ``time/step`` and each node's time
(max over ranks, here one rank). 3 steps (2 with ``--quick``); step 0 is excluded as
warm-up (first resets and forwards). Each measured step is split into

- simulation: ``time/rollout/simulate`` (``env.reset`` + ``env.step`` + ``env.render``), of
  which ``reset`` (``time/rollout/reset``: robosuite reset, the official init state and 10
  settle steps, once per episode wave; a large share with these short episodes),
- policy inference: ``time/rollout/policy`` (``policy.act``),
- encoder: the ``encode.video`` node, reward: the ``reward.srpo`` node,
- update: the ``actor.train`` node,
- other: the step total minus those parts (rollout bookkeeping, data, filter, advantage).

Env steps/s = env steps per step / step time (end to end) and / simulation time (the
simulators' throughput). There is no external reference system for this breakdown and no
target: the comparison is across policies and simulator counts, measured in one run.

Checks: every step trained all 4 episodes (``dapo/kept_samples``); with no success (random
policies) every episode ran exactly ``--env-steps`` env steps, so both policies did the same
simulation work; the parts are positive and fit inside the step (other >= 0).

Run (full: estimated 6 min on 2 idle cores, peaks at 4 LIBERO processes, about 10 GB)::

    .venv/bin/python scripts/bench/embodied_step.py

Quick check (1 and 2 simulators, 2 steps, at most 2 LIBERO processes)::

    .venv/bin/python scripts/bench/embodied_step.py --quick --out /tmp/bench_embodied
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import ray

from embodied_rl.launch.launcher import launch
from embodied_rl.launch.ray_setup import start_ray
from embodied_rl.runtime.config import compose

NAME = "embodied_step"
EPISODES_PER_STEP = 4  # data.batch_size 2 (task, init state) pairs x rollout.group_size 2
# The MLP policy on LIBERO: agentview image (the simulator's image_size) + proprio state.
MLP_OPTIONS = "{state_dim: 8, image_size: 64, action_dim: 7, head: gaussian, hidden: [64, 64]}"
POLICY_OVERRIDES = {
    "mlp": [
        "models.actor.policy=mlp",
        "~models.actor.options",
        f"+models.actor.options={MLP_OPTIONS}",
    ],
    "openvla_oft": [],  # the config's tiny preset
}
# Step parts that add up (with "other") to the step: (column, metric key); the node ids are
# looked up by node type in the composed DAG. "reset" is the part of "simulate" in env.reset.
RESET_KEY = "time/{rollout}/reset"
PARTS = (
    ("simulate", "time/{rollout}/simulate"),
    ("inference", "time/{rollout}/policy"),
    ("encoder", "time/{encode}"),
    ("reward", "time/{reward}"),
    ("update", "time/{train}"),
)
NODE_TYPES = {
    "rollout": "rollout.env",
    "encode": "encode.video",
    "reward": "reward.srpo",
    "train": "actor.train",
}


def run_config(policy: str, sims: int, env_steps: int, steps: int, run_dir: Path) -> Any:
    """The composed ``srpo_libero`` config of one setting."""
    cfg = compose(
        "srpo_libero",
        [
            *POLICY_OVERRIDES[policy],
            "workers.num_workers=1",
            f"trainer.total_steps={steps}",
            "trainer.checkpoint_every=0",
            "trainer.log_to_console=false",
            "eval.every=0",
            "eval.at_end=false",
            f"run_dir={run_dir}",
            "data.batch_size=2",
            "data.tasks=[0]",
            "rollout.group_size=2",
            f"rollout.num_envs={sims}",
            f"rollout.processes={sims}",
            f"simulator.options.max_steps={env_steps}",
        ],
    )
    chunk = chunk_of(cfg)
    if env_steps % chunk:
        raise SystemExit(f"--env-steps must be a multiple of the OFT chunk ({chunk})")
    cfg.rollout.max_steps = env_steps // chunk  # policy steps per episode
    return cfg


def chunk_of(cfg: Any) -> int:
    """Env actions per policy step: OFT's ``chunk`` option; the MLP policy acts one at a time."""
    return int(cfg.models.actor.options.get("chunk", 1))


def node_ids(cfg: Any) -> dict[str, str]:
    """The ids of the timed nodes in this config's DAG, by alias (``rollout``, ``encode``...)."""
    ids = {}
    for alias, node_type in NODE_TYPES.items():
        matches = [n.id for n in cfg.dag.nodes if n.type == node_type]
        if len(matches) != 1:
            raise SystemExit(f"expected one {node_type} node in the DAG, found {matches}")
        ids[alias] = matches[0]
    return ids


class PeakTreeRss(common.PeakRss):
    """``PeakRss`` of the summed RSS of a process and its descendants: here the driver, Ray,
    the DAG worker and its simulator processes (shared pages count once per process)."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(interval=interval)  # walking the process tree is slower than one RSS

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, common.tree_rss_mb(self.pid))
            self._stop.wait(self.interval)


def measure(policy: str, sims: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Train one setting and return its mean step breakdown over the measured steps."""
    run_dir = root / f"{policy}_s{sims}"
    cfg = run_config(policy, sims, args.env_steps, args.steps, run_dir)
    print(f"--- {policy}, {sims} simulator(s): {args.steps} steps", flush=True)
    started = time.perf_counter()
    with PeakTreeRss() as memory:
        result = launch(cfg, show_progress=False)
    run_seconds = time.perf_counter() - started
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    check_run(lines, cfg, args)
    ids = node_ids(cfg)
    keys = {column: key.format(**ids) for column, key in PARTS}
    measured = lines[1:]  # step 0: warm-up
    mean = lambda key: statistics.fmean(m[key] for m in measured)  # noqa: E731
    row: dict[str, Any] = {"policy": policy, "sims": sims, "step_s": mean("time/step")}
    row.update({column: mean(key) for column, key in keys.items()})
    row["other"] = row["step_s"] - sum(row[c] for c in keys)
    row["reset"] = mean(RESET_KEY.format(**ids))
    row["rollout_s"] = mean(f"time/{ids['rollout']}")
    env_steps = EPISODES_PER_STEP * mean("rollout/episode_steps") * chunk_of(cfg)
    row["env_steps"] = env_steps
    row["env_steps_per_s"] = env_steps / row["step_s"]
    row["sim_env_steps_per_s"] = env_steps / row["simulate"]
    row["success_rate"] = mean("rollout/success_rate")
    row["peak_rss_gb"] = memory.peak_mb / 1024
    row["run_s"] = run_seconds
    keys["reset"] = RESET_KEY.format(**ids)
    row["per_step"] = [
        {"step": m["step"], "step_s": m["time/step"], **{c: m[k] for c, k in keys.items()}}
        for m in lines
    ]
    check_breakdown(row, keys)
    return row


def check_run(lines: list[dict[str, Any]], cfg: Any, args: argparse.Namespace) -> None:
    """Every step ran and trained all episodes; without successes, each ran its full length."""
    if [m["step"] for m in lines] != list(range(args.steps)):
        raise SystemExit(f"expected steps 0..{args.steps - 1}, got {[m['step'] for m in lines]}")
    per_episode = args.env_steps // chunk_of(cfg)
    for m in lines:
        if m["dapo/kept_samples"] != EPISODES_PER_STEP:
            raise SystemExit(f"step {m['step']}: trained {m['dapo/kept_samples']} episodes")
        if m["rollout/success_rate"] == 0 and m["rollout/episode_steps"] != per_episode:
            raise SystemExit(
                f"step {m['step']}: {m['rollout/episode_steps']} policy steps per episode, "
                f"expected {per_episode} ({args.env_steps} env steps)"
            )


def check_breakdown(row: dict[str, Any], keys: dict[str, str]) -> None:
    """The parts are positive, the rollout's parts fit in the rollout, all fit in the step."""
    if min(row[c] for c in keys) <= 0:
        raise SystemExit(f"a step part is not positive: {row}")
    fits = (
        row["reset"] <= row["simulate"]
        and row["simulate"] + row["inference"] <= row["rollout_s"]
        and row["other"] >= 0
    )
    if not fits:
        raise SystemExit(f"the parts exceed their total: {row}")


def plot(rows: list[dict[str, Any]], out_dir: Path) -> None:
    """Stacked step-time bars per policy x simulators (all parts, then all but simulation);
    env steps/s against simulators."""
    fig, (whole, rest, rates) = common.new_figure(ncols=3, width=5.2, height=5.2)
    segments = {
        "simulate: reset": lambda r: r["reset"],
        "simulate: step + render": lambda r: r["simulate"] - r["reset"],
        **{c: (lambda r, c=c: r[c]) for c, _ in PARTS[1:]},
        "other": lambda r: r["other"],
    }
    stacked_bars(whole, rows, segments)
    whole.set_title(f"SRPO step on LIBERO ({rows[0]['env_steps']:.0f} env steps)")
    stacked_bars(rest, rows, dict(list(segments.items())[2:]), first_color=2)
    rest.set_title("the same without simulation")
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        sims = [r["sims"] for r in mine]
        rates.plot(sims, [r["env_steps_per_s"] for r in mine], "o-", label=f"{policy}: step")
        rates.plot(
            sims, [r["sim_env_steps_per_s"] for r in mine], "x--", label=f"{policy}: simulation"
        )
    rates.set_xticks(sorted({r["sims"] for r in rows}))
    rates.set_ylim(bottom=0)
    rates.set_xlabel("simulators per worker")
    rates.set_ylabel("env steps / s")
    rates.set_title("env steps per step second / per simulation second", fontsize=10)
    rates.legend(fontsize=8)
    common.save_figure(fig, NAME, out_dir)


def stacked_bars(ax: Any, rows: list[dict[str, Any]], segments: dict, first_color: int = 0) -> None:
    """One bar per row, one stacked segment per ``{label: row -> seconds}``."""
    bottom = [0.0] * len(rows)
    for i, (label, seconds) in enumerate(segments.items()):
        heights = [seconds(r) for r in rows]
        ax.bar(range(len(rows)), heights, bottom=bottom, label=label, color=f"C{first_color + i}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(rows)), [f"{r['policy']}\n{r['sims']} sim" for r in rows], fontsize=8)
    ax.set_ylabel("seconds per training step")
    ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1-2 simulators, 2 steps")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--env-steps", type=int, default=None, help="env steps per episode")
    args = parser.parse_args()
    sims_list = [1, 2] if args.quick else [1, 2, 4]
    args.steps = 2 if args.quick else 3
    args.env_steps = args.env_steps or (16 if args.quick else 24)
    started = time.perf_counter()
    first = run_config("openvla_oft", 1, args.env_steps, args.steps, Path("."))
    # One embedded Ray cluster for all runs (launch leaves a running cluster alone).
    start_ray(first, num_workers=1, cpus_per_worker=first.workers.cpus_per_worker)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_embodied_") as tmp:
            for policy in POLICY_OVERRIDES:
                for sims in sims_list:
                    rows.append(measure(policy, sims, args, Path(tmp)))
    finally:
        ray.shutdown()
    for row in rows:
        base = next(r for r in rows if r["policy"] == row["policy"] and r["sims"] == 1)
        row["speedup"] = base["step_s"] / row["step_s"]
    columns = [
        "policy", "sims", "step_s", "simulate", "reset", *(c for c, _ in PARTS[1:]), "other",
        "env_steps", "env_steps_per_s", "sim_env_steps_per_s", "speedup", "peak_rss_gb",
    ]  # fmt: skip
    table = common.print_table(rows, columns)
    total_s = time.perf_counter() - started
    print(f"total {total_s:.0f} s", flush=True)
    common.write_results(
        NAME,
        {
            "settings": {
                "quick": args.quick,
                "steps": args.steps,
                "measured_steps": args.steps - 1,
                "episodes_per_step": EPISODES_PER_STEP,
                "env_steps_per_episode": args.env_steps,
                "simulators": sims_list,
                "task": "libero_spatial task 0, agentview 64 px, reflections off",
                "workers": 1,
            },
            "total_s": total_s,
            "rows": rows,
            "table": table,
        },
        args.out,
    )
    plot(rows, args.out)


if __name__ == "__main__":
    main()
