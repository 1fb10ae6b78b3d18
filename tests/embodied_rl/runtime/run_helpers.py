"""Shared pieces of the runtime tests: the CLI command of a run and its console, runs that
are interrupted (worker death, preemption), a run's metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
from omegaconf import DictConfig, open_dict

# The console script of this interpreter's environment: what a user runs (a signal during its
# imports is one line, not the traceback ``python -m embodied_rl.cli`` prints).
CLI_SCRIPT = Path(sys.executable).with_name("embodied-rl")


def cli_train_command(config: str, *overrides: str) -> list[str]:
    """``embodied-rl train --no-progress --config-name config overrides...`` as a user runs it
    (the console script), for the tests that run the CLI in a process of its own."""
    command = [str(CLI_SCRIPT), "train", "--no-progress"]
    return [*command, "--config-name", config, *overrides]


# Every line a clean run may print (with --no-progress or without a terminal).
RUN_LINES = re.compile(r"step \d+/\d+  .*|run finished: .*|final metrics: .*")


def run_cli_train(
    config: str, *overrides: str, config_dir: Path | None = None, timeout_s: float = 300
) -> tuple[int, str, str]:
    """``embodied-rl train --no-progress`` in a process of its own, with an embedded Ray
    cluster of its own as a user's command gets (not the tests' shared one, whose
    ``RAY_`` variables are left out): (exit code, stdout, stderr)."""
    command = cli_train_command(config, *overrides)
    if config_dir is not None:
        command += ["--config-dir", str(config_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") or k == "RAY_AUTH_MODE"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    return done.returncode, done.stdout, done.stderr


def assert_only_run_lines(stdout: str, stderr: str, steps: int) -> None:
    """The console of a clean run: its step lines 1..``steps``, the run folder and the final
    metrics, nothing else (no library notices, no colour codes, no Ray prefixes)."""
    lines = (stdout + stderr).splitlines()
    assert "\x1b" not in stdout + stderr, lines
    assert [line for line in lines if not RUN_LINES.fullmatch(line)] == []
    assert [line.split()[1] for line in lines if line.startswith("step ")] == [
        f"{k}/{steps}" for k in range(1, steps + 1)
    ]


def with_hang_before_train(cfg: DictConfig, rank: int, step: int, hang_s: float) -> DictConfig:
    """``cfg`` with a ``fault.inject`` node between ``advantage`` and ``train`` that holds
    ``rank`` inside ``step`` for ``hang_s`` seconds.

    Every run of a test gets the same DAG (a disabled fault node passes its batch through), so
    the uninterrupted and the interrupted run differ only in the interruption.
    """
    with open_dict(cfg):
        hang = {"rank": rank, "step": step, "mode": "hang", "hang_s": hang_s}
        cfg.dag.nodes.append(
            {"id": "chaos", "type": "fault.inject", "deps": ["advantage"], "config": hang}
        )
        train = next(node for node in cfg.dag.nodes if node.id == "train")
        train.deps = ["chaos"]
    return cfg


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of a run's ``metrics.jsonl``, one per step."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable_numbers(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rows without wall times, rates and memory (they differ between any two runs)."""
    return [
        {
            k: v
            for k, v in r.items()
            if not (k.startswith(("time/", "memory/")) or k.endswith("_per_s"))
        }
        for r in rows
    ]


def ray_processes() -> set[int]:
    """Live (not zombie) processes of any Ray cluster on this machine, by pid."""
    found = set()
    for process in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(process.info["cmdline"] or [])
        if any(name in line for name in ("ray::", "raylet", "gcs_server")):
            if process.info["status"] != psutil.STATUS_ZOMBIE:
                found.add(process.pid)
    return found


def ray_strays(before: set[int]) -> list[str]:
    """Ray processes started since ``before`` that descend from none of ``before``.

    A Ray cluster already up on the machine (the tests' shared one) keeps starting and ending
    workers of its own; those are its raylet's children, not a run's orphans.
    """
    strays = []
    for pid in ray_processes() - before:
        try:
            process = psutil.Process(pid)
            if not any(parent.pid in before for parent in process.parents()):
                strays.append(
                    f"{pid} (parent {process.ppid()}): {' '.join(process.cmdline())[:300]}"
                )
        except psutil.NoSuchProcess:
            continue
    return strays


# srpo_reach small enough to stop and resume in seconds, with successes from its first step
# (numbers to compare); each test adds its steps and its checkpoint and evaluation cadence.
SMALL_REACH_RUN = [
    "eval.at_end=false",
    "eval.batch_size=4",  # 4 of 40 held-out pairs each time: the eval loader moves on
    "eval.max_videos=0",
    "data.batch_size=2",
    "simulator.options.success_radius=0.2",
    "rollout.group_size=4",
    "rollout.num_envs=4",
    "ray.poll_interval_s=0.2",
]
