"""LLM rollout node: n sampled responses per prompt, with their old log-probabilities.

The policy comes from ``ctx.models[config.model]`` and is used only through its interface:
``tokenizer``, ``generate(prompt_ids, prompt_mask, ...)`` and ``evaluate(batch, temperature)``
(see ``policies/causal_lm``). Nothing here imports a policy package.

Shapes: ``B`` input prompts, ``N = B * n`` output samples, ``P`` = ``max_prompt_length``
(left-padded), ``R`` = ``max_response_length`` (right-padded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, concat, repeat_interleave, strings
from embodied_rl.devices import device_spec
from embodied_rl.runtime.fsdp import gathered_for_inference
from embodied_rl.runtime.models import adam_updates_done
from rollout.vllm_engine import VLLMEngine, VLLMOptions

BACKENDS = ("hf", "vllm")
VLLM_STATE = "vllm_engine"


@dataclass
class LLMRolloutConfig:
    """Options of the ``rollout.llm`` node.

    Attributes:
        model: name of the policy in ``ctx.models``.
        n: responses sampled per prompt (the GRPO group size).
        max_prompt_length: P; prompts are left-padded to exactly this many tokens.
        max_response_length: R; responses are right-padded to exactly this many tokens.
        temperature: sampling temperature (also used for the old log-probs).
        top_p: nucleus sampling mass in (0, 1].
        do_sample: sample (True) or decode greedily (False, e.g. for evaluation).
        backend: ``hf`` (transformers ``generate`` on the policy itself) or ``vllm`` (a vLLM
            engine in this worker that gets the policy's weights pushed after every update;
            see ``rollout/vllm_engine.py``). The old log-probs come from the policy either way;
            with vLLM, the engine's own log-probs of the same tokens give the mismatch
            metrics ``rollout/logprob_mismatch`` (mean absolute difference per token) and
            ``rollout/logprob_mismatch_max``.
        micro_batch_size: samples per generate/log-prob call, bounding the memory of the
            (micro_batch, R, V) logits.
        vllm: engine options (:class:`VLLMOptions`), used with ``backend: vllm``.
    """

    model: str = "actor"
    n: int = 4
    max_prompt_length: int = 32
    max_response_length: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    backend: str = "hf"
    micro_batch_size: int = 64
    vllm: VLLMOptions = field(default_factory=VLLMOptions)

    def __post_init__(self) -> None:
        check_rollout_options(
            self, ("n", "max_prompt_length", "max_response_length", "micro_batch_size")
        )


def check_rollout_options(cfg: Any, positive: Sequence[str]) -> None:
    """Checks shared by the LLM rollout configs: the fields named in ``positive`` are >= 1,
    and the backend, sampling and ``vllm`` options are valid (a ``vllm`` dict becomes
    :class:`VLLMOptions`)."""
    if isinstance(cfg.vllm, dict):
        unknown = sorted(set(cfg.vllm) - set(VLLMOptions.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"rollout.vllm: unknown key(s) {unknown}; valid keys: "
                f"{sorted(VLLMOptions.__dataclass_fields__)}"
            )
        cfg.vllm = VLLMOptions(**cfg.vllm)
    if cfg.backend not in BACKENDS:
        raise ValueError(f"unknown rollout backend {cfg.backend!r}; valid: {list(BACKENDS)}")
    for name in positive:
        check_range(f"rollout {name}", getattr(cfg, name), 1)
    fix = "; set do_sample: false for greedy decoding"
    check_range("rollout temperature", cfg.temperature, 0, low_open=True, fix=fix)
    check_range("rollout top_p", cfg.top_p, 0, 1, low_open=True)


def left_pad_prompts(
    token_lists: Sequence[Sequence[int]],
    sample_ids: Sequence[int],
    length: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad tokenised prompts to exactly ``length`` tokens.

    Args:
        token_lists: B lists of token ids.
        sample_ids: B sample ids, named in errors.
        length: P.
        pad_id: id written into padding positions.

    Returns:
        ids: (B, P) int64 and mask: (B, P) int64 (1 = real token).
    """
    ids = torch.full((len(token_lists), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_lists), length), dtype=torch.long)
    for row, (tokens, sample_id) in enumerate(zip(token_lists, sample_ids)):
        if not tokens:
            raise ValueError(f"prompt of sample {sample_id} is empty; every prompt needs text")
        if len(tokens) > length:
            raise ValueError(
                f"prompt of sample {sample_id} has {len(tokens)} tokens, more than "
                f"max_prompt_length={length}; raise the rollout node's max_prompt_length or "
                "shorten the prompt"
            )
        ids[row, length - len(tokens) :] = torch.as_tensor(tokens, dtype=torch.long)
        mask[row, length - len(tokens) :] = 1
    return ids, mask


