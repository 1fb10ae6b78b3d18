"""FSDP2 (``parallel.strategy: fsdp``) trains to the weights of DDP, on 2 gloo CPU ranks.

One spawn of 2 real processes runs every scenario through the real ``ModelStore`` and the
real ``actor.train`` node on the tiny causal LM (its 2 decoder layers are FSDP units, the
root holds the rest) and saves what the tests compare:

- equal rows (4 + 4) and uneven rows (5 + 3: rank 1 runs a zero-weight filler micro-batch):
  FSDP and DDP from the same init and data give the same weights and gradient norms;
- forward-only chunked passes on uneven rows (``chunked_forward``) equal the DDP outputs;
  they run BEFORE the training of the same stores, which catches a root left gathered (and
  then stale) after a forward without backward;
- a checkpoint written under FSDP (through ``checkpoint.write_rank_shard``/``finalize``)
  restores the weights and Adam moments into a fresh FSDP store and into a DDP store: one
  more step on each matches one more step of the original;
- a non-finite loss on one rank skips the update on both and leaves the weights unchanged;
- gradient checkpointing does not change the update; a bad layout is a clear error.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embodied_rl import keys as K

DIGITS = [str(d) for d in range(10)]
OPTIONS = {"seed": 0, "allowed_response_tokens": DIGITS}
PROMPTS = ["12+7=", "3-1=", "40+25=", "9+9=", "77-70=", "5+0=", "31-4=", "2+2="]
WIDTH = 4
TRAIN = {"ppo_epochs": 2, "num_mini_batches": 1, "micro_batch_size": 2}
EVEN, UNEVEN = (4, 4), (5, 3)  # rows of rank 0 and rank 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _batch(policy):
    """The same 8-row batch on every rank: digit responses, stale log-probs, advantages."""
    from embodied_rl.data.batch import make_batch

    gen = torch.Generator().manual_seed(7)
    ids = [policy.tokenizer(p)["input_ids"] for p in PROMPTS]
    width = max(len(i) for i in ids)
    pad = policy.pad_token_id
    digits = policy.allowed_ids[:-1].cpu()  # a buffer: on the GPU for a CUDA policy
    lengths = torch.tensor([4, 1, 3, 2, 4, 4, 1, 3])
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).float()
    response = digits[torch.randint(0, len(digits), (8, WIDTH), generator=gen)]
    batch = make_batch(
        {
            K.PROMPT_IDS: torch.tensor([[pad] * (width - len(i)) + i for i in ids]),
            K.PROMPT_MASK: torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids]),
            K.RESPONSE_IDS: torch.where(mask > 0, response, torch.full_like(response, pad)),
            K.RESPONSE_MASK: mask,
        }
    )
    with torch.no_grad():
        logprobs = policy.evaluate(batch)[0].cpu()
    batch[K.OLD_LOGPROBS] = (logprobs + 0.3 * torch.randn(logprobs.shape, generator=gen)) * mask
    batch[K.ADVANTAGES] = torch.randn(8, WIDTH, generator=gen) * mask
    return batch


def _store(strategy: str, rank_set=(0, 1), tp: int = 1, **parallel):
    """A ModelStore whose actor is used by one node on ``rank_set`` (the WORLD group)."""
    from embodied_rl.data.layout import Layout
    from embodied_rl.runtime.models import ModelStore, ModelUse

    spec = {
        "policy": "causal_lm",
        "options": OPTIONS,
        "optimizer": {"lr": 1e-2, "grad_clip": 0.5},
        "parallel": {"strategy": strategy, **parallel},
    }
    store = ModelStore({"actor": spec}, torch.device("cpu"))
    store.set_uses({"actor": [ModelUse("train", Layout(rank_set, tp))]}, {(0, 1): dist.group.WORLD})
    return store


def _build(store):
    policy = store["actor"]
    # Speed: the (151646, 64) tied embedding would dominate every gather and Adam step.
    policy.model.get_input_embeddings().weight.requires_grad_(False)
    return policy


def _context(node_type: str, options: dict, store, rank: int):
    from embodied_rl.data.layout import Layout
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.context import NodeContext

    return NodeContext.single_process(
        node_type,
        NODE_TYPES.get(node_type).build_config(options),
        rank=rank,
        world_size=2,
        layout=Layout((0, 1)),
        dp_group=dist.group.WORLD,
        models=store,
    )


def _rows(batch, rank: int, split: tuple[int, int]):
    start = 0 if rank == 0 else split[0]
    return batch[start : start + split[rank]]


def _weights(store) -> dict[str, torch.Tensor]:
    """Full trainable weights (a collective for FSDP stores)."""
    trainable = {n for n, p in store["actor"].named_parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in store.full_weights("actor") if k in trainable}


def _train(store, batch, rank: int, split, **options) -> tuple[dict, dict]:
    from embodied_rl.registry import NODE_TYPES

    ctx = _context("actor.train", {**TRAIN, **options}, store, rank)
    NODE_TYPES.get("actor.train").fn(ctx, _rows(batch, rank, split))
    return _weights(store), ctx.metrics.pop()


def _checkpoint_round_trip(store, batch, rank: int, root: Path) -> dict:
    """Save the trained FSDP store, load it into a fresh FSDP and a DDP store, step all."""
    from embodied_rl import checkpoint

    checkpoint.write_rank_shard(root, 1, rank, {"models": store.state_dict()})
    dist.barrier()
    if rank == 0:
        checkpoint.finalize(root, 1, world_size=2)
    dist.barrier()
    out = {}
    for name, strategy in (("fsdp", "fsdp"), ("ddp", "ddp")):
        # Loaded once per store: optimizer.load_state_dict keeps the loaded tensors (Adam's
        # step counter is incremented in place), as it does without FSDP.
        latest = checkpoint.latest_checkpoint(root)
        loaded = checkpoint.load_rank_shard(latest, rank, world_size=2)
        fresh = _store(strategy)
        _build(fresh)
        fresh.load_state_dict(loaded["models"])
        out[f"{name}_loaded"] = _weights(fresh)
        out[f"{name}_stepped"] = _train(fresh, batch, rank, EVEN, ppo_epochs=1)[0]
    out["original_stepped"] = _train(store, batch, rank, EVEN, ppo_epochs=1)[0]
    own = torch.load(root / "step_000001" / f"rank_{rank:05d}.pt", weights_only=True)
    out["stored_on_disk"] = sorted(own["models"]["model/actor"])[:1]
    return out


def _skip_on_bad_loss(rank: int) -> dict:
    """A NaN loss on rank 1 only: both ranks skip, the weights stay as they were."""
    from embodied_rl.training.updates import mini_batch_update

    store = _store("fsdp")
    policy = _build(store)
    batch = _batch(policy)
    before = _weights(store)
    ctx = _context("actor.train", TRAIN, store, rank)

    def loss(micro):
        value = policy.evaluate(micro)[0].sum()
        return value * float("nan") if rank == 1 else value

    _, skipped = mini_batch_update(ctx, "actor", _rows(batch, rank, EVEN), 2, loss)
    return {"skipped": skipped, "before": before, "after": _weights(store)}


def _generate_unevenly(policy, batch, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy responses of 6 tokens on rank 0 and 2 on rank 1, then rank 0 scores them twice:
    a different number of forward passes per rank, as generation and episodes have."""
    from embodied_rl.runtime.fsdp import gathered_for_inference

    rows = _rows(batch, rank, UNEVEN)
    with gathered_for_inference(policy), torch.no_grad():
        ids, mask = policy.generate(
            rows[K.PROMPT_IDS], rows[K.PROMPT_MASK], max_new_tokens=6 - 4 * rank, do_sample=False
        )
        scored = rows.clone()
        scored[K.RESPONSE_IDS], scored[K.RESPONSE_MASK] = ids, mask
        for _ in range(2 - rank):
            logprobs = policy.evaluate(scored)[0]
    return ids, logprobs


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=120),
    )  # fmt: skip
    import policies  # noqa: F401  registers the causal_lm policy
    from embodied_rl.nodes import actor  # noqa: F401  registers actor.train
    from embodied_rl.runtime.fsdp import chunked_forward, is_fsdp

    results: dict = {}
    stores = {strategy: _store(strategy) for strategy in ("ddp", "fsdp")}
    built = {strategy: _build(store) for strategy, store in stores.items()}
    batch = _batch(built["ddp"])
    results["is_fsdp"] = (is_fsdp(built["fsdp"]), is_fsdp(built["ddp"]))
    results["init"] = (_weights(stores["ddp"]), _weights(stores["fsdp"]))
    for strategy, policy in built.items():  # forward only: 3 chunks on rank 0, 2 on rank 1
        ctx = _context("actor.train", TRAIN, stores[strategy], rank)
        with torch.no_grad():
            chunks = chunked_forward(
                ctx,
                policy,
                _rows(batch, rank, UNEVEN),
                2,
                lambda rows, p=policy: p.evaluate(rows)[0],
            )
        results[("forward", strategy)] = torch.cat(chunks)
    for strategy, policy in built.items():  # passes of different counts on the two ranks
        results[("generate", strategy)] = _generate_unevenly(policy, batch, rank)
    for strategy, store in stores.items():
        results[("even", strategy)] = _train(store, batch, rank, EVEN)
    for strategy in ("ddp", "fsdp"):
        store = _store(strategy)
        _build(store)
        results[("uneven", strategy)] = _train(store, batch, rank, UNEVEN)
    results["checkpoint"] = _checkpoint_round_trip(stores["fsdp"], batch, rank, Path(out_dir))
    checkpointed = _store("fsdp", gradient_checkpointing=True)
    _build(checkpointed)
    results["grad_ckpt"] = _train(checkpointed, batch, rank, EVEN)
    results["skip"] = _skip_on_bad_loss(rank)
    try:
        _store("fsdp", tp=2)["actor"]
    except RuntimeError as err:
        results["layout_error"] = str(err)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp")
    mp.start_processes(
        _worker, args=(_free_port(), str(out)), nprocs=2, join=True, start_method="spawn"
    )
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


