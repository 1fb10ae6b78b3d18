"""Shared pieces of the runtime tests that interrupt a run (worker death, preemption)."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, open_dict


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
