"""Our side of ``grpo_vs_trl``: ``grpo_llm`` through ``launch``, and the hooks that time it.

This module is also the plugin our workers import (``plugins: [..., grpo_vs_trl_ours]``, found
on ``PYTHONPATH``): with ``GRPO_VS_TRL_PHASE_LOG`` set, importing it installs the hooks, so
they live in the Ray worker that trains. ``grpo_vs_trl.py``'s docstring says what is timed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from grpo_vs_trl_setup import PHASE_LOG_ENV, PhaseLog, check_mappable, compose_config, hook_generate


def install_ours_hooks(path: str) -> None:
    """Hooks in our worker: step boundaries, prompts drawn, generate, no-grad log-probs."""
    import torch

    from embodied_rl import keys as K
    from embodied_rl.data.batch import strings
    from embodied_rl.data.dataloader import ShardedPromptLoader
    from embodied_rl.metrics import RunLogger
    from embodied_rl.runtime.executor import PlanExecutor
    from policies.causal_lm.modeling import CausalLMPolicy
    from policies.causal_lm.qwen_vocab import QWEN2_EOS_ID

    log = PhaseLog(path)
    run, write_metrics, evaluate = PlanExecutor.run, RunLogger.log, CausalLMPolicy.evaluate
    draw = ShardedPromptLoader.next_batch

    def run_walk(self: Any, step: int) -> None:
        if self.name == "train":
            log.step = step
        run(self, step)

    def next_batch(self: Any) -> Any:
        batch = draw(self)
        prompts, answers = strings(batch, K.PROMPT_TEXT), strings(batch, K.ANSWER_TEXT)
        log.write("prompts", prompts=prompts, answers=answers)
        return batch

    def log_metrics(self: Any, step: int, metrics: Any) -> None:
        write_metrics(self, step, metrics)
        log.write("step_end", t=time.perf_counter(), cpu=time.process_time())

    def timed_evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():  # the actor update's forward: part of "update"
            return evaluate(self, *args, **kwargs)
        started = time.perf_counter()
        out = evaluate(self, *args, **kwargs)
        log.write("logprob", seconds=time.perf_counter() - started)
        return out

    PlanExecutor.run, RunLogger.log, CausalLMPolicy.evaluate = run_walk, log_metrics, timed_evaluate
    ShardedPromptLoader.next_batch = next_batch
    hook_generate(log, QWEN2_EOS_ID)


# ------------------------------------------------------------------------------ our side
def run_ours(seed: int, steps: int, constrained: bool, workdir: Path, result: Path) -> None:
    """Train with ``launch`` (the hooks load in the worker); write its metrics to ``result``."""
    import torch

    from embodied_rl.launch.launcher import launch

    torch.set_num_threads(1)
    cfg = compose_config(seed, steps, constrained, str(workdir / "outputs"))
    check_mappable(cfg)
    run = launch(cfg, show_progress=False)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    result.write_text(json.dumps({"run_dir": str(run.run_dir), "metrics": rows}))


if os.environ.get(PHASE_LOG_ENV):
    # Imported as a plugin (by the worker, and by the driver while it checks the config).
    install_ours_hooks(os.environ[PHASE_LOG_ENV])
