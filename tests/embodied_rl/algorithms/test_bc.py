"""Behaviour-cloning losses by hand, and the real ``sft.train`` node on 1 vs 2 gloo ranks.

The dp test spawns real processes: every rank builds the same policy through the real
``ModelStore`` and the same global batch of demonstration rows (from the real loader on
synthetic demo files), takes its contiguous half and runs ``sft.train`` with the gloo WORLD
as its dp group. Loss metrics (summed over ranks), the synced gradients and the updated
weights must equal the single-rank run, for micro-batches of 1 and 4 rows.
"""

from __future__ import annotations

import math
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embodied_rl.algorithms.bc import (
    gaussian_bin_targets,
    l1_regression,
    smoothed_token_cross_entropy,
    token_accuracy,
    token_cross_entropy,
)
from embodied_rl.algorithms.losses import GlobalCounts
from tests.embodied_rl.synthetic_demos import write_synthetic_demos

LOGPROBS = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -0.25]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # 3 valid tokens


def test_token_cross_entropy_by_hand():
    loss = token_cross_entropy(LOGPROBS, MASK, GlobalCounts(tokens=3.0, sequences=2.0))
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    # Shards normalised by the global count add up to the whole batch's loss.
    halves = [
        token_cross_entropy(LOGPROBS[i : i + 1], MASK[i : i + 1], GlobalCounts(3.0, 2.0))
        for i in range(2)
    ]
    assert sum(h.item() for h in halves) == pytest.approx(loss.item())


def _normal_mass(low: float, high: float, mean: float, sigma: float) -> float:
    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf((x - mean) / (sigma * math.sqrt(2))))

    return cdf(high) - cdf(low)


def test_gaussian_bin_targets_by_hand():
    targets = gaussian_bin_targets(torch.tensor([2, 0]), num_bins=5, sigma=1.0)
    # Bin j holds N(index, 1) on [j - 0.5, j + 0.5), renormalised over the 5 bins.
    for row, centre in enumerate((2, 0)):
        mass = [_normal_mass(j - 0.5, j + 0.5, centre, 1.0) for j in range(5)]
        expected = torch.tensor(mass) / sum(mass)
        assert torch.allclose(targets[row], expected, atol=1e-6)
    assert targets[0, 2] == pytest.approx(0.3829 / _normal_mass(-0.5, 4.5, 2, 1.0), abs=1e-4)
    assert targets[0, 1] == pytest.approx(targets[0, 3].item())  # symmetric inside the range
    assert int(targets[1].argmax()) == 0  # an edge target keeps its mode on the edge
    assert torch.equal(gaussian_bin_targets(torch.tensor([3]), 5, 1e-3)[0].round(), torch.eye(5)[3])


