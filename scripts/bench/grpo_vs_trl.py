"""LLM GRPO vs TRL: seconds per step and their split, generation speed, memory, reward curves.

What is measured: our ``grpo_llm`` training (``configs/grpo_llm.yaml``, ``dag/grpo.yaml``, ONE
worker) against TRL's ``GRPOTrainer`` (trl 1.16.0, CPU), both set up from the same composed
config: the ``tiny_qwen2`` weights our builder makes (TRL trains a copy of them), the Qwen2.5
tokenizer, the raw arithmetic prompts (no chat template) and our ``score`` reward, the digit
constraint, 16 prompts x a group of 8 per step, at most 3 response tokens, temperature 1,
AdamW (lr 3e-3 constant, betas 0.9/0.999, eps 1e-8, no weight decay), gradient clip 1.0, two
training micro-batches of 64 rows and one optimizer step per generation batch, the token-mean
loss (TRL ``loss_type="dapo"``: token sum / valid tokens of the whole generation batch), PPO
clip 0.2, group-std advantages, no KL (``beta=0``, no reference model), float32, and the same
prompts at every step (TRL trains, unshuffled, on the prompts our run drew).

How: each (system, seed) runs in a subprocess of this script with one torch thread (ours:
``workers.torch_threads=1``), ours first; the parent samples the RSS of the subprocess's
process tree every 50 ms. Both sides wrap the same points: ``Qwen2ForCausalLM.generate``
(seconds, real generated tokens up to and including EOS, prompt digests), the no-grad
log-prob pass (ours ``CausalLMPolicy.evaluate`` in the rollout node, TRL
``_get_per_token_logps_and_entropies``) and the metric logging that ends a step (ours
``RunLogger.log``, TRL ``on_log``). Ours runs through ``launch`` with ``grpo_vs_trl_ours`` as
a plugin, so its hooks live in the Ray worker. Update = ours' ``actor.train`` node / TRL's
``training_step`` minus its input preparation, plus clip and ``optimizer.step``. A step runs
from the end of one step's logging to the next; other = step - generate - log-prob - update
(tokenise, decode, reward, advantage, data, logging). Step 0 (warm-up) is excluded; seconds
are means over the other steps of all seeds. CPU s/step is the compute process's CPU time
(robust on a busy machine). Gen tok/s = generated tokens / generate seconds. Peak RSS: the
compute process (our ``DAGWorker`` actor, TRL's process) and the whole tree (ours adds the
driver and Ray's processes). Targets: ours >= 1.5x faster per step, and the mean reward of
the last 10 steps >= TRL's.

Checks (a failure stops the script before it writes anything): equal start weights; with one
seed, TRL's generate samples exactly our policy's tokens and its log-probs equal
``CausalLMPolicy.evaluate``'s (< 1e-4); both sides generated 16 x 8 rows every step from the
same prompts (per-step multiset of prompt token sequences); only digits and EOS were
generated; the hooks agree with each side's own logs (response lengths, TRL's rewards); both
ran every step; TRL's optimizer has our lr/betas/eps/weight decay and trains the same
parameters.

Mismatches that remain (also written to the JSON):

- Old log-probs: ours computes them in a no-grad pass in the rollout node; TRL skips that pass
  when num_iterations=1 and steps_per_generation == gradient_accumulation_steps and uses the
  detached current log-probs (ratio exactly 1): same loss and gradient, log-prob phase 0.
- Generation batching: ours generates in rollout micro-batches of 64 rows (2 calls per step);
  TRL generates the 128 rows in one call.
- Prompt padding: ours left-pads every prompt to max_prompt_length=16; TRL pads to the longest
  prompt of the batch and has no max_prompt_length (every prompt is checked to fit 16
  tokens, so neither side truncates).
- Log-prob kernel: ours computes full-vocabulary logits at the R+1 last positions and keeps
  the allowed columns; TRL's fused chunked LM head scores every position on CPU (its compact
  path needs Triton on a GPU) and always computes the entropy.
- Constraint: ours sets logits outside digits+EOS to -inf in generate and renormalises over
  them in evaluate; TRL gets the same distribution from a frozen lm_head bias of -1e4 outside
  them (exp underflows to exactly 0; checked by the same-samples and log-prob checks).
- Advantages: ours (r - mean) / (std + 1e-6), TRL (std + 1e-4), unbiased group std both.
- Sampling RNG: the seed fixes the prompts of every step on both sides, but the responses come
  from different random streams (ours reseeds every step, TRL seeds once), so the two reward
  curves are different samples of the same process.
- TRL shuffles the 128 rows before cutting its two micro-batches; ours keeps their order (no
  effect on the token-mean loss).
- TRL's log-prob pass numbers left-padded positions from the padding; RoPE only sees relative
  positions (covered by the log-prob check).
- Ours runs in a Ray actor (plus the driver and Ray's GCS/raylet) and logs JSONL + TensorBoard
  every step; TRL runs in one process and logs to memory (``report_to="none"``).

Run (full: 18 steps, seed 0; about 5-6 min on 2 idle cores, estimated from the CPU time per
step measured on a busy 2-core machine, about 4 s ours and 12-13 s TRL, plus ~20 s start-up
per run)::

    .venv/bin/python scripts/bench/grpo_vs_trl.py

Longer, two seeds: ``--steps 30 --seeds 0 1`` (about 17 min). Quick check (3 steps, seed 0)::

    .venv/bin/python scripts/bench/grpo_vs_trl.py --quick --out /tmp/bench_trl

Files: this one runs the subprocesses and writes the results; ``grpo_vs_trl_ours.py`` is our
side (and the plugin with its hooks), ``grpo_vs_trl_trl.py`` TRL's side,
``grpo_vs_trl_setup.py`` what both sides share, ``grpo_vs_trl_report.py`` the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
from grpo_vs_trl_report import SYSTEMS, TARGET_SPEEDUP, WARMUP_STEPS, analyse, plot, tables
from grpo_vs_trl_setup import NAME, PHASE_LOG_ENV


def docstring_bullets(heading: str) -> list[str]:
    """The ``- `` bullets under ``heading`` in this module's docstring, one string each."""
    section = __doc__.split(heading, 1)[1].split("\n\n", 2)[1]
    return [" ".join(item.split()) for item in ("\n" + section).split("\n- ")[1:]]


