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
``RunLogger.log``, TRL ``on_log``). Ours runs through ``launch`` with this module as a plugin,
so its hooks live in the Ray worker. Update = ours' ``actor.train`` node / TRL's
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
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from statistics import fmean as mean
from typing import Any

NAME = "grpo_vs_trl"
BENCH_DIR = Path(__file__).resolve().parent
PHASE_LOG_ENV = "GRPO_VS_TRL_PHASE_LOG"  # set: importing this module as a plugin installs hooks
TARGET_SPEEDUP = 1.5
WARMUP_STEPS = 1
PER_STEP_KEYS = ("period", "cpu_period", "generate", "logprob", "update", "tokens", "reward")
LOGPROB_TOLERANCE = 1e-4
# TRL has no logits processor in its log-prob pass; a frozen lm_head bias applies the digit
# constraint in both its generate and its fused log-prob kernel. exp(-1e4) is exactly 0 in
# float32, so the distribution equals ours (-inf outside the allowed ids) bit for bit in the
# probabilities, and the entropy stays finite (0 * -1e4, not 0 * -inf).
DISALLOWED_LOGIT_BIAS = -1.0e4
SYSTEMS = {"ours": "ours (grpo_llm, 1 worker)", "trl": "TRL 1.16 GRPOTrainer"}
TABLE_COLUMNS = {  # table column -> summary key
    "s/step": "s_per_step", "CPU s/step": "cpu_s_per_step", "generate s": "generate_s",
    "logprob s": "logprob_s", "update s": "update_s", "other s": "other_s",
    "gen tok/s": "gen_tokens_per_s", "peak RSS MB (compute)": "peak_rss_compute_mb",
    "peak RSS MB (tree)": "peak_rss_tree_mb", "reward first-5": "reward_first5",
    "reward last-10": "reward_last10",
}  # fmt: skip
PHASE_COLORS = {
    "generate": "#4c72b0",
    "logprob": "#dd8452",
    "update": "#55a868",
    "other": "#8c8c8c",
}


def docstring_bullets(heading: str) -> list[str]:
    """The ``- `` bullets under ``heading`` in this module's docstring, one string each."""
    section = __doc__.split(heading, 1)[1].split("\n\n", 2)[1]
    return [" ".join(item.split()) for item in ("\n" + section).split("\n- ")[1:]]


# ------------------------------------------------------------------------------ phase hooks
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


def _hook_generate(log: PhaseLog, eos_id: int) -> None:
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


def install_ours_hooks(path: str) -> None:
    """Hooks in our worker: step boundaries, prompts drawn, generate, no-grad log-probs."""
    import torch

    from embodied_rl import keys as K
    from embodied_rl.data.batch import strings
    from embodied_rl.data.dataloader import ShardedPromptLoader
    from embodied_rl.metrics import RunLogger
    from embodied_rl.runtime.executor import PlanExecutor
    from policies.causal_lm.modeling import CausalLMPolicy
    from policies.causal_lm.tokenizer import QWEN2_EOS_ID

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
    _hook_generate(log, QWEN2_EOS_ID)