def test_smoothed_cross_entropy_by_hand_and_its_small_sigma_limit():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [2.0, 0.0, -1.0]], [[1.0, 1.0, 1.0], [0.0, 0.0, 5.0]]])
    bin_logprobs = torch.log_softmax(logits, dim=-1)
    index = torch.tensor([[1, 0], [2, 2]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    counts = GlobalCounts(tokens=3.0, sequences=2.0)
    loss = smoothed_token_cross_entropy(bin_logprobs, index, 0.7, mask, counts)
    q = gaussian_bin_targets(index, 3, 0.7)
    by_hand = -sum((q[b, r] * bin_logprobs[b, r]).sum() for b, r in ((0, 0), (0, 1), (1, 0))) / 3
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    # sigma -> 0 is the plain token cross-entropy of the demonstrated bins.
    chosen = bin_logprobs.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    plain = token_cross_entropy(chosen, mask, counts)
    limit = smoothed_token_cross_entropy(bin_logprobs, index, 1e-3, mask, counts)
    assert limit.item() == pytest.approx(plain.item(), rel=1e-5)
    assert loss.item() > plain.item()  # the spread targets also ask for mass on the neighbours


def test_l1_regression_by_hand_and_its_gradient():
    prediction = torch.tensor([[0.5, -0.5, 9.0], [0.0, 9.0, 9.0]], requires_grad=True)
    target = torch.tensor([[0.25, 0.5, 0.0], [-1.0, 0.0, 0.0]])
    loss = l1_regression(prediction, target, MASK, GlobalCounts(tokens=3.0, sequences=2.0))
    assert loss.item() == pytest.approx((0.25 + 1.0 + 1.0) / 3)
    loss.backward()
    # d|p - t| / dp = sign(p - t) / 3 on valid entries; masked entries get nothing.
    expected = torch.tensor([[1.0, -1.0, 0.0], [1.0, 0.0, 0.0]]) / 3
    assert torch.allclose(prediction.grad, expected)


def test_token_accuracy_by_hand():
    predicted = torch.tensor([[5.0, 7.0, 1.0], [2.0, 2.0, 2.0]])
    target = torch.tensor([[5, 6, 1], [2, 9, 9]])
    accuracy = token_accuracy(predicted, target, MASK, GlobalCounts(tokens=3.0, sequences=2.0))
    assert accuracy.item() == pytest.approx(2 / 3)  # hits 5 and 2; 1 is masked


# --------------------------------------------------------------------------- dp invariance
GLOBAL_BATCH = 8
POLICIES = {
    "mlp_gaussian": ("mlp", {"image_size": 16, "action_dim": 7, "chunk": 2, "hidden": [32]}),
    "mlp_discrete": (
        "mlp",
        {"action_dim": 7, "chunk": 2, "head": "discrete", "instruction_buckets": 16},
    ),
    "oft_discrete": ("openvla_oft", {"chunk": 2, "micro_batch_size": 3}),
    "oft_discrete_smoothed": ("openvla_oft", {"chunk": 2, "micro_batch_size": 3}),
}
for _, options in POLICIES.values():
    options["gripper_convention"] = "libero"
TARGET_SIGMA_BINS = {"oft_discrete_smoothed": 3.0}  # sft.train option per variant (default 0)
MICRO_BATCH_SIZES = (1, 4)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context(store, rank: int, world_size: int, micro: int, sigma: float = 0.0):
    from embodied_rl.data.layout import Layout
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.context import MetricSink, NodeContext

    config = {"model": "actor", "micro_batch_size": micro, "target_sigma_bins": sigma}
    return NodeContext(
        cfg=None,
        node_id="sft",
        node_config=NODE_TYPES.get("sft.train").build_config(config),
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


def _worker(rank: int, world_size: int, port: int, demo_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=120),
    )
    import policies  # noqa: F401  registers the policies
    from embodied_rl.data.demo_loader import DemoLoader, select_demos
    from embodied_rl.nodes import sft  # noqa: F401  registers sft.train
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.models import ModelStore

    infos = select_demos([demo_dir], None, heldout_every=5)
    rows = GLOBAL_BATCH // world_size
    results = {}
    for name, (policy, options) in POLICIES.items():
        loader = DemoLoader(
            infos, chunk=2, cameras=["agentview"], image_size=16, global_batch_size=GLOBAL_BATCH,
            dp_rank=0, dp_size=1, seed=3,
        )  # fmt: skip
        batch = loader.next_batch()  # the same global batch on every rank
        spec = {"policy": policy, "options": options, "optimizer": {"lr": 1e-2}}
        store = ModelStore({"actor": spec}, torch.device("cpu"))
        model = store["actor"]
        model.set_statistics(loader.statistics)
        initial = {k: v.clone() for k, v in store.state_dict()["model/actor"].items()}
        for micro in MICRO_BATCH_SIZES:
            model.load_state_dict(initial)
            store._optimizers.clear()  # a fresh Adam for each variant
            ctx = _context(store, rank, world_size, micro, TARGET_SIGMA_BINS.get(name, 0.0))
            NODE_TYPES.get("sft.train").fn(ctx, batch[rank * rows : (rank + 1) * rows].clone())
            results[(name, micro)] = {
                "params": {
                    n: (p.detach().clone(), p.grad.clone())
                    for n, p in model.named_parameters()
                    if p.requires_grad and p.grad is not None
                },
                "metrics": ctx.metrics.pop(),
            }
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, list[dict]]:
    demo_dir = write_synthetic_demos(tmp_path_factory.mktemp("demos"), length=6)
    results = {}
    for world_size in (1, 2):
        out_dir = tmp_path_factory.mktemp(f"dp{world_size}")
        mp.start_processes(
            _worker,
            args=(world_size, _free_port(), str(demo_dir), str(out_dir)),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        results[world_size] = [
            torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)
        ]
    return results


def _reduced(per_rank: list[dict]) -> dict[str, float]:
    out = {}
    for name, (_, _, reduce) in per_rank[0].items():
        values = [records[name][0] for records in per_rank]
        out[name] = sum(values) if reduce == "sum" else max(values)
    return out


@pytest.mark.parametrize("name", list(POLICIES))
def test_sft_train_is_invariant_to_dp_size_and_micro_batches(runs, name):
    reference = runs[1][0][(name, 4)]
    expected = _reduced([reference["metrics"]])
    metric = "sft/l1" if name == "mlp_gaussian" else "sft/token_accuracy"
    assert expected["sft/loss"] > 0 and metric in expected and "sft/grad_norm" in expected
    assert expected["sft/skipped_updates"] == 0
    for world_size, ranks in runs.items():
        for micro in MICRO_BATCH_SIZES:
            what = f"{name}, dp {world_size}, micro-batch {micro}"
            metrics = _reduced([r[(name, micro)]["metrics"] for r in ranks])
            assert metrics.keys() == expected.keys(), what
            for key, value in expected.items():
                assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), f"{what}: {key}"
            for rank, result in enumerate(ranks):
                params = result[(name, micro)]["params"]
                assert params.keys() == reference["params"].keys()
                for param, (weight, grad) in params.items():
                    ref_weight, ref_grad = reference["params"][param]
                    scale = ref_grad.abs().max().item()
                    assert (grad - ref_grad).abs().max().item() <= 2e-4 * scale + 1e-8, (
                        f"{what}, {rank=}, grad {param}"
                    )
                    # Adam moves every weight by about lr = 1e-2: 2% of a step.
                    assert (weight - ref_weight).abs().max().item() <= 2e-4, (
                        f"{what}, {rank=}, {param}"
                    )


