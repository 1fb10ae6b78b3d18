"""What both sides of ``grpo_vs_trl`` share: the phase log, the ``generate`` hook, the config.

Imported by the parent, by both training subprocesses and, through ``grpo_vs_trl_ours`` (the
plugin), by our Ray worker. torch, transformers and the project's packages are imported
inside the functions that use them: the parent imports this module only for its names.
``grpo_vs_trl.py``'s docstring says what is measured and how.
"""

from __future__ import annotations

import functools
import json
import time
import zlib
from pathlib import Path
from typing import Any

NAME = "grpo_vs_trl"
OURS_PLUGIN = "grpo_vs_trl_ours"  # the module our workers import as a plugin: the hooks
PHASE_LOG_ENV = "GRPO_VS_TRL_PHASE_LOG"  # set: importing OURS_PLUGIN installs the hooks


class PhaseLog:
    """Appends timing events of one run to a JSONL file, tagged with the current step."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.step = -1

    def write(self, event: str, **fields: Any) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"event": event, "step": self.step, **fields}) + "\n")


def generation_stats(
    input_ids: Any, attention_mask: Any, output: Any, eos_id: int
) -> dict[str, Any]:
    """Real generated tokens, rows, prompt digests and token ids of one ``generate`` call.

    Args:
        input_ids / attention_mask: (B, P) left-padded prompts.
        output: (B, P + R') prompts followed by the generated tokens (R' <= R).

    Returns:
        ``tokens`` (tokens up to and including each row's first EOS), ``rows``,
        ``prompt_digests`` (crc32 of each row's real prompt tokens) and ``token_ids`` (the
        distinct generated ids).
    """
    import torch

    completion = output[:, input_ids.shape[1] :]
    is_eos = completion == eos_id
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    real = ~after_eos
    digests = [
        zlib.crc32(row[mask.bool()].numpy().astype("int64").tobytes())
        for row, mask in zip(input_ids.cpu(), attention_mask.cpu())
    ]
    return {
        "tokens": int(real.sum()),
        "rows": int(completion.shape[0]),
        "prompt_digests": digests,
        "token_ids": sorted(torch.unique(completion[real]).tolist()),
    }


def hook_generate(log: PhaseLog, eos_id: int) -> None:
    """Time every ``Qwen2ForCausalLM.generate`` call (both sides call it with keywords)."""
    from transformers import Qwen2ForCausalLM

    original = Qwen2ForCausalLM.generate

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        output = original(self, *args, **kwargs)
        seconds = time.perf_counter() - started
        stats = generation_stats(kwargs["input_ids"], kwargs["attention_mask"], output, eos_id)
        log.write("generate", seconds=seconds, **stats)
        return output

    Qwen2ForCausalLM.generate = generate


# ---------------------------------------------------------------------------- config
def compose_config(seed: int, steps: int, constrained: bool, output_root: str) -> Any:
    """``grpo_llm`` as both sides use it: one worker, no checkpoints, our hooks a plugin."""
    from embodied_rl.runtime.config import compose

    overrides = [
        f"seed={seed}",
        f"trainer.total_steps={steps}",
        "workers.num_workers=1",
        "trainer.checkpoint_every=0",
        "trainer.log_to_console=false",
        f"output_root={output_root}",
    ]
    if not constrained:
        overrides.append("models.actor.options.allowed_response_tokens=null")
    cfg = compose("grpo_llm", overrides)
    cfg.plugins = [*cfg.plugins, OURS_PLUGIN]  # our workers import it: the hooks
    return cfg


def check_mappable(cfg: Any) -> None:
    """Refuse settings whose TRL equivalent ``grpo_vs_trl_trl`` does not set up."""
    actor = cfg.algorithm.actor
    wanted = {
        "ppo_epochs": 1, "num_mini_batches": 1, "loss_agg_mode": "token-mean",
        "ratio_level": "token", "policy_loss": "ppo", "kl_coef": 0.0, "entropy_coef": 0.0,
        "dual_clip_c": None,
    }  # fmt: skip
    wrong = {k: actor.get(k, v) for k, v in wanted.items() if actor.get(k, v) != v}
    rows = cfg.data.batch_size * cfg.rollout.n
    if wrong or rows % actor.micro_batch_size or actor.temperature != cfg.rollout.temperature:
        raise SystemExit(f"grpo_llm settings without a TRL mapping here: {wrong or actor}")
