"""One global batch split over 1, 2 and 4 gloo ranks trains to the same weights.

Each world size is one spawn of real processes. Every rank builds the same tiny causal-LM
policy through the real ``ModelStore``, builds the same global batch, takes its contiguous
slice and runs the REAL ``actor.train`` node (and the advantage / token-reward nodes) with
a ``NodeContext`` whose dp group is the gloo WORLD. Loss metrics (summed over ranks), the
last synced gradient and the updated weights must match the single-rank run for every loss
variant, for micro-batches of 1 and 4 rows, and with 2 mini-batches per epoch (cut over the
global batch by SAMPLE_ID; a control shows that the pieces a per-rank cut makes give other
weights).
"""

from __future__ import annotations

import copy
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embodied_rl import keys as K

GLOBAL_BATCH = 8
WIDTH = 4  # response tokens R
DIGITS = [str(d) for d in range(10)]
POLICY_OPTIONS = {"seed": 0, "allowed_response_tokens": DIGITS}
PROMPTS = ["12+7=", "3-1=", "40+25=", "9+9=", "77-70=", "5+0=", "31-4=", "2+2="]
GROUPS = [0, 0, 0, 1, 1, 2, 2, 3]  # groups 0 and 1 span ranks at dp 4; group 3 has one sample
MICRO_BATCH_SIZES = (1, 4)
BASE = {"ppo_epochs": 2, "num_mini_batches": 1, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
# Every aggregation mode and ratio level; each also carries one more option to keep the
# number of (slow) runs down.
VARIANTS = {
    "token-mean+dual-clip": {"loss_agg_mode": "token-mean", "dual_clip_c": 1.5},
    "seq-mean-token-sum+cpgd": {
        "loss_agg_mode": "seq-mean-token-sum",
        "policy_loss": "cpgd",
        "cpgd_drift_coef": 0.1,
    },
    "seq-mean-token-mean+gspo-token+kl+entropy": {
        "loss_agg_mode": "seq-mean-token-mean",
        "ratio_level": "sequence_token",
        "kl_coef": 0.1,
        "entropy_coef": 0.01,
    },
    "seq-mean-token-sum-norm": {"loss_agg_mode": "seq-mean-token-sum-norm"},
    "gspo": {"ratio_level": "sequence", "loss_agg_mode": "seq-mean-token-mean"},
    # Global mini-batches (embodied_rl/data/mini_batches.py): pieces {0..3} and {4..7} by
    # SAMPLE_ID at every dp size; a per-rank cut would make {0, 1, 4, 5} at dp 2.
    "two-mini-batches": {"num_mini_batches": 2},
}
PER_RANK_CUT_IDS = [0, 1, 4, 5, 2, 3, 6, 7]  # SAMPLE_IDs making a per-rank cut's pieces at dp 2
ADVANTAGE_NODES = {
    "rloo": ("advantage.rloo", {}, K.ADVANTAGES),
    "grpo": ("advantage.grpo", {}, K.ADVANTAGES),
    "kl_reward": ("reward.kl_penalty", {"beta": 0.05, "estimator": "k3"}, K.TOKEN_REWARDS),
    "reinforce_pp": ("advantage.reinforce_pp", {"gamma": 0.9}, K.ADVANTAGES),
    "reinforce_pp_baseline": (
        "advantage.reinforce_pp",
        {"gamma": 1.0, "baseline": True},
        K.ADVANTAGES,
    ),
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _global_batch(policy):
    """The same (B=8) batch on every rank: prompts, random digit responses, logprobs, rewards."""
    from embodied_rl.data.batch import make_batch

    gen = torch.Generator().manual_seed(1234)
    ids = [policy.tokenizer(p)["input_ids"] for p in PROMPTS]
    width = max(len(i) for i in ids)
    pad = policy.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    prompt_mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    digits = policy.allowed_ids[:-1]  # the digit ids (EOS is the largest id)
    response_ids = digits[torch.randint(0, len(digits), (GLOBAL_BATCH, WIDTH), generator=gen)]
    lengths = torch.tensor([4, 1, 3, 2, 4, 4, 1, 3])
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    response_ids = torch.where(mask > 0, response_ids, torch.full_like(response_ids, pad))
    batch = make_batch(
        {
            K.PROMPT_IDS: prompt_ids,
            K.PROMPT_MASK: prompt_mask,
            K.RESPONSE_IDS: response_ids,
            K.RESPONSE_MASK: mask,
            K.GROUP_ID: torch.tensor(GROUPS),
            K.SAMPLE_ID: torch.arange(GLOBAL_BATCH),
            K.REWARDS: torch.rand(GLOBAL_BATCH, generator=gen),
        }
    )
    with torch.no_grad():
        logprobs = policy.evaluate(batch)[0]
    # Stale old log-probs (noise 0.3) so that clipping, dual clip and CPGD clip take effect.
    batch[K.OLD_LOGPROBS] = (logprobs + 0.3 * torch.randn(logprobs.shape, generator=gen)) * mask
    batch[K.REF_LOGPROBS] = (logprobs + 0.2 * torch.randn(logprobs.shape, generator=gen)) * mask
    advantages = torch.randn(GLOBAL_BATCH, WIDTH, generator=gen) * mask
    # One token far off-policy (r = e^1.2 = 3.3) with A < 0: the dual clip (c = 1.5) binds.
    batch[K.OLD_LOGPROBS][0, 0] = logprobs[0, 0] - 1.2
    advantages[0, 0] = -1.0
    batch[K.ADVANTAGES] = advantages
    return batch


RESPONSE_KEYS = (K.RESPONSE_IDS, K.RESPONSE_MASK, K.OLD_LOGPROBS, K.REF_LOGPROBS, K.ADVANTAGES)


def _own_width(shard):
    """Response keys cut to the shard's longest response, as each rank pads its own rollouts
    (at dp 4 the shards are 4, 3, 4 and 3 tokens wide): the losses and the global
    mini-batches must not depend on the padding."""
    width = int(shard[K.RESPONSE_MASK].sum(dim=1).max())
    out = shard.clone()
    for key in RESPONSE_KEYS:
        out[key] = shard[key][:, :width]
    return out


def _context(node_type: str, options: dict, store, rank: int, world_size: int):
    from embodied_rl.data.layout import Layout
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.context import MetricSink, NodeContext

    return NodeContext(
        cfg=None,
        node_id=node_type,
        node_config=NODE_TYPES.get(node_type).build_config(options),
        rank=rank,
        world_size=world_size,
        layout=Layout(tuple(range(world_size))),
        dp_group=dist.group.WORLD,
        models=store,
        state={},
        step=0,
        metrics=MetricSink(),
        device=torch.device("cpu"),
        run_dir=Path("."),
    )


def _snapshot(policy) -> dict:
    """Trainable weights and their last (dp-summed, clipped) gradients."""
    return {
        name: (param.detach().clone(), param.grad.clone())
        for name, param in policy.named_parameters()
        if param.requires_grad
    }


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=120),
    )
    import embodied_rl.nodes  # noqa: F401  registers the core node types
    import policies  # noqa: F401  registers the causal_lm policy
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.models import ModelStore

    spec = {"policy": "causal_lm", "options": POLICY_OPTIONS, "optimizer": {"lr": 1e-2}}
    store = ModelStore({"actor": spec}, torch.device("cpu"))
    policy = store["actor"]
    # Speed: the (151646, 64) tied embedding would make every backward, optimizer step and
    # gradient all-reduce ~100x larger; freezing it before the optimizer is built leaves the
    # ~100k weights of the transformer layers to train and compare.
    policy.model.get_input_embeddings().weight.requires_grad_(False)
    initial = copy.deepcopy(store.state_dict())  # weights + a fresh optimizer
    batch = _global_batch(policy)
    rows = GLOBAL_BATCH // world_size
    shard = batch[rank * rows : (rank + 1) * rows]
    train_shard = _own_width(shard)
    results: dict = {"advantages": {}}
    for name, (node_type, options, key) in ADVANTAGE_NODES.items():
        piece = shard.clone()
        if node_type == "advantage.reinforce_pp":
            reward_ctx = _context("reward.token_rewards", {}, store, rank, world_size)
            piece = NODE_TYPES.get("reward.token_rewards").fn(reward_ctx, piece)
        ctx = _context(node_type, options, store, rank, world_size)
        results["advantages"][name] = NODE_TYPES.get(node_type).fn(ctx, piece)[key]
    for variant, options in VARIANTS.items():
        for micro in MICRO_BATCH_SIZES:
            store.load_state_dict(initial)
            config = {**BASE, **options, "micro_batch_size": micro}
            ctx = _context("actor.train", config, store, rank, world_size)
            NODE_TYPES.get("actor.train").fn(ctx, train_shard.clone())
            results[(variant, micro)] = {
                "params": _snapshot(policy),
                "metrics": ctx.metrics.pop(),
            }
    if world_size == 1:  # control: train on the pieces a per-rank cut at dp 2 would make
        store.load_state_dict(initial)
        config = {**BASE, **VARIANTS["two-mini-batches"], "micro_batch_size": 4}
        per_rank_cut = train_shard.clone()
        per_rank_cut[K.SAMPLE_ID] = torch.tensor(PER_RANK_CUT_IDS)
        NODE_TYPES.get("actor.train").fn(_context("actor.train", config, store, 0, 1), per_rank_cut)
        results["per_rank_cut"] = _snapshot(policy)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _reduced_metrics(per_rank: list[dict]) -> dict[str, float]:
    """Combine the ranks' metric records as the trainer does (sum or max here)."""
    out: dict[str, float] = {}
    for name, (_, _, reduce) in per_rank[0].items():
        values = [records[name][0] for records in per_rank]
        out[name] = sum(values) if reduce == "sum" else max(values)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, list[dict]]:
    """world size -> every rank's results."""
    results = {}
    for world_size in (1, 2, 4):
        out_dir = tmp_path_factory.mktemp(f"dp{world_size}")
        mp.start_processes(
            _worker,
            args=(world_size, _free_port(), str(out_dir)),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        results[world_size] = [
            torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)
        ]
    return results


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, abs_: float, what: str):
    """Max |actual - expected| <= rel * max|expected| + abs_ over the whole tensor."""
    scale = expected.abs().max().item()
    diff = (actual - expected).abs().max().item()
    assert diff <= rel * scale + abs_, f"{what}: max diff {diff:.3g} (scale {scale:.3g})"