def test_smoothed_targets_change_the_loss_and_the_update(runs):
    plain, smoothed = (runs[1][0][(name, 4)] for name in ("oft_discrete", "oft_discrete_smoothed"))
    loss = {
        name: _reduced([r["metrics"]])["sft/loss"] for name, r in (("p", plain), ("s", smoothed))
    }
    assert loss["s"] != pytest.approx(loss["p"], rel=1e-4)
    head = next(n for n in plain["params"] if "lm_head" in n or "embed_tokens" in n)
    assert not torch.allclose(plain["params"][head][1], smoothed["params"][head][1])


def test_target_sigma_is_refused_for_a_continuous_head(tmp_path):
    import policies  # noqa: F401  registers the policies
    from embodied_rl.data.demo_loader import DemoLoader, select_demos
    from embodied_rl.nodes import sft  # noqa: F401  registers sft.train
    from embodied_rl.registry import NODE_TYPES
    from embodied_rl.runtime.models import ModelStore

    infos = select_demos([write_synthetic_demos(tmp_path, length=6)], None, heldout_every=5)
    loader = DemoLoader(
        infos, chunk=2, cameras=["agentview"], image_size=16, global_batch_size=4,
        dp_rank=0, dp_size=1, seed=3,
    )  # fmt: skip
    policy, options = POLICIES["mlp_gaussian"]
    store = ModelStore({"actor": {"policy": policy, "options": options}}, torch.device("cpu"))
    store["actor"].set_statistics(loader.statistics)
    ctx = _context(store, 0, 1, 4, sigma=2.0)
    with pytest.raises(ValueError, match=r"target_sigma_bins=2.0 .* regresses continuous actions"):
        NODE_TYPES.get("sft.train").fn(ctx, loader.next_batch())
    with pytest.raises(ValueError, match="target_sigma_bins"):
        NODE_TYPES.get("sft.train").build_config({"target_sigma_bins": -1.0})