# Float32 sums in another order (reduce-scatter vs all-reduce) differ by ~1e-7 relative; Adam
# normalises tiny gradients (e.g. of k_proj biases, theoretically 0) into steps of about
# lr = 1e-2, so weights agree to 2e-5 (0.2% of one step): observed 3e-6.
WEIGHT_ATOL = 2e-5


def _assert_same(actual: dict, expected: dict, what: str, rtol=1e-5, atol=WEIGHT_ATOL) -> None:
    assert actual.keys() == expected.keys(), what
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=rtol, atol=atol, msg=f"{what}: {name}")


def test_fsdp_shards_the_model_and_starts_from_the_ddp_weights(ranks):
    assert ranks[0]["is_fsdp"] == (True, False)
    ddp, fsdp = ranks[0]["init"]
    assert len(ddp) > 10  # the decoder layers' weights, norms, ...
    _assert_same(fsdp, ddp, "initial weights", rtol=0, atol=0)


@pytest.mark.parametrize("rows", ["even", "uneven"])
def test_fsdp_trains_to_the_ddp_weights(ranks, rows):
    initial = ranks[0]["init"][0]
    for rank, result in enumerate(ranks):
        ddp_weights, ddp_metrics = result[(rows, "ddp")]
        fsdp_weights, fsdp_metrics = result[(rows, "fsdp")]
        _assert_same(fsdp_weights, ddp_weights, f"{rows} rows, rank {rank}")
        moved = max((ddp_weights[k] - initial[k]).abs().max().item() for k in initial)
        assert moved > 1e-3, "the two updates must change the weights"
        for name in ("actor/grad_norm", "actor/updates", "loss/policy"):
            assert fsdp_metrics[name][0] == pytest.approx(ddp_metrics[name][0], rel=1e-5), name
        # grad_clip 0.5 binds: the clip path is exercised, not only the norm
        assert ddp_metrics["actor/grad_norm"][0] > 0.5


