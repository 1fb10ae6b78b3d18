"""Shared pieces of the runtime tests: the CLI command of a run, runs that are interrupted
(worker death, preemption), a run's metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig, open_dict


def cli_train_command(config: str, *overrides: str) -> list[str]:
    """``embodied-rl train --no-progress --config-name config overrides...`` as a process runs
    it (this interpreter), for the tests that run the CLI as a user does."""
    command = [sys.executable, "-m", "embodied_rl.cli", "train", "--no-progress"]
    return [*command, "--config-name", config, *overrides]


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
