"""OpenVLA-OFT step timing of ``model_scale``: the rollout step and the update step.

``run_oft`` builds the policy at one of :data:`OFT_SIZES` through the policy registry (so
``ModelStore`` owns it and its optimizer, as in training) and times

- the *rollout step*: one ``policy.act`` on B observations, exactly as ``rollout.env`` calls
  it;
- the *update step*: the trainer's own ``actor.train`` node (looked up in ``NODE_TYPES``) on
  trajectories holding the same B observations.

``model_scale.py`` holds the CLI, the tables and the JSON; its docstring says what is
measured and checked. Only the standard library at import time (see ``model_scale_measure``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_scale_measure import Phase, count_params, guarded, measure, synchronize

TEMPERATURE = 1.6  # SRPO's rollout temperature (configs/srpo_libero.yaml)
LLAMA2_VOCAB = 32000  # Llama-2's tokenizer ids; OpenVLA pads its LM to 32064 rows
OPENVLA_PUBLISHED_PARAMS = 7_541_237_184
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


TINY_TOWERS = ("tiny_dinov2_reg4", "tiny_siglip")  # policies/openvla/vision.py TINY_VITS
REAL_TOWERS = ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224")
OFT_SIZES = {
    "tiny": OFTSize(TINY_TOWERS, 32, llama_text_config(64, 128, 2, 4), 2, 2),
    "small": OFTSize(TINY_TOWERS, 112, llama_text_config(512, 1376, 8, 8), 2, 4),
    "real": OFTSize(REAL_TOWERS, 224, llama_text_config(4096, 11008, 32, 32), 2, 4),
}


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

    from policies.causal_lm.qwen_vocab import ENDOFTEXT
    from policies.causal_lm.tokenizer import build_qwen2_tokenizer

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
    exactly as in training. Mirrors ``policies.openvla.builders.build_policy``'s preset branch
    (seeded init, dtype, gradient checkpointing) with another architecture; the init runs
    on the target device (a 7.5B float32 init on the CPU would take minutes and 30 GB).
    """
    import torch

    from embodied_rl.registry import POLICIES
    from policies.openvla.configuration import VLAArchitecture
    from policies.openvla.prismatic import PrismaticVLA
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


def actor_train() -> Any:
    """The trainer's ``actor.train`` node type (``NodeType``: ``fn``, ``build_config``...)."""
    import embodied_rl.nodes  # noqa: F401  (registers the core node types)
    from embodied_rl.registry import NODE_TYPES

    return NODE_TYPES.get("actor.train")


def train_context(node: Any, store: Any, trajectories: int, device: Any) -> Any:
    """A single-worker ``NodeContext`` for ``node`` (``actor.train``, SRPO's LIBERO settings).

    The node's set-up runs once, as a DAG worker runs it before the first step.
    """
    from embodied_rl.runtime.context import NodeContext

    config = node.build_config(
        {
            "inputs": "trajectory",
            "micro_batch_size": trajectories,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "temperature": TEMPERATURE,
        }
    )
    ctx = NodeContext.single_process(
        node.name, config, models=store, device=device, run_dir=Path(tempfile.gettempdir())
    )
    if node.setup is not None:
        node.setup(ctx)
    return ctx


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

    node = actor_train()
    policy = store["actor"]
    images, texts, states = obs
    torch.manual_seed(1)
    sampled = policy.act(images, texts, states, temperature=TEMPERATURE, do_sample=True)
    batch = trajectory_batch(size, images, texts, states, sampled)
    ctx = train_context(node, store, size.trajectories, policy.device)
    watched = policy.vla.projector.fc2.weight
    before = watched.detach().clone()
    records: list[dict[str, Any]] = []

    def update(_: int) -> None:
        node.fn(ctx, batch)
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