def test_chunked_forward_runs_equal_passes_and_matches_ddp(ranks):
    for rank, result in enumerate(ranks):
        expected = result[("forward", "ddp")]
        assert expected.shape == (UNEVEN[rank], WIDTH)
        torch.testing.assert_close(result[("forward", "fsdp")], expected, rtol=1e-5, atol=1e-6)


def test_gathered_for_inference_lets_ranks_run_different_pass_counts(ranks):
    # Reaching this point at all means no rank hung; the training tests that ran after it on
    # the same stores show the shards were put back (no stale gathered parameters).
    for rank, result in enumerate(ranks):
        ids, logprobs = result[("generate", "fsdp")]
        ddp_ids, ddp_logprobs = result[("generate", "ddp")]
        assert ids.shape == (UNEVEN[rank], 6 - 4 * rank)
        assert torch.equal(ids, ddp_ids)
        torch.testing.assert_close(logprobs, ddp_logprobs, rtol=1e-5, atol=1e-6)


def test_fsdp_checkpoint_restores_into_fsdp_and_ddp(ranks):
    trained = ranks[0][("even", "fsdp")][0]
    for rank, result in enumerate(ranks):
        ck = result["checkpoint"]
        _assert_same(ck["fsdp_loaded"], trained, f"fsdp load, rank {rank}", rtol=0, atol=0)
        _assert_same(ck["ddp_loaded"], trained, f"ddp load, rank {rank}", rtol=0, atol=0)
        # Adam's moments came back too: one more step matches the uninterrupted store.
        for name in ("fsdp_stepped", "ddp_stepped"):
            _assert_same(ck[name], ck["original_stepped"], f"{name}, rank {rank}")
    # Rank 0 keeps the full state; rank 1 stores a reference to rank 0's shard.
    assert ranks[0]["checkpoint"]["stored_on_disk"] != ["__in_shard_of_rank__"]
    assert ranks[1]["checkpoint"]["stored_on_disk"] == ["__in_shard_of_rank__"]


