"""Pretraining on the LIBERO-90 corpus: the presets' sizes and speeds, and whether the data
pipeline keeps up with the model.

For each policy (OpenVLA-OFT with its L1 head, OpenVLA-OFT with discrete tokens, OpenVLA) a
short ``pretrain_libero90`` run without evaluation, the CLI in a subprocess, on the same
corpus and batches (one seed, one row order). The trainer times each step's nodes:
``time/demos`` is the demo loader (rows drawn, a demo's frames read from the corpus and
resized on first use, chunks padded, random shift), ``time/train`` the model's forward,
backward and optimizer update on those rows. Per policy: parameters, image size, and the
samples/s of the loader alone, of the model alone and of the two in turn (what the run gets),
over the first ``--cold`` steps (frames still being read from disk) and the steps after
them (frames cached). Target: the loader yields at least 70% of the samples/s the model
consumes (its ratio column >= 0.7).

Writes ``docs/benchmarks/<--name>.json`` with every command; runs go to
``outputs/bench_<--name>/<policy>`` and a finished one is read back, not rerun (``--fresh``).

Run (about 3 minutes a policy on 2 idle cores, with the corpus of
``configs/pretrain_libero90.yaml`` in demos/libero_90)::

    .venv/bin/python scripts/bench/pretrain_pipeline.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import common
from libero_learning import read_jsonl
from main_job import timed_run

CONFIG = "pretrain_libero90"
POLICIES = ("openvla_oft_libero", "openvla_oft_libero_tokens", "openvla_libero")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--steps", type=int, default=300, help="updates per run")
    parser.add_argument("--cold", type=int, default=50, help="first steps counted as cold")
    parser.add_argument("--name", default="pretrain_pipeline", help="results name")
    parser.add_argument("--out", type=Path, default=common.RESULTS_DIR)
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    parser.add_argument("--overrides", nargs="*", default=[], help="added to every command")
    return parser.parse_args(argv)


def train_command(run_dir: Path, policy: str, steps: int, overrides: list[str]) -> list[str]:
    """``pretrain_libero90`` with ``policy``: ``steps`` updates, no evaluation, one checkpoint."""
    command = [sys.executable, "-m", "embodied_rl.cli", "train", "--no-progress"]
    command += ["--config-name", CONFIG, f"policy={policy}", f"run_dir={run_dir}"]
    command += [f"trainer.total_steps={steps}", f"trainer.checkpoint_every={steps}"]
    return command + ["eval.every=0", "eval.at_end=false", *overrides]


def parameters(run_dir: Path) -> int:
    """Parameters of the run's policy, built from its resolved ``config.yaml``."""
    import torch
    from omegaconf import OmegaConf

    from embodied_rl.registry import POLICIES as REGISTERED
    from embodied_rl.registry import load_plugins

    load_plugins()
    actor = OmegaConf.load(run_dir / "config.yaml").models.actor
    options = OmegaConf.to_container(actor.options, resolve=True)
    policy = REGISTERED.get(actor.policy)(options, torch.device("cpu"))
    return sum(p.numel() for p in policy.parameters())


def rates(rows: list[dict[str, Any]], batch: int) -> dict[str, float]:
    """Samples/s of the loader, of the model and of both in turn over ``rows`` (steps)."""
    demos = sum(float(r["time/demos"]) for r in rows)
    train = sum(float(r["time/train"]) for r in rows)
    samples = batch * len(rows)
    return {
        "steps": len(rows),
        "loader_samples_s": samples / demos,
        "model_samples_s": samples / train,
        "both_samples_s": samples / (demos + train),
        "loader_over_model": train / demos,
    }


def run_result(run_dir: Path, policy: str, command: list[str], wall_s: float, cold: int) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "time/demos" in r]
    batch = int(cfg.data.batch_size)
    return {
        "policy": policy,
        "command": command,
        "wall_s": wall_s,
        "parameters": parameters(run_dir),
        "image_size": int(cfg.simulator.options.image_size),
        "batch_size": batch,
        "cold": rates(steps[:cold], batch),
        "warm": rates(steps[cold:], batch),
        "loss_first_last": [float(steps[0]["sft/loss"]), float(steps[-1]["sft/loss"])],
    }


def corpus_summary(run_dir: Path) -> dict[str, Any]:
    """The demo files the run read (its ``data.paths``): how many, their size, and episodes."""
    from omegaconf import OmegaConf

    from embodied_rl.data.demos import find_demo_files, scan_demo_file

    paths = list(OmegaConf.load(run_dir / "config.yaml").data.paths)
    files = find_demo_files(paths)
    episodes = sum(len(scan_demo_file(file)) for file in files)
    size = sum(f.stat().st_size for f in files)
    return {"paths": paths, "demo_files": len(files), "episodes": episodes, "bytes": size}


def table_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for phase in ("cold", "warm"):
        r = result[phase]
        rows.append(
            {
                "policy": result["policy"],
                "params": result["parameters"],
                "steps": f"{phase} ({r['steps']})",
                "loader samples/s": r["loader_samples_s"],
                "model samples/s": r["model_samples_s"],
                "both samples/s": r["both_samples_s"],
                "loader / model": r["loader_over_model"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = Path("outputs") / f"bench_{args.name}"
    results = []
    for policy in args.policies:
        run_dir = (runs / policy).resolve()
        command = train_command(run_dir, policy, args.steps, args.overrides)
        wall_s = timed_run(run_dir, command, args.fresh)
        results.append(run_result(run_dir, policy, command, wall_s, args.cold))
    rows = [row for result in results for row in table_rows(result)]
    common.print_table(rows)
    corpus = corpus_summary((runs / args.policies[0]).resolve())
    print(f"corpus: {corpus['demo_files']} demo files, {corpus['episodes']} episodes")
    record = {"config": CONFIG, "corpus": corpus, "runs": results, "table": rows}
    common.write_results(args.name, record, args.out)


if __name__ == "__main__":
    main()
