"""GRPO on ``grpo_llm`` with the HF and the vLLM rollout backend, one after the other.

The same config, seed, data and step count through the real entrypoint (Ray, 2 CPU workers
by default); only ``rollout.backend`` differs. Reported per backend: the median step and
rollout time (the first step is left out: it includes vLLM's weight push after start-up),
vLLM's engine start and weight push, the log-prob mismatch between the engine and the
trainer, and the mean reward of the first and last 10 steps. Needs vLLM, so run it with the
vLLM venv's interpreter::

    bash scripts/install_vllm.sh
    .venv-vllm/bin/python scripts/bench/rollout_backends.py            # 60 steps, ~7 min
    .venv-vllm/bin/python scripts/bench/rollout_backends.py --steps 10 # quick look

Writes ``docs/benchmarks/rollout_backends.{json,png}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common


def run_backend(backend: str, steps: int, workers: int, root: Path) -> dict[str, Any]:
    """Train ``steps`` steps of grpo_llm with ``backend``; returns the summary row."""
    from embodied_rl.launch.launcher import launch
    from embodied_rl.runtime.config import compose

    overrides = [
        f"rollout.backend={backend}",
        f"trainer.total_steps={steps}",
        f"workers.num_workers={workers}",
        "trainer.checkpoint_every=0",
        f"run_dir={root / backend}",
    ]
    started = time.perf_counter()
    result = launch(compose("grpo_llm", overrides), show_progress=False)
    wall = time.perf_counter() - started
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    if [m["step"] for m in lines] != list(range(steps)):
        raise RuntimeError(f"{backend}: metrics for steps {[m['step'] for m in lines]}")
    after_first = lines[1:] or lines

    def median(key: str) -> float | None:
        values = [m[key] for m in after_first if key in m]
        return statistics.median(values) if values else None

    window = min(10, steps)
    return {
        "backend": backend,
        "wall_s": wall,
        "step_s": median("time/step"),
        "rollout_s": median("time/rollout"),
        "engine_start_s": lines[0].get("time/rollout/engine_start"),
        "weight_push_s": median("time/rollout/weight_sync"),
        "logprob_mismatch": statistics.fmean(m.get("rollout/logprob_mismatch", 0) for m in lines)
        if backend == "vllm"
        else None,
        "logprob_mismatch_max": max(m.get("rollout/logprob_mismatch_max", 0) for m in lines)
        if backend == "vllm"
        else None,
        "reward_first": statistics.fmean(m["reward/mean"] for m in lines[:window]),
        "reward_last": statistics.fmean(m["reward/mean"] for m in lines[-window:]),
        "curve": [m["reward/mean"] for m in lines],
    }


def plot(rows: list[dict[str, Any]]) -> None:
    fig, (ax,) = common.new_figure()
    for row in rows:
        ax.plot(row["curve"], label=f"{row['backend']} ({row['step_s']:.2f} s/step)")
    ax.set_xlabel("step")
    ax.set_ylabel("reward/mean")
    ax.set_title("grpo_llm: HF vs vLLM rollout backend")
    ax.legend()
    common.save_figure(fig, "rollout_backends")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("vLLM is not installed here: bash scripts/install_vllm.sh, then run this with "
                 ".venv-vllm/bin/python")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="erl-bench-backends-") as tmp:
        rows = [run_backend(b, args.steps, args.workers, Path(tmp)) for b in ("hf", "vllm")]
    columns = [k for k in rows[0] if k != "curve"]
    common.print_table(rows, columns)
    hf, vllm_row = rows
    ratios = {
        "step_speedup": hf["step_s"] / vllm_row["step_s"],
        "rollout_speedup": hf["rollout_s"] / vllm_row["rollout_s"],
    }
    print(
        f"vLLM vs HF: step {ratios['step_speedup']:.2f}x, rollout {ratios['rollout_speedup']:.2f}x"
    )
    common.write_results("rollout_backends", {"settings": vars(args), "rows": rows, **ratios})
    plot(rows)


if __name__ == "__main__":
    main()