# ---------------------------------------------------------------------- parent: running
class TreeRssSampler:
    """Peak RSS of a process tree and of its compute process, sampled every ``interval`` s.

    The compute process is the root, or with ``match`` the descendant whose command line
    contains it (Ray titles our worker ``ray::DAGWorker...``).
    """

    def __init__(self, pid: int, match: str | None, interval: float = 0.05) -> None:
        self.pid, self.match, self.interval = pid, match, interval
        self.tree_peak_mb = self.compute_peak_mb = 0.0
        self.compute_pids: set[int] = set() if match else {pid}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                rss = proc.memory_info().rss / common.MB
                if self.match and proc.pid not in self.compute_pids:
                    if any(self.match in part for part in proc.cmdline()):
                        self.compute_pids.add(proc.pid)
            except psutil.Error:
                continue
            total += rss
            if proc.pid in self.compute_pids:
                self.compute_peak_mb = max(self.compute_peak_mb, rss)
        self.tree_peak_mb = max(self.tree_peak_mb, total)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                self._sample()
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeRssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def child_env(side: str, phase_log: Path) -> dict[str, str]:
    """Offline, one thread, this folder on ``PYTHONPATH``; ours gets the phase-log location.

    The folder goes on ``PYTHONPATH`` for our Ray worker, which imports ``grpo_vs_trl_ours``
    by name as a plugin and inherits this environment; the subprocess itself has the folder
    as ``sys.path[0]`` already.
    """
    env = dict(os.environ)
    path = [str(common.BENCH_DIR), env.get("PYTHONPATH", "")]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
    )
    env.pop(PHASE_LOG_ENV, None)
    if side == "ours":
        env[PHASE_LOG_ENV] = str(phase_log)
    return env