# Float32 sums in another order differ by ~1e-5 relative. Adam turns a gradient into a step of
# about lr = 1e-2 per weight, normalising tiny (theoretically zero) gradients too, so weights
# are compared to 2% of one step; a wrong normalisation shows in the gradients and metrics.
GRAD_REL, WEIGHT_ABS = 2e-4, 2e-4


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_actor_train_is_invariant_to_dp_size_and_micro_batches(runs, variant):
    reference = runs[1][0][(variant, 4)]
    expected_metrics = _reduced_metrics([reference["metrics"]])
    updates = BASE["ppo_epochs"] * VARIANTS[variant].get("num_mini_batches", 1)
    assert expected_metrics["actor/updates"] == updates
    for world_size, ranks in runs.items():
        for micro in MICRO_BATCH_SIZES:
            what = f"{variant}, dp {world_size}, micro-batch {micro}"
            metrics = _reduced_metrics([r[(variant, micro)]["metrics"] for r in ranks])
            assert metrics.keys() == expected_metrics.keys(), what
            for name, value in expected_metrics.items():
                assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), f"{what}: {name}"
            for rank, result in enumerate(ranks):
                for name, (weight, grad) in result[(variant, micro)]["params"].items():
                    ref_weight, ref_grad = reference["params"][name]
                    _assert_close(grad, ref_grad, GRAD_REL, 1e-9, f"{what}, {rank=}, grad {name}")
                    _assert_close(weight, ref_weight, 0.0, WEIGHT_ABS, f"{what}, {rank=}, {name}")