def set_strings(batch: TensorDict, key: str, values: list[str]) -> None:
    # An empty Python list would be stored as an empty float tensor; keep it a string field.
    batch[key] = values if values else NonTensorStack.from_list([])


def empty_rollout_output(batch: TensorDict, cfg: LLMRolloutConfig) -> TensorDict:
    """A zero-sample batch with every key the node writes (shapes (0, P), (0, R), ...)."""
    out = repeat_interleave(batch, cfg.n)
    prompt = torch.zeros(0, cfg.max_prompt_length, dtype=torch.long)
    response = torch.zeros(0, cfg.max_response_length, dtype=torch.long)
    out[K.PROMPT_IDS], out[K.PROMPT_MASK] = prompt, prompt.clone()
    out[K.RESPONSE_IDS] = response
    out[K.RESPONSE_MASK] = response.float()
    out[K.OLD_LOGPROBS] = response.float()
    out[K.GROUP_ID] = torch.zeros(0, dtype=torch.long)
    out[K.SAMPLE_ID] = torch.zeros(0, dtype=torch.long)
    set_strings(out, K.RESPONSE_TEXT, [])
    return out


def _generate(policy: Any, samples: TensorDict, cfg: LLMRolloutConfig) -> TensorDict:
    """Responses for ``samples`` with HF ``generate`` in micro-batches; returns a new batch
    with PROMPT_IDS/PROMPT_MASK (N, P) and RESPONSE_IDS/RESPONSE_MASK (N, R) on the CPU."""
    chunks = []
    for start in range(0, batch_len(samples), cfg.micro_batch_size):
        part = samples[start : start + cfg.micro_batch_size]
        response_ids, response_mask = policy.generate(
            part[K.PROMPT_IDS],
            part[K.PROMPT_MASK],
            max_new_tokens=cfg.max_response_length,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            do_sample=cfg.do_sample,
        )
        chunks.append(_responses(part, response_ids.cpu(), response_mask.cpu()))
    return concat(chunks)


def _responses(
    samples: TensorDict, response_ids: torch.Tensor, response_mask: torch.Tensor
) -> TensorDict:
    return TensorDict(
        {
            K.PROMPT_IDS: samples[K.PROMPT_IDS],
            K.PROMPT_MASK: samples[K.PROMPT_MASK],
            K.RESPONSE_IDS: response_ids,
            K.RESPONSE_MASK: response_mask,
        },
        batch_size=[batch_len(samples)],
    )


def score_responses(policy: Any, generated: TensorDict, cfg: LLMRolloutConfig) -> None:
    """Write OLD_LOGPROBS (N, R) float32: the policy's log-probs of the responses, computed
    in micro-batches of ``cfg.micro_batch_size`` samples."""
    chunks = []
    with torch.no_grad():
        for start in range(0, batch_len(generated), cfg.micro_batch_size):
            part = generated[start : start + cfg.micro_batch_size]
            logprobs, _ = policy.evaluate(part, temperature=cfg.temperature)
            chunks.append(logprobs.float().cpu())
    generated[K.OLD_LOGPROBS] = torch.cat(chunks)


def _generate_vllm(
    ctx: Any, policy: Any, samples: TensorDict, prompts: list[list[int]], cfg: LLMRolloutConfig
) -> tuple[TensorDict, torch.Tensor]:
    """Responses from this worker's vLLM engine, after pushing the trainer's weights to it.

    Args:
        samples: the N = B * n output rows with PROMPT_IDS/PROMPT_MASK, grouped by prompt.
        prompts: the B prompts' token ids without padding.

    Returns:
        (the batch as :func:`_generate` returns it, the engine's log-probs (N, R) float32
        of the sampled tokens, 0 after the response).
    """
    engine: VLLMEngine = ctx.state[VLLM_STATE].engine
    version = weights_version(ctx, cfg.model)
    if engine.synced_version != version:
        seconds = engine.push_weights(policy.inference_weights(), version)
        ctx.metrics.log("time/rollout/weight_sync", seconds, reduce="max")
    out = engine.generate(
        prompts,
        n=cfg.n,
        max_new_tokens=cfg.max_response_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        do_sample=cfg.do_sample,
        stop_token_ids=policy.eos_ids.tolist(),
        allowed_token_ids=None if policy.allowed_ids is None else policy.allowed_ids.tolist(),
        seed=ctx.seed("generate"),
    )
    engine.sleep()  # the trainer gets the memory back until the next rollout
    rows, width = len(out.token_ids), cfg.max_response_length
    response_ids = torch.full((rows, width), policy.pad_token_id, dtype=torch.long)
    engine_logprobs = torch.zeros(rows, width)
    for row, (ids, logprobs) in enumerate(zip(out.token_ids, out.logprobs)):
        response_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        engine_logprobs[row, : len(logprobs)] = torch.as_tensor(logprobs)
    response_mask = policy.response_mask(response_ids)
    return _responses(samples, response_ids, response_mask), engine_logprobs * response_mask