def run_child(side: str, seed: int, steps: int, constrained: bool, workdir: Path) -> dict:
    """One training in a subprocess; returns its result, phase events, peak RSS and wall time."""
    tag = f"{side}_seed{seed}"
    phase_log, result, output = (
        workdir / f"{tag}.{ext}" for ext in ("phases.jsonl", "json", "log")
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--seed", str(seed)]
    cmd += ["--steps", str(steps), "--workdir", str(workdir / tag), "--result", str(result)]
    cmd += ["--phase-log", str(phase_log)] + ([] if constrained else ["--unconstrained"])
    if side == "trl":  # TRL trains on the prompts our run of this seed drew
        cmd += ["--prompts-from", str(workdir / f"ours_seed{seed}.phases.jsonl")]
    (workdir / tag).mkdir()
    started = time.perf_counter()
    with open(output, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(side, phase_log)
        )
        with TreeRssSampler(proc.pid, "DAGWorker" if side == "ours" else None) as rss:
            code = proc.wait(timeout=3600)
    wall = time.perf_counter() - started
    if code != 0:
        print(output.read_text()[-6000:], file=sys.stderr)
        raise SystemExit(f"{tag} failed with exit code {code} (log above)")
    print(f"{tag}: {steps} steps in {wall:.1f} s", flush=True)
    events = [json.loads(line) for line in phase_log.read_text().splitlines()]
    return {
        "seed": seed,
        "result": json.loads(result.read_text()),
        "events": events,
        "peak_rss_compute_mb": rss.compute_peak_mb,
        "peak_rss_tree_mb": rss.tree_peak_mb,
        "wall_s": wall,
    }


# ---------------------------------------------------------------------- entry points
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 steps, seed 0 (checks the script)")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks")
    parser.add_argument("--steps", type=int, default=18, help="training steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--unconstrained", action="store_true", help="no digit constraint on either side"
    )
    parser.add_argument("--keep-tmp", action="store_true", help="keep the runs' temp folder")
    for hidden in ("--child", "--workdir", "--result", "--phase-log", "--prompts-from"):
        parser.add_argument(hidden, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


def run_child_mode(args: argparse.Namespace) -> None:
    """One training (``--child ours|trl``) in the subprocess that ``run_child`` started.

    The side's module is imported here, not at the top: ours installs its hooks on import.
    """
    workdir, result = Path(args.workdir), Path(args.result)
    if args.child == "ours":
        from grpo_vs_trl_ours import run_ours

        run_ours(args.seed, args.steps, not args.unconstrained, workdir, result)
    else:
        from grpo_vs_trl_trl import run_trl

        paths = {"result": result, "phase_log": Path(args.phase_log)}
        paths["prompts_from"] = Path(args.prompts_from)
        run_trl(args.seed, args.steps, not args.unconstrained, workdir, paths)


def main() -> None:
    args = parse_args()
    if args.child:
        run_child_mode(args)
        return
    from importlib.metadata import version

    steps, seeds = (3, [0]) if args.quick else (args.steps, args.seeds)
    if steps < WARMUP_STEPS + 1:
        raise SystemExit(f"--steps must be at least {WARMUP_STEPS + 1}")
    workdir = Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    runs: dict[str, list[dict]] = {side: [] for side in SYSTEMS}
    try:
        for seed in seeds:  # ours first: TRL then trains on the prompts ours drew
            for side in SYSTEMS:
                runs[side].append(run_child(side, seed, steps, not args.unconstrained, workdir))
    finally:
        if args.keep_tmp:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report = analyse(runs, steps)
    text = tables(report)
    common.print_table(text["systems"])
    print()
    common.print_table(text["targets"])
    failed = [name for name, ok in report["checks"].items() if not ok]
    if failed:
        raise SystemExit(f"correctness checks failed, nothing written: {failed}")
    print(f"all {len(report['checks'])} correctness checks passed")
    payload = {
        "config": {
            "steps": steps,
            "seeds": seeds,
            "warmup_steps_excluded": WARMUP_STEPS,
            "constrained": not args.unconstrained,
            "torch_threads": 1,
            "trl_version": version("trl"),
            "target_speedup": TARGET_SPEEDUP,
        },
        "mismatches": docstring_bullets("Mismatches that remain"),
        **report,
        "tables": text,
    }
    common.write_results(NAME, payload, args.out)
    plot(report, args.out)


if __name__ == "__main__":
    main()
