"""TRL's side of ``grpo_vs_trl``: ``GRPOTrainer`` set up from our composed config, and its hooks.

``run_trl`` trains on the prompts our run drew (read from its phase log), with the hooks in
this process, after checking that TRL starts from our weights and samples and scores our
policy's distribution. ``grpo_vs_trl.py``'s docstring lists every setting mapped and every
mismatch that remains.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from grpo_vs_trl_setup import PhaseLog, check_mappable, compose_config, hook_generate

# TRL has no logits processor in its log-prob pass; a frozen lm_head bias applies the digit
# constraint in both its generate and its fused log-prob kernel. exp(-1e4) is exactly 0 in
# float32, so the distribution equals ours (-inf outside the allowed ids) bit for bit in the
# probabilities, and the entropy stays finite (0 * -1e4, not 0 * -inf).
DISALLOWED_LOGIT_BIAS = -1.0e4


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
    hook_generate(log, eos_id)


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
