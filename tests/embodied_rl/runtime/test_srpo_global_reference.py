"""``reward.srpo`` with successes on another worker: the global reference set finds them.

Two gloo ranks (``torch.multiprocessing`` spawn, one process each) run the node with real
``NodeContext``s whose dp group is the whole world. Rank 0 holds only failures of task 3;
rank 1 holds task 3's only success and one more failure. With ``reference_scope: global``
rank 0's failures are shaped exactly as a single process shapes the concatenated batch;
with ``local`` they stay at 0 (the reference implementation's per-GPU behaviour).
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
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.srpo import srpo_reference_rewards
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.reward.srpo import SrpoNodeConfig, srpo_node
from embodied_rl.runtime.context import MetricSink, NodeContext

pytestmark = pytest.mark.ray

WORLD = 2
# rank 0: task 3 failures at distance 3, 5, 1 from the success (1, 1); task 7 failure.
# rank 1: task 3's success and a failure at distance 8; task 7 has no success anywhere.
SHARDS = {
    0: ([[1, 4], [4, 5], [1, 2], [2, 2]], [False, False, False, False], [3, 3, 3, 7]),
    1: ([[1, 1], [1, 9]], [True, False], [3, 3]),
}


def _shard(rank: int) -> TensorDict:
    emb, success, tasks = SHARDS[rank]
    return TensorDict(
        {
            K.TRAJ_EMBEDDING: torch.tensor(emb, dtype=torch.float32),
            K.SUCCESS: torch.tensor(success),
            K.TASK_ID: torch.tensor(tasks),
        },
        batch_size=[len(tasks)],
    )


def _run_rank(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    try:
        results = {}
        for scope in ("global", "local"):
            ctx = NodeContext(
                cfg=None,
                node_id="srpo",
                node_config=SrpoNodeConfig(reference_scope=scope),
                rank=rank,
                world_size=WORLD,
                layout=Layout(tuple(range(WORLD))),
                dp_group=dist.group.WORLD,
                models={},
                state={},
                step=0,
                metrics=MetricSink(),
                device=torch.device("cpu"),
                run_dir=Path(out_dir),
            )
            rewards = srpo_node(ctx, _shard(rank))[K.REWARDS]
            results[scope] = (rewards, ctx.metrics.pop())
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[int, dict]:
    out_dir = tmp_path_factory.mktemp("srpo_ranks")
    mp.spawn(_run_rank, args=(_free_port(), str(out_dir)), nprocs=WORLD, join=True)
    return {r: torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)}


def test_global_scope_equals_the_single_process_computation(results):
    whole = [_shard(0), _shard(1)]
    expected = srpo_reference_rewards(
        torch.cat([b[K.TRAJ_EMBEDDING] for b in whole]),
        torch.cat([b[K.SUCCESS] for b in whole]),
        torch.cat([b[K.TASK_ID] for b in whole]),
    )
    assert torch.equal(results[0]["global"][0], expected[:4])
    assert torch.equal(results[1]["global"][0], expected[4:])
    # by hand: task 3 distances 3, 5, 1 (rank 0) and 8 (rank 1): n = 2/7, 4/7, 0, 1.
    shaped = [0.6 / (1 + math.exp(-10 * (0.5 - n))) for n in (2 / 7, 4 / 7, 0.0)]
    assert results[0]["global"][0].tolist() == pytest.approx(shaped + [0.0], abs=1e-6)
    assert results[1]["global"][0].tolist() == pytest.approx([1.0, 0.6 / (1 + math.exp(5))])


def test_local_scope_leaves_rank0_without_reference(results):
    assert results[0]["local"][0].tolist() == [0.0, 0.0, 0.0, 0.0]
    # rank 1 alone: one failure -> distance range 0 -> 0.6 * sigmoid(0)
    assert results[1]["local"][0].tolist() == pytest.approx([1.0, 0.3])


def test_metrics_count_tasks_without_reference(results):
    # global: only task 7 lacks a success; local: rank 0 lacks one for tasks 3 and 7.
    assert results[0]["global"][1]["srpo/tasks_without_reference"][0] == 1.0
    assert results[1]["global"][1]["srpo/tasks_without_reference"][0] == 1.0
    assert results[0]["local"][1]["srpo/tasks_without_reference"][0] == 2.0
    assert results[1]["local"][1]["srpo/tasks_without_reference"][0] == 0.0
    assert results[1]["global"][1]["srpo/success_rate"] == (0.5, 2.0, "mean")
