"""LLM generation of ``model_scale``: HF (our rollout's path) vs vLLM on the same Qwen2 dir.

``run_llm`` saves a random-init Qwen2 of one of :data:`LLM_SIZES` with our Qwen2.5 tokenizer,
times ``CausalLMPolicy.generate`` on it here, then the same workload through vLLM's offline
API in a subprocess: ``model_scale.py --vllm-worker SPEC`` run by ``--vllm-python``, which
calls :func:`vllm_worker` (possibly in another venv, so nothing here imports project code at
import time). ``model_scale.py`` holds the CLI, the tables and the JSON; its docstring says
what is measured and checked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_scale_measure import Phase, count_params, free_memory, guarded, measure

QWEN25_05B_PUBLISHED_PARAMS = 494_032_768
VLLM_TIMEOUT_S = 1200
# The script whose --vllm-worker flag runs vllm_worker (the subprocess runs it by file path).
ENTRY_SCRIPT = Path(__file__).resolve().with_name("model_scale.py")


# ------------------------------------------------------------------------------------ sizes
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
class LLMSize:
    """A Qwen2 shape and its generation workload: B prompts x n samples x R new tokens."""

    config: dict[str, Any]
    prompts: int
    samples_per_prompt: int
    new_tokens: int


LLM_SIZES = {  # head dims 32 / 64 / 64: vLLM's attention kernels take a fixed set of sizes
    "tiny": LLMSize(qwen2_config(128, 256, 2, 4), 2, 2, 16),
    "small": LLMSize(qwen2_config(256, 1024, 4, 4), 4, 4, 64),
    "real": LLMSize(qwen2_config(896, 4864, 24, 14), 32, 8, 256),
}


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
    command = [args.vllm_python, str(ENTRY_SCRIPT), "--vllm-worker", str(spec_file)]
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