def weights_version(ctx: Any, model: str) -> int:
    """Optimizer steps taken by ``model`` (0 for a frozen one): the weights change exactly
    when this does, and a restored checkpoint restores it too."""
    if not ctx.models.specs[model].trainable:
        return 0
    return adam_updates_done(ctx.models.optimizer(model))


def _log_mismatch(ctx: Any, engine_logprobs: torch.Tensor, generated: TensorDict) -> None:
    """``rollout/logprob_mismatch``: mean |engine - trainer| log-prob per response token, and
    its maximum; both 0 for identical numerics. Large values mean the rollout samples from a
    different distribution than the one the loss assumes (dtype, kernels, stale weights)."""
    mask = generated[K.RESPONSE_MASK] > 0
    tokens = int(mask.sum())
    if tokens == 0:
        return
    gap = (engine_logprobs - generated[K.OLD_LOGPROBS]).abs()[mask]
    ctx.metrics.log("rollout/logprob_mismatch", gap.mean(), weight=tokens)
    ctx.metrics.log("rollout/logprob_mismatch_max", gap.max(), reduce="max")


def _decode(tokenizer: Any, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Text of the valid tokens of each response (special tokens such as EOS skipped)."""
    lengths = response_mask.sum(dim=1).long().tolist()
    rows = [ids[:length] for ids, length in zip(response_ids.tolist(), lengths)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


# What an LLM rollout writes for the trainer (rollout.llm, rollout.llm_multiturn).
LLM_ROLLOUT_WRITES = (
    K.PROMPT_IDS,
    K.PROMPT_MASK,
    K.RESPONSE_IDS,
    K.RESPONSE_MASK,
    K.RESPONSE_TEXT,
    K.OLD_LOGPROBS,
    K.GROUP_ID,
    K.SAMPLE_ID,
)


@register_node(
    "rollout.llm",
    reads=(K.PROMPT_TEXT, K.SAMPLE_ID),
    writes=LLM_ROLLOUT_WRITES,
    config=LLMRolloutConfig,
    batch_factor=lambda c: c.n,
    setup=lambda ctx: start_engine(ctx),
)
def llm_rollout(ctx: Any, batch: TensorDict) -> TensorDict:
    """Sample ``n`` responses for every prompt of ``batch``.

    Output rows are grouped by prompt (``[a, a, ..., b, b, ...]``); every input field (e.g.
    ANSWER_TEXT) is repeated with its prompt. GROUP_ID is the prompt's SAMPLE_ID and the new
    SAMPLE_ID is ``prompt_sample_id * n + j``. Sampling is seeded from ``ctx.seed("generate")``
    so a step is reproducible. Output tensors are on the CPU.

    Args:
        ctx: the node context (``ctx.node_config`` is an :class:`LLMRolloutConfig`).
        batch: B prompts with PROMPT_TEXT and SAMPLE_ID (B,).

    Returns:
        N = B * n samples with PROMPT_IDS/PROMPT_MASK (N, P), RESPONSE_IDS (N, R),
        RESPONSE_MASK/OLD_LOGPROBS (N, R) float32, RESPONSE_TEXT, GROUP_ID/SAMPLE_ID (N,).
    """
    cfg: LLMRolloutConfig = ctx.node_config
    if batch_len(batch) == 0:
        return empty_rollout_output(batch, cfg)
    policy = ctx.models[cfg.model]
    tokenizer = policy.tokenizer
    prompt_sample_ids = batch[K.SAMPLE_ID].long()
    encoded = tokenizer(strings(batch, K.PROMPT_TEXT))["input_ids"]
    prompt_ids, prompt_mask = left_pad_prompts(
        encoded, prompt_sample_ids.tolist(), cfg.max_prompt_length, tokenizer.pad_token_id
    )

    out = repeat_interleave(batch, cfg.n)
    out[K.PROMPT_IDS] = prompt_ids.repeat_interleave(cfg.n, dim=0)
    out[K.PROMPT_MASK] = prompt_mask.repeat_interleave(cfg.n, dim=0)
    respond(ctx, policy, out, encoded, cfg)
    out[K.GROUP_ID] = prompt_sample_ids.repeat_interleave(cfg.n)
    out[K.SAMPLE_ID] = out[K.GROUP_ID] * cfg.n + torch.arange(cfg.n).repeat(batch_len(batch))
    return out


def respond(
    ctx: Any, policy: Any, out: TensorDict, prompts: list[list[int]], cfg: LLMRolloutConfig
) -> None:
    """Sample one response per row of ``out`` and score it with the policy.

    Args:
        out: N rows with PROMPT_IDS/PROMPT_MASK (N, P), each prompt's ``cfg.n`` rows
            consecutive; gets RESPONSE_IDS (N, R), RESPONSE_MASK/OLD_LOGPROBS (N, R) float32
            and RESPONSE_TEXT.
        prompts: the N / n distinct prompts' token ids without padding (vLLM's input).
    """
    # Sampling is reproducible from the step seed; the CPU RNG is restored afterwards so
    # that this node does not shift the random draws of nodes that run after it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed("generate"))
        if cfg.backend == "vllm":
            # Before gathering: pushing a sharded policy gathers it tensor by tensor.
            generated, engine_logprobs = _generate_vllm(ctx, policy, out, prompts, cfg)
            with gathered_for_inference(policy):
                score_responses(policy, generated, cfg)
        else:
            # A sharded (FSDP) policy is gathered once, so the ranks' generations may stop
            # at different lengths without leaving a collective unmatched.
            with gathered_for_inference(policy):
                generated = _generate(policy, out, cfg)
                score_responses(policy, generated, cfg)
    if cfg.backend == "vllm":
        _log_mismatch(ctx, engine_logprobs, generated)
    for key in (K.RESPONSE_IDS, K.RESPONSE_MASK, K.OLD_LOGPROBS):
        out[key] = generated[key]
    set_strings(
        out,
        K.RESPONSE_TEXT,
        _decode(policy.tokenizer, generated[K.RESPONSE_IDS], generated[K.RESPONSE_MASK]),
    )
    _log_metrics(ctx, generated[K.RESPONSE_MASK])


class _EngineHandle:
    """Node state that owns this worker's engine; the worker closes it before it exits."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    def close(self) -> None:
        self.engine.close()