def test_gradient_checkpointing_does_not_change_the_update(ranks):
    for rank, result in enumerate(ranks):
        _assert_same(result["grad_ckpt"][0], result[("even", "fsdp")][0], f"rank {rank}")


def test_non_finite_loss_on_one_rank_skips_the_fsdp_update_on_both(ranks):
    for result in ranks:
        skip = result["skip"]
        assert skip["skipped"] is True
        _assert_same(skip["after"], skip["before"], "skipped update", rtol=0, atol=0)


def test_fsdp_over_a_group_that_misses_holders_is_an_error(ranks):
    message = ranks[0]["layout_error"]
    assert "tp 2" in message and "parallel.strategy: ddp" in message


def test_block_input_cast_reaches_nested_floats_and_leaves_the_rest():
    """The pre-hook that stands in for FSDP2's input cast while a checkpointed block is
    recomputed: float tensors (also inside tuples, as rotary (cos, sin)) take the compute
    dtype; integer and bool tensors and non-tensors are passed through untouched."""
    from embodied_rl.runtime.fsdp import cast_inputs

    hidden, cos, sin = torch.randn(2, 3), torch.randn(3), torch.randn(3)
    ids, mask = torch.arange(3), torch.ones(3, dtype=torch.bool)
    args, kwargs = cast_inputs(
        None, (hidden, ids), {"position_embeddings": (cos, sin), "mask": mask, "n": 2},
        torch.bfloat16,
    )  # fmt: skip
    assert args[0].dtype == torch.bfloat16 and torch.equal(args[0], hidden.to(torch.bfloat16))
    assert args[1] is ids
    assert [t.dtype for t in kwargs["position_embeddings"]] == [torch.bfloat16] * 2
    assert kwargs["mask"] is mask and kwargs["n"] == 2


# ----------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_fsdp_bf16_offload_and_checkpointing_train_on_cuda():
    """One NCCL rank: bf16 blocks, CPU-offloaded shards, gradient checkpointing, 2 updates."""
    import policies  # noqa: F401  registers causal_lm
    from embodied_rl.data.layout import Layout
    from embodied_rl.nodes import actor  # noqa: F401  registers actor.train
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.context import NodeContext
    from embodied_rl.runtime.fsdp import transformer_blocks
    from embodied_rl.runtime.models import ModelStore, ModelUse

    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        parallel = {"strategy": "auto", "cpu_offload": True, "gradient_checkpointing": True}
        spec = {"policy": "causal_lm", "options": OPTIONS, "parallel": parallel}
        store = ModelStore({"actor": {**spec, "optimizer": {"lr": 1e-2}}}, torch.device("cuda"))
        store.set_uses({"actor": [ModelUse("train", Layout((0,)))]}, {(0,): dist.group.WORLD})
        policy = store["actor"]
        assert store.is_sharded("actor") and store.compute_dtype("actor") == torch.bfloat16
        seen = []
        block = transformer_blocks(policy)[0]
        # A pre-hook registered after FSDP's runs after the unshard: it sees the compute dtype.
        block.register_forward_pre_hook(lambda m, a: seen.append(m.self_attn.q_proj.weight.dtype))
        shard = next(p for p in policy.parameters() if p.requires_grad)
        assert shard.to_local().device.type == "cpu"  # offloaded between passes
        before = {k: v.cpu() for k, v in store.full_weights("actor")}
        batch = _batch(policy)
        ctx = NodeContext.single_process(
            "actor.train",
            NODE_TYPES.get("actor.train").build_config({"ppo_epochs": 2, "micro_batch_size": 4}),
            models=store,
            device=torch.device("cuda"),
            dp_group=dist.group.WORLD,
        )
        NODE_TYPES.get("actor.train").fn(ctx, batch)
        metrics = ctx.metrics.pop()
        assert metrics["actor/updates"][0] == 2  # neither update was skipped
        assert seen and set(seen) == {torch.bfloat16}
        after = {k: v.cpu() for k, v in store.full_weights("actor")}
        assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in after.values())
        assert max((after[k] - before[k]).abs().max().item() for k in after) > 1e-3
        saved = store.state_dict()
        assert saved["model/actor"].keys() == after.keys()
        assert next(iter(saved["model/actor"].values())).device.type == "cpu"
    finally:
        dist.destroy_process_group()