def test_mini_batches_cut_per_rank_would_train_to_other_weights(runs):
    """The dp-2 pieces of a per-rank cut on one rank: the weights differ by far more than the
    tolerance above, so a per-rank cut at dp 2 or 4 would fail the invariance test."""
    control = runs[1][0]["per_rank_cut"]
    reference = runs[1][0][("two-mini-batches", 4)]["params"]
    largest = max((control[n][0] - w).abs().max().item() for n, (w, _) in reference.items())
    assert largest > 20 * WEIGHT_ABS


def test_variants_exercise_their_options(runs):
    metrics = {v: _reduced_metrics([runs[1][0][(v, 4)]["metrics"]]) for v in VARIANTS}
    assert metrics["token-mean+dual-clip"]["actor/dual_clip_fraction"] > 0
    assert metrics["token-mean+dual-clip"]["actor/clip_fraction"] > 0
    assert metrics["gspo"]["actor/clip_fraction"] > 0
    assert metrics["seq-mean-token-sum+cpgd"]["loss/cpgd_drift"] > 0
    assert metrics["seq-mean-token-mean+gspo-token+kl+entropy"]["loss/kl"] > 0


@pytest.mark.parametrize("name", list(ADVANTAGE_NODES))
def test_advantage_nodes_are_invariant_to_dp_size(runs, name):
    expected = runs[1][0]["advantages"][name]
    for world_size, ranks in runs.items():
        merged = torch.cat([r["advantages"][name] for r in ranks])
        _assert_close(merged, expected, 1e-6, 1e-6, f"{name}, dp {world_size}")