def install_trl_hooks(trainer: Any, log: PhaseLog, eos_id: int) -> None:
    """The same hooks on TRL: generate, no-grad log-probs, update, step boundaries."""
    import torch
    from transformers import TrainerCallback

    state = {"prepare": 0.0, "update": 0.0, "last_backward_end": 0.0}
    logps, prepare, train_step = (
        trainer._get_per_token_logps_and_entropies,
        trainer._prepare_inputs,
        trainer.training_step,
    )

    def timed_logps(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():  # the loss forward: part of "update"
            return logps(*args, **kwargs)
        started = time.perf_counter()
        out = logps(*args, **kwargs)
        log.write("logprob", seconds=time.perf_counter() - started)
        return out

    def timed_prepare(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = prepare(*args, **kwargs)  # generation + reward + advantages on a step's first call
        state["prepare"] += time.perf_counter() - started
        return out

    def timed_training_step(*args: Any, **kwargs: Any) -> Any:
        state["prepare"] = 0.0
        started = time.perf_counter()
        out = train_step(*args, **kwargs)
        state["last_backward_end"] = time.perf_counter()
        state["update"] += state["last_backward_end"] - started - state["prepare"]
        return out

    class StepHooks(TrainerCallback):
        def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            log.step = st.global_step

        def on_optimizer_step(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
            clip_and_step = time.perf_counter() - state["last_backward_end"]
            log.write("update", seconds=state["update"] + clip_and_step)
            state["update"] = 0.0

        def on_log(self, args: Any, st: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs is not None and "train_runtime" not in logs:  # not the end-of-run summary
                log.write("step_end", t=time.perf_counter(), cpu=time.process_time())

    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer._prepare_inputs = timed_prepare
    trainer.training_step = timed_training_step
    trainer.add_callback(StepHooks())
    _hook_generate(log, eos_id)


if __name__ != "__main__" and os.environ.get(PHASE_LOG_ENV):
    # Imported as a plugin by our workers (``plugins: [..., grpo_vs_trl]``).
    install_ours_hooks(os.environ[PHASE_LOG_ENV])


# ---------------------------------------------------------------------- shared config
def compose_config(seed: int, steps: int, constrained: bool, output_root: str) -> Any:
    """``grpo_llm`` as both sides use it: one worker, no checkpoints, this module a plugin."""
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
    cfg.plugins = [*cfg.plugins, NAME]  # our workers import this module: the hooks
    return cfg


def check_mappable(cfg: Any) -> None:
    """Refuse settings whose TRL equivalent this script does not set up."""
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


# ------------------------------------------------------------------------------ our side
def run_ours(seed: int, steps: int, constrained: bool, workdir: Path, result: Path) -> None:
    """Train with ``launch`` (the hooks load in the worker); write its metrics to ``result``."""
    import torch

    from embodied_rl.runtime.launcher import launch

    torch.set_num_threads(1)
    cfg = compose_config(seed, steps, constrained, str(workdir / "outputs"))
    check_mappable(cfg)
    run = launch(cfg, show_progress=False)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    result.write_text(json.dumps({"run_dir": str(run.run_dir), "metrics": rows}))


# ------------------------------------------------------------------------------ TRL side
def recorded_prompts(ours_phase_log: Path, steps: int, batch_size: int) -> list[dict[str, str]]:
    """The prompts and answers our run drew at steps 0..steps-1, in order.

    TRL reads them unshuffled, so both sides train on the same prompts at every step whatever
    our loader's order is.
    """
    rows: list[dict[str, str]] = []
    for line in ours_phase_log.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "prompts" and event["step"] < steps:
            rows += [{"prompt": p, "answer": a} for p, a in zip(event["prompts"], event["answers"])]
    if len(rows) != steps * batch_size:
        raise SystemExit(
            f"{ours_phase_log} holds {len(rows)} prompts, expected {steps * batch_size}"
        )
    return rows


def trl_args(cfg: Any, steps: int, seed: int, out_dir: Path) -> Any:
    """GRPOConfig with every setting taken from our composed config."""
    from trl import GRPOConfig

    from embodied_rl.runtime.models import ModelSpec

    rollout, actor = cfg.rollout, cfg.algorithm.actor
    optim = ModelSpec.from_mapping("actor", cfg.models.actor).optimizer
    rows = cfg.data.batch_size * rollout.n
    return GRPOConfig(
        output_dir=str(out_dir), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        seed=seed, max_steps=steps, shuffle_dataset=False, dataloader_num_workers=0,
        num_generations=rollout.n, max_completion_length=rollout.max_response_length,
        per_device_train_batch_size=actor.micro_batch_size,
        gradient_accumulation_steps=rows // actor.micro_batch_size,
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=0,
        beta=actor.kl_coef, epsilon=actor.clip_ratio_low, epsilon_high=actor.clip_ratio_high,
        num_iterations=actor.ppo_epochs, loss_type="dapo",
        scale_rewards="group" if cfg.algorithm.norm_by_std else "none",
        learning_rate=optim.lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=optim.betas[0], adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps, weight_decay=optim.weight_decay,
        max_grad_norm=optim.grad_clip or 0.0,
    )  # fmt: skip


def constrain_lm_head(model: Any, allowed_ids: Any) -> None:
    """Frozen lm_head bias: 0 on ``allowed_ids`` (K,), DISALLOWED_LOGIT_BIAS elsewhere."""
    import torch

    head = model.get_output_embeddings()
    bias = torch.full((head.weight.shape[0],), DISALLOWED_LOGIT_BIAS, dtype=head.weight.dtype)
    bias[allowed_ids] = 0.0
    head.bias = torch.nn.Parameter(bias, requires_grad=False)


def same_distribution(trainer: Any, policy: Any, prompts: list[str], cfg: Any) -> dict:
    """Do TRL's model and our policy sample and score the same distribution?

    Both generate from the same padded prompts with the same seed (TRL's own ``generate``
    call and generation config), and TRL's log-prob pass scores our responses.

    Returns:
        ``same_samples`` (the real response tokens are identical) and
        ``logprob_max_abs_diff`` (max |TRL - ``policy.evaluate``| over valid tokens).
    """
    import torch
    from tensordict import TensorDict

    from embodied_rl import keys as K
    from rollout.llm import left_pad_prompts

    tok, width = policy.tokenizer, cfg.rollout.max_response_length
    encoded = tok(prompts)["input_ids"]
    ids, mask = left_pad_prompts(
        encoded, range(len(prompts)), cfg.rollout.max_prompt_length, tok.pad_token_id
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # TRL's RNG stream stays as is
        torch.manual_seed(0)
        response, valid = policy.generate(ids, mask, max_new_tokens=width)
        torch.manual_seed(0)
        output = trainer.model.generate(
            input_ids=ids, attention_mask=mask, generation_config=trainer.generation_config
        )
        theirs = output[:, ids.shape[1] :]
        batch = {K.PROMPT_IDS: ids, K.PROMPT_MASK: mask, K.RESPONSE_IDS: response}
        batch = TensorDict({**batch, K.RESPONSE_MASK: valid}, batch_size=[len(prompts)])
        ours_lp, _ = policy.evaluate(batch, temperature=cfg.rollout.temperature)
        theirs_lp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([ids, response], dim=1),
            torch.cat([mask, valid.long()], dim=1),
            response.shape[1],
        )
    real = valid > 0
    # generate() stops once every row has finished: pad to R like ours does.
    theirs = torch.nn.functional.pad(theirs, (0, width - theirs.shape[1]), value=tok.pad_token_id)
    return {
        "same_samples": bool((response[real] == theirs[real]).all()),
        "logprob_max_abs_diff": float((ours_lp[real] - theirs_lp[real]).abs().max()),
    }


def arithmetic_reward(cfg: Any, log: PhaseLog) -> Any:
    """Our arithmetic ``score`` with the run's reward options, in TRL's reward-function form."""
    from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, score

    options = ArithmeticRewardConfig(**cfg.reward)
    weight, scale = options.partial_weight, options.partial_scale

    def arithmetic(prompts: list, completions: list, answer: list, **_: Any) -> list[float]:
        rewards = [
            score(c, a, partial_weight=weight, partial_scale=scale)
            for c, a in zip(completions, answer)
        ]
        log.write("reward", mean=sum(rewards) / len(rewards), count=len(rewards))
        return rewards

    return arithmetic


def build_trl_trainer(cfg: Any, rows: list[dict], seed: int, workdir: Path, log: PhaseLog) -> tuple:
    """Our policy (built as the worker builds it) and a GRPOTrainer on a copy of its model."""
    import copy

    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from embodied_rl.runtime.models import ModelSpec
    from policies.causal_lm.modeling import build_causal_lm

    spec = ModelSpec.from_mapping("actor", cfg.models.actor)
    policy = build_causal_lm(spec.options, torch.device("cpu"))
    model = copy.deepcopy(policy.model).train()
    if policy.allowed_ids is not None:
        constrain_lm_head(model, policy.allowed_ids)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arithmetic_reward(cfg, log),
        args=trl_args(cfg, int(cfg.trainer.total_steps), seed, workdir / "trl"),
        train_dataset=Dataset.from_list(rows),
        processing_class=policy.tokenizer,
    )
    return trainer, policy


def run_trl(
    seed: int, steps: int, constrained: bool, workdir: Path, paths: dict[str, Path]
) -> None:
    """Train with GRPOTrainer on our run's prompts (hooks in-process); write logs and checks."""
    import torch

    torch.set_num_threads(1)
    cfg = compose_config(seed, steps, constrained, str(workdir / "outputs"))
    check_mappable(cfg)
    log = PhaseLog(paths["phase_log"])
    rows = recorded_prompts(paths["prompts_from"], steps, cfg.data.batch_size)
    trainer, policy = build_trl_trainer(cfg, rows, seed, workdir, log)
    checks = setup_checks(trainer, policy, rows, cfg)
    install_trl_hooks(trainer, log, policy.tokenizer.eos_token_id)
    trainer.train()
    checks.update(optimizer_checks(trainer, policy, cfg))
    history = [h for h in trainer.state.log_history if "train_runtime" not in h]
    paths["result"].write_text(json.dumps({"log_history": history, "checks": checks}))


def optimizer_checks(trainer: Any, policy: Any, cfg: Any) -> dict[str, Any]:
    """TRL's AdamW settings and trained parameters against ours (all of the policy's)."""
    from embodied_rl.runtime.models import ModelSpec

    groups = trainer.optimizer.param_groups
    facts = {
        "lr": groups[0]["lr"],
        "betas": list(groups[0]["betas"]),
        "eps": groups[0]["eps"],
        "weight_decay": sorted({g["weight_decay"] for g in groups}),
        "trained_params": sum(p.numel() for g in groups for p in g["params"]),
    }
    ours = ModelSpec.from_mapping("actor", cfg.models.actor).optimizer
    wanted = {
        "lr": ours.lr,
        "betas": list(ours.betas),
        "eps": ours.eps,
        "weight_decay": [ours.weight_decay],
        "trained_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
    }
    return {"optimizer": facts, "optimizer_matches": facts == wanted}


def setup_checks(trainer: Any, policy: Any, rows: list[dict], cfg: Any) -> dict[str, Any]:
    """Equal start weights, equal log-probs, prompts within max_prompt_length."""
    ours = policy.model.state_dict()
    theirs = trainer.model.state_dict()
    equal = all(bool((ours[k] == theirs[k]).all()) for k in ours)
    prompts = [r["prompt"] for r in rows[: cfg.data.batch_size]]
    lengths = [len(ids) for ids in policy.tokenizer([r["prompt"] for r in rows])["input_ids"]]
    return {
        "equal_initial_weights": equal and set(theirs) - set(ours) <= {"lm_head.bias"},
        **same_distribution(trainer, policy, prompts, cfg),
        "max_prompt_tokens": max(lengths),
        "max_prompt_length": cfg.rollout.max_prompt_length,
        "expected_rows": cfg.data.batch_size * cfg.rollout.n,
        "allowed_ids": None if policy.allowed_ids is None else policy.allowed_ids.tolist(),
    }


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
        from common import MB

        root = psutil.Process(self.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                rss = proc.memory_info().rss / MB
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


def plugin_dir(workdir: Path) -> Path:
    """A folder holding only this module, for ``PYTHONPATH``.

    ``scripts/bench`` itself cannot go on the path: its ``simulators.py`` would shadow our
    ``simulators`` package in the workers.
    """
    folder = workdir / "plugin"
    folder.mkdir(exist_ok=True)
    link = folder / f"{NAME}.py"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve())
    return folder


def child_env(side: str, phase_log: Path, workdir: Path) -> dict[str, str]:
    """Offline, one thread; ours gets the plugin on its path and the phase-log location."""
    env = dict(os.environ)
    path = [str(plugin_dir(workdir)), env.get("PYTHONPATH", "")]
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
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(side, phase_log, workdir)
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


# ---------------------------------------------------------------------- parent: analysis
def step_rows(events: list[dict], steps: int) -> list[dict[str, Any]]:
    """Per-step sums of one run's phase events."""
    rows = [
        {"generate": 0.0, "logprob": 0.0, "update": 0.0, "tokens": 0, "rows": 0, "digests": []}
        | {"token_ids": set(), "end": None, "reward": None, "reward_count": None}
        for _ in range(steps)
    ]
    for event in events:
        if not 0 <= event["step"] < steps:
            raise SystemExit(f"phase event outside the training steps: {event}")
        row, kind = rows[event["step"]], event["event"]
        if kind == "generate":
            row["generate"] += event["seconds"]
            row["tokens"] += event["tokens"]
            row["rows"] += event["rows"]
            row["digests"] += event["prompt_digests"]
            row["token_ids"] |= set(event["token_ids"])
        elif kind in ("logprob", "update"):
            row[kind] += event["seconds"]
        elif kind == "reward":
            row["reward"], row["reward_count"] = event["mean"], event["count"]
        elif kind == "step_end":
            row["end"], row["cpu"] = event["t"], event["cpu"]
    return rows


def run_steps(side: str, run: dict, steps: int) -> list[dict[str, Any]]:
    """Per-step phases of one run, completed from the system's own logs."""
    rows = step_rows(run["events"], steps)
    if side == "ours":
        metrics = run["result"]["metrics"]
        for row, m in zip(rows, metrics):
            row["update"], row["reward"] = m["time/train"], m["reward/mean"]
            row["time_step"] = m["time/step"]  # the walk only, without metric logging
            row["reported_tokens"] = m["rollout/response_length"] * row["rows"]
        logged = len(metrics)
    else:
        history = run["result"]["log_history"]
        for row, h in zip(rows, history):
            row["reported_tokens"] = h["completions/mean_length"] * row["rows"]
            row["reported_reward"] = h["reward"]
        logged = len(history)
    if logged != steps or any(row["end"] is None for row in rows):
        raise SystemExit(f"{side} seed {run['seed']}: {logged} logged steps, expected {steps}")
    for k in range(1, steps):
        rows[k]["period"] = rows[k]["end"] - rows[k - 1]["end"]
        rows[k]["cpu_period"] = rows[k]["cpu"] - rows[k - 1]["cpu"]
    return rows


def run_checks(side: str, rows: list[dict], expected_rows: int, allowed: set | None) -> dict:
    """Each run: full batches, hooks agree with the system's own logs, constraint held."""
    checks = {
        "rows_per_step": all(r["rows"] == expected_rows for r in rows),
        "tokens_match_own_logs": all(abs(r["tokens"] - r["reported_tokens"]) < 0.5 for r in rows),
        "allowed_tokens_only": allowed is None or all(r["token_ids"] <= allowed for r in rows),
    }
    if side == "trl":
        checks["rewards_match_own_logs"] = all(
            r["reward_count"] == expected_rows and abs(r["reward"] - r["reported_reward"]) < 1e-6
            for r in rows
        )
    return checks


def summarize(per_seed: list[list[dict]], runs: list[dict]) -> dict[str, Any]:
    """Means over the measured steps of all seeds; the mean reward curve over seeds."""
    measured = [r for rows in per_seed for r in rows[WARMUP_STEPS:]]
    parts = {
        key: mean(r[key] for r in measured)
        for key in ("period", "cpu_period", "generate", "logprob", "update")
    }
    curves = [[r["reward"] for r in rows] for rows in per_seed]
    curve = [mean(values) for values in zip(*curves)]
    summary = {
        "s_per_step": parts["period"],
        "cpu_s_per_step": parts["cpu_period"],
        "generate_s": parts["generate"],
        "logprob_s": parts["logprob"],
        "update_s": parts["update"],
        "other_s": parts["period"] - parts["generate"] - parts["logprob"] - parts["update"],
        "gen_tokens_per_s": sum(r["tokens"] for r in measured)
        / sum(r["generate"] for r in measured),
        "gen_tokens_per_step": mean(r["tokens"] for r in measured),
        "peak_rss_compute_mb": max(run["peak_rss_compute_mb"] for run in runs),
        "peak_rss_tree_mb": max(run["peak_rss_tree_mb"] for run in runs),
        "reward_first5": mean(curve[:5]),
        "reward_last10": mean(curve[-10:]),
        "reward_curve": curve,
        "reward_curves_per_seed": curves,
        "per_step_per_seed": [
            [{k: r[k] for k in PER_STEP_KEYS if k in r} for r in rows] for rows in per_seed
        ],
        "wall_s_per_run": [run["wall_s"] for run in runs],
    }
    if "time_step" in measured[0]:
        summary["metrics_time_step_s"] = mean(r["time_step"] for r in measured)
    return summary


def pair_checks(ours_rows: list[dict], trl_rows: list[dict], setup: dict) -> dict[str, bool]:
    """One seed: same prompts every step, and TRL's set-up checks (weights, distribution...)."""
    same_prompts = all(
        sorted(a["digests"]) == sorted(b["digests"]) for a, b in zip(ours_rows, trl_rows)
    )
    return {
        "same_prompts_every_step": same_prompts,
        "equal_initial_weights": setup["equal_initial_weights"],
        "same_samples_same_seed": setup["same_samples"],
        "logprobs_equal": setup["logprob_max_abs_diff"] < LOGPROB_TOLERANCE,
        "prompts_fit": setup["max_prompt_tokens"] <= setup["max_prompt_length"],
        "optimizer_matches": setup["optimizer_matches"],
    }


def analyse(runs: dict[str, list[dict]], steps: int) -> dict[str, Any]:
    """Summaries per system, targets, and every correctness check."""
    trl_setup = [run["result"]["checks"] for run in runs["trl"]]
    expected_rows = trl_setup[0]["expected_rows"]
    allowed = set(trl_setup[0]["allowed_ids"]) if trl_setup[0]["allowed_ids"] else None
    rows = {side: [run_steps(side, run, steps) for run in runs[side]] for side in SYSTEMS}
    checks: dict[str, Any] = {}
    for side in SYSTEMS:
        for run, seed_rows in zip(runs[side], rows[side]):
            for name, ok in run_checks(side, seed_rows, expected_rows, allowed).items():
                checks[f"{side}_seed{run['seed']}_{name}"] = ok
    for ours_rows, trl_rows, run in zip(rows["ours"], rows["trl"], runs["trl"]):
        for name, ok in pair_checks(ours_rows, trl_rows, run["result"]["checks"]).items():
            checks[f"seed{run['seed']}_{name}"] = ok
    summary = {side: summarize(rows[side], runs[side]) for side in SYSTEMS}
    speedup = summary["trl"]["s_per_step"] / summary["ours"]["s_per_step"]
    targets = {
        "speedup": speedup,
        "speedup_met": speedup >= TARGET_SPEEDUP,
        "reward_last10_met": summary["ours"]["reward_last10"] >= summary["trl"]["reward_last10"],
    }
    details = {"logprob_max_abs_diff": [c["logprob_max_abs_diff"] for c in trl_setup]}
    details["trl_optimizer"] = trl_setup[0]["optimizer"]
    return {"summary": summary, "targets": targets, "checks": checks, "details": details}


# ---------------------------------------------------------------------- parent: report
def tables(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per-system numbers and the target table (with its met column)."""
    s, t = report["summary"], report["targets"]
    systems = [
        {"system": SYSTEMS[side], **{column: v[key] for column, key in TABLE_COLUMNS.items()}}
        for side, v in s.items()
    ]
    targets = [
        {
            "target": f"ours >= {TARGET_SPEEDUP}x faster per step",
            "ours": s["ours"]["s_per_step"],
            "TRL": s["trl"]["s_per_step"],
            "ratio": f"{t['speedup']:.2f}x",
            "met": "yes" if t["speedup_met"] else "NO",
        },
        {
            "target": "ours reward last-10 >= TRL's",
            "ours": s["ours"]["reward_last10"],
            "TRL": s["trl"]["reward_last10"],
            "ratio": f"{s['ours']['reward_last10'] - s['trl']['reward_last10']:+.3f}",
            "met": "yes" if t["reward_last10_met"] else "NO",
        },
    ]
    return {"systems": systems, "targets": targets}


def plot(report: dict[str, Any], out_dir: Path) -> None:
    """Reward curves (seeds thin, mean thick) and the stacked time split per step."""
    import common

    fig, (rewards, times) = common.new_figure(2, width=5.6, height=3.8)
    colors = {"ours": "tab:blue", "trl": "tab:orange"}
    for side, values in report["summary"].items():
        for curve in values["reward_curves_per_seed"]:
            rewards.plot(curve, color=colors[side], alpha=0.35, lw=0.8)
        rewards.plot(values["reward_curve"], color=colors[side], lw=2, label=SYSTEMS[side])
    rewards.set(xlabel="step", ylabel="reward/mean", title="Reward per step (thin: seeds)")
    rewards.xaxis.get_major_locator().set_params(integer=True)
    rewards.legend(fontsize=8)
    bottom = [0.0, 0.0]
    for phase, color in PHASE_COLORS.items():
        heights = [max(report["summary"][side][f"{phase}_s"], 0.0) for side in SYSTEMS]
        times.bar(range(2), heights, bottom=bottom, color=color, label=phase, width=0.55)
        bottom = [b + h for b, h in zip(bottom, heights)]
    speedup, met = report["targets"]["speedup"], report["targets"]["speedup_met"]
    times.set_xticks(range(2), ["ours", "TRL"])
    verdict = "met" if met else "NOT met"
    title = f"Step time: TRL / ours = {speedup:.2f} (target >= {TARGET_SPEEDUP}: {verdict})"
    times.set(ylabel="seconds per step", title=title)
    times.legend(fontsize=8)
    common.save_figure(fig, NAME, out_dir)


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
    workdir, result = Path(args.workdir), Path(args.result)
    if args.child == "ours":
        run_ours(args.seed, args.steps, not args.unconstrained, workdir, result)
    else:
        paths = {"result": result, "phase_log": Path(args.phase_log)}
        paths["prompts_from"] = Path(args.prompts_from)
        run_trl(args.seed, args.steps, not args.unconstrained, workdir, paths)


def main() -> None:
    args = parse_args()
    if args.child:
        # Run as a script, this folder is sys.path[0]; its simulators.py would shadow ours.
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]
        run_child_mode(args)
        return
    from importlib.metadata import version

    import common

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