# One engine per policy in this worker process, shared by every rollout node that samples
# from that policy (e.g. the training and the evaluation DAG).
_ENGINES: dict[str, VLLMEngine] = {}


def start_engine(ctx: Any) -> None:
    """Setup of ``rollout.llm``: start the vLLM engine once per worker (backend vllm only)."""
    cfg: LLMRolloutConfig = ctx.node_config
    if cfg.backend != "vllm" or VLLM_STATE in ctx.state:
        return
    if cfg.model in _ENGINES and _ENGINES[cfg.model].llm is not None:
        ctx.state[VLLM_STATE] = _EngineHandle(_ENGINES[cfg.model])
        return
    policy = ctx.models[cfg.model]
    engine = _ENGINES[cfg.model] = VLLMEngine(
        policy,
        cfg.vllm,
        max_model_len=cfg.max_prompt_length + cfg.max_response_length,
        seed=ctx.seed("vllm_engine"),
        dtype=_engine_dtype(ctx, cfg.vllm.dtype, policy.inference_dtype),
        worker_index=ctx.rank,
    )
    ctx.state[VLLM_STATE] = _EngineHandle(engine)
    ctx.metrics.log("time/rollout/engine_start", engine.start_s, reduce="max")


def _engine_dtype(ctx: Any, choice: str, trainer_dtype: str) -> str:
    """``auto``: the device's mixed-precision dtype (bf16 on accelerators), else the trainer's
    parameter dtype; anything else as configured."""
    if choice != "auto":
        return choice
    autocast = device_spec(ctx.device.type).autocast_dtype
    return trainer_dtype if autocast is None else str(autocast).removeprefix("torch.")


def _log_metrics(ctx: Any, response_mask: torch.Tensor) -> None:
    """Mean response length in tokens, and the share of responses that filled all R tokens."""
    samples = response_mask.shape[0]
    lengths = response_mask.sum(dim=1)
    ctx.metrics.log("rollout/response_length", lengths.mean(), weight=samples)
    full = (lengths >= response_mask.shape[1]).float().mean()
    ctx.metrics.log("rollout/response_clip_ratio", full, weight=samples)
