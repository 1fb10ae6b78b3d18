"""SRPO rewards (docs/ALGORITHMS.md, "SRPO") on hand-made embeddings with hand-computed rewards.

Shorthands used in the expected values: ``S(x) = 1 / (1 + exp(-x))``; the reference variant's
failure reward is ``0.6 * S(10 * (0.5 - n))``, so ``n = 0 -> 0.6*S(5) = 0.595984``,
``n = 0.5 -> 0.3``, ``n = 1 -> 0.6*S(-5) = 0.004016``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.srpo import (
    SrpoRewardConfig,
    dbscan,
    progress_oracle_rewards,
    reference_points,
    reference_shaping,
    srpo_paper_rewards,
    srpo_reference_rewards,
    tasks_without_reference,
)
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.reward.srpo import SrpoNodeConfig, progress_oracle_node, srpo_node
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.context import MetricSink, NodeContext

TOP = 0.6 / (1 + math.exp(-5))  # n = 0: the closest failure, 0.595984...
BOTTOM = 0.6 / (1 + math.exp(5))  # n = 1: the farthest failure, 0.004016...


def S(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_defaults_and_shaping_are_the_published_formula():
    """docs/ALGORITHMS.md, "SRPO": DBSCAN(eps=0.5, min_samples=2), alpha 0.8 for the paper's
    variant, and ``r = 0.6 * sigmoid(10 * (0.5 - n))``: 0.596 at n = 0, 0.3 at n = 0.5 and
    0.004 at n = 1 (hand values of the formula, not of the code)."""
    config = SrpoRewardConfig()
    assert (config.variant, config.eps, config.min_samples) == ("reference", 0.5, 2)
    assert (config.scale, config.sharpness, config.alpha) == (0.6, 10.0, 0.8)
    # Distances 2, 3, 4 min-max normalise to n = 0, 0.5, 1 (the nearest failure scores most).
    distances = torch.tensor([2.0, 3.0, 4.0], dtype=torch.float64)
    rewards = reference_shaping(distances, config.scale, config.sharpness)
    assert rewards.tolist() == pytest.approx([0.595984, 0.3, 0.004016], abs=1e-6)
    # The shorthands the other tests use are those values.
    assert (TOP, BOTTOM) == pytest.approx((rewards[0].item(), rewards[2].item()), abs=1e-12)


def test_all_successes_get_one():
    emb = t([[1, 2], [3, 4], [5, 6]])
    rewards = srpo_reference_rewards(
        emb, torch.tensor([True] * 3), torch.zeros(3, dtype=torch.long)
    )
    assert rewards.tolist() == [1.0, 1.0, 1.0]
    assert rewards.dtype == torch.float32


def test_no_success_leaves_failures_at_zero():
    emb = t([[1, 2], [3, 4]])
    success = torch.tensor([False, False])
    tasks = torch.zeros(2, dtype=torch.long)
    assert srpo_reference_rewards(emb, success, tasks).tolist() == [0.0, 0.0]
    assert tasks_without_reference(emb, success, tasks) == 1


def test_one_success_is_the_reference_and_failures_are_ordered_by_distance():
    # Reference (1, 1); failure distances 1, 3 and 5 (a 3-4-5 triangle): n = 0, 0.5, 1.
    emb = t([[1, 4], [1, 1], [4, 5], [1, 2]])
    success = torch.tensor([False, True, False, False])
    rewards = srpo_reference_rewards(emb, success, torch.zeros(4, dtype=torch.long))
    assert rewards.tolist() == pytest.approx([0.3, 1.0, BOTTOM, TOP], abs=1e-6)


def test_equal_distances_give_half_scale():
    # Both failures at distance 2 from the only success: range 0 -> n = 0.5 -> 0.6*S(0).
    emb = t([[1, 1], [3, 1], [1, 3]])
    success = torch.tensor([True, False, False])
    rewards = srpo_reference_rewards(emb, success, torch.zeros(3, dtype=torch.long))
    assert rewards.tolist() == pytest.approx([1.0, 0.3, 0.3], abs=1e-7)


def test_invalid_embedding_gets_zero_and_is_left_out_of_the_range():
    # Success (3, 0). Valid failures at d = 1 and 2 -> n = 0, 1. The zero row (d would be 3)
    # must not stretch the range: were it counted, the d = 2 failure would get n = 0.5 -> 0.3.
    emb = t([[3, 0], [0, 0], [3, 1], [3, 2]])
    success = torch.tensor([True, False, False, False])
    rewards = srpo_reference_rewards(emb, success, torch.zeros(4, dtype=torch.long))
    assert rewards.tolist() == pytest.approx([1.0, 0.0, TOP, BOTTOM], abs=1e-6)


def test_invalid_success_keeps_one_but_is_no_reference():
    emb = t([[0, 0], [1, 1], [5, 5]])
    success = torch.tensor([True, False, False])
    tasks = torch.zeros(3, dtype=torch.long)
    assert srpo_reference_rewards(emb, success, tasks).tolist() == [1.0, 0.0, 0.0]
    assert tasks_without_reference(emb, success, tasks) == 1


def test_tasks_are_independent():
    # task 0: the one-success case above; task 1: no success; task 2: one failure (range 0).
    emb = t([[1, 1], [10, 11], [1, 2], [1, 2], [1, 4], [10, 10], [4, 5]])
    success = torch.tensor([True, False, False, False, False, True, False])
    tasks = torch.tensor([0, 2, 0, 1, 0, 2, 0])
    rewards = srpo_reference_rewards(emb, success, tasks)
    assert rewards.tolist() == pytest.approx([1.0, 0.3, TOP, 0.0, 0.3, 1.0, BOTTOM], abs=1e-6)
    assert tasks_without_reference(emb, success, tasks) == 1


def test_dbscan_two_clusters_and_noise():
    points = torch.tensor(
        [[0, 0], [10, 0], [5, 5], [0, 0.4], [5.3, 5], [0, 0.8]], dtype=torch.float64
    )
    # eps 0.5, min 2: the chain 0-0.4-0.8 (steps 0.4) is one cluster, found first; the pair at
    # (5, 5) the second; (10, 0) has only itself -> noise.
    assert dbscan(points, 0.5, 2).tolist() == [0, -1, 1, 0, 1, 0]
    # min 3: only (0, 0.4) has 3 neighbours (itself and both ends); the ends join as border
    # points; the pair at (5, 5) is no longer dense enough.
    assert dbscan(points, 0.5, 3).tolist() == [0, -1, -1, 0, -1, 0]
    # the radius is inclusive: a distance of exactly eps = 0.4 still links the chain.
    assert dbscan(points, 0.4, 2).tolist() == [0, -1, 1, 0, 1, 0]
    assert dbscan(points, 0.39, 2).tolist() == [-1, -1, 0, -1, 0, -1]  # only the pair


def test_dbscan_border_point_joins_the_first_cluster_reaching_it():
    # eps 0.5, min 4. A = 0, .1, .2, .3 and B = 1.2, 1.3, 1.4, 1.5 are all core (4 or 5
    # neighbours); x = 0.75 sees only 0.3, itself and 1.2 (0.45 away each) -> a border point
    # of both, it joins whichever cluster is discovered first (the lower first index).
    border, a, b = [0.75], [0.0, 0.1, 0.2, 0.3], [1.2, 1.3, 1.4, 1.5]
    a_first = torch.tensor(a + b + border, dtype=torch.float64)[:, None]
    assert dbscan(a_first, 0.5, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0]
    b_first = torch.tensor(b + a + border, dtype=torch.float64)[:, None]
    assert dbscan(b_first, 0.5, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0]
    # B expands second but must not take the border point over from A:
    assert dbscan(a_first, 0.5, 4)[-1] == dbscan(a_first, 0.5, 4)[0]
    # min 6: nobody is core -> all noise.
    assert dbscan(a_first, 0.5, 6).tolist() == [-1] * 9


def test_reference_points_are_cluster_centres_in_raw_space():
    # dim 0: 1, 1.2, 9, 9.2 (std 4.00125 -> pairs 0.05 apart); dim 1: 1, 1, 3, 3 (std 1).
    successes = t([[1, 1], [1.2, 1], [9, 3], [9.2, 3]])  # float32 inputs: 1e-6 tolerance
    refs = reference_points(successes, eps=0.5, min_samples=2)
    assert refs.flatten().tolist() == pytest.approx([1.1, 1.0, 9.1, 3.0], abs=1e-6)


def test_reference_points_fall_back_to_the_mean_without_clusters():
    # Two successes standardise to -1 and +1 (2 apart > eps): both noise -> the mean.
    refs = reference_points(t([[1, 1], [3, 1]]), eps=0.5, min_samples=2)
    assert refs.flatten().tolist() == pytest.approx([2.0, 1.0], abs=1e-12)


def test_failures_are_scored_against_the_nearest_cluster_centre():
    # Centres (1.1, 1) and (9.1, 3). Failure distances: (1.1, 2) -> 1, (9.1, 6) -> 3,
    # (5.1, 2) -> sqrt(4^2 + 1^2) = sqrt(17) to both. n = 0, 2/(sqrt(17)-1), 1.
    emb = t([[1, 1], [1.2, 1], [9, 3], [9.2, 3], [1.1, 2], [9.1, 6], [5.1, 2]])
    success = torch.tensor([True] * 4 + [False] * 3)
    rewards = srpo_reference_rewards(emb, success, torch.zeros(7, dtype=torch.long))
    middle = 0.6 * S(10 * (0.5 - 2 / (math.sqrt(17) - 1)))  # 0.118...
    assert rewards[4:].tolist() == pytest.approx([TOP, middle, BOTTOM], abs=1e-5)


def test_mean_reference_when_successes_do_not_cluster():
    # Reference (2, 1). d = 0.5, sqrt(1 + 0.25), 3 -> n = 0, (sqrt(1.25) - 0.5)/2.5, 1.
    # (Were the two successes used as points, the middle failure would be the closest.)
    emb = t([[1, 1], [3, 1], [2, 1.5], [1, 1.5], [2, 4]])
    success = torch.tensor([True, True, False, False, False])
    rewards = srpo_reference_rewards(emb, success, torch.zeros(5, dtype=torch.long))
    middle = 0.6 * S(10 * (0.5 - (math.sqrt(1.25) - 0.5) / 2.5))  # 0.556...
    assert rewards[2:].tolist() == pytest.approx([TOP, middle, BOTTOM], abs=1e-6)


def test_paper_variant_by_hand():
    # Reference (1, 1); d = 1, 3, 5: mean 3, population std sqrt(8/3); z = -1.2247, 0, 1.2247.
    emb = t([[1, 1], [1, 2], [1, 4], [4, 5]])
    success = torch.tensor([True, False, False, False])
    rewards = srpo_paper_rewards(emb, success, torch.zeros(4, dtype=torch.long), alpha=0.8)
    z = 2 / math.sqrt(8 / 3)
    expected = [1.0, 0.8 * S(z), 0.4, 0.8 * S(-z)]  # 0.618318, 0.4, 0.181682
    assert rewards.tolist() == pytest.approx(expected, abs=1e-6)
    assert expected[1] == pytest.approx(0.618318, abs=1e-6)


def test_paper_variant_single_failure_gets_half_alpha():
    emb = t([[1, 1], [4, 5]])
    rewards = srpo_paper_rewards(emb, torch.tensor([True, False]), torch.zeros(2, dtype=torch.long))
    assert rewards.tolist() == pytest.approx([1.0, 0.4], abs=1e-7)


def test_reference_failure_rewards_lie_in_bounds():
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(200, 16, generator=gen)
    success = torch.rand(200, generator=gen) < 0.3
    tasks = torch.randint(0, 4, (200,), generator=gen)
    rewards = srpo_reference_rewards(emb, success, tasks)
    failures = rewards[~success]
    assert failures.min() >= 0.004 and failures.max() <= 0.596
    # every task has both kinds, so each task's closest/farthest failure hits the bounds
    assert failures.min().item() == pytest.approx(BOTTOM, abs=1e-6)
    assert failures.max().item() == pytest.approx(TOP, abs=1e-6)
    assert (rewards[success] == 1).all()


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="variant"):
        SrpoRewardConfig(variant="papr")
    with pytest.raises(ValueError, match="reference_scope"):
        SrpoNodeConfig(reference_scope="world")
    node_type = NODE_TYPES.get("reward.srpo")
    assert node_type.build_config({"variant": "paper", "alpha": 0.5}).alpha == 0.5
    assert node_type.read_keys(None) == (K.TRAJ_EMBEDDING, K.SUCCESS, K.TASK_ID)


def _ctx(config: SrpoNodeConfig) -> NodeContext:
    return NodeContext(
        cfg=None,
        node_id="srpo",
        node_config=config,
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models={},
        state={},
        step=0,
        metrics=MetricSink(),
        device=torch.device("cpu"),
        run_dir=Path("."),
    )


@pytest.mark.parametrize("scope", ["global", "local"])
def test_node_writes_rewards_and_metrics(scope):
    # The "tasks are independent" batch: task 0 shaped, task 1 without reference, task 2 flat.
    emb = t([[1, 1], [10, 11], [1, 2], [1, 2], [1, 4], [10, 10], [4, 5]])
    batch = TensorDict(
        {
            K.TRAJ_EMBEDDING: emb,
            K.SUCCESS: torch.tensor([True, False, False, False, False, True, False]),
            K.TASK_ID: torch.tensor([0, 2, 0, 1, 0, 2, 0]),
        },
        batch_size=[7],
    )
    ctx = _ctx(SrpoNodeConfig(reference_scope=scope))
    out = srpo_node(ctx, batch)
    assert out[K.REWARDS].tolist() == pytest.approx(
        [1.0, 0.3, TOP, 0.0, 0.3, 1.0, BOTTOM], abs=1e-6
    )
    metrics = ctx.metrics.pop()
    assert metrics["srpo/success_rate"] == pytest.approx((2 / 7, 7.0, "mean"))
    failure_mean = (0.3 + TOP + 0.0 + 0.3 + BOTTOM) / 5
    assert metrics["srpo/failure_reward_mean"] == pytest.approx((failure_mean, 5.0, "mean"))
    assert metrics["srpo/tasks_without_reference"] == (1.0, 1.0, "max")


# --- the privileged oracle: 1 - progress in place of the embedding distance -----------------
# Task 0: one success and failures at progress 0.2, 0.6, 0.9 (distances 0.8, 0.4, 0.1: n = 1,
# 3/7, 0); task 1: failures only, left at 0 as SRPO leaves a task without a reference.
ORACLE_PROGRESS = [1.0, 0.2, 0.6, 0.9, 0.5, 0.7]
ORACLE_SUCCESS = [True, False, False, False, False, False]
ORACLE_TASKS = [0, 0, 0, 0, 1, 1]
ORACLE_REWARDS = [1.0, BOTTOM, 0.6 * S(10 * (0.5 - 3 / 7)), TOP, 0.0, 0.0]


def test_progress_oracle_by_hand():
    rewards = progress_oracle_rewards(
        torch.tensor(ORACLE_PROGRESS),
        torch.tensor(ORACLE_SUCCESS),
        torch.tensor(ORACLE_TASKS),
        SrpoRewardConfig(),
    )
    assert rewards.tolist() == pytest.approx(ORACLE_REWARDS, abs=1e-6)
    paper = progress_oracle_rewards(
        torch.tensor(ORACLE_PROGRESS),
        torch.tensor(ORACLE_SUCCESS),
        torch.tensor(ORACLE_TASKS),
        SrpoRewardConfig(variant="paper", alpha=0.8),
    )
    z = torch.tensor([0.8, 0.4, 0.1])  # standardised over task 0's failures
    z = (z - z.mean()) / z.std(correction=0)
    assert paper[1:4].tolist() == pytest.approx((0.8 * torch.sigmoid(-z)).tolist(), abs=1e-6)


@pytest.mark.parametrize("scope", ["global", "local"])
def test_progress_oracle_node_writes_the_rewards_and_srpos_metrics(scope):
    batch = TensorDict(
        {
            K.PRIVILEGED_PROGRESS: torch.tensor(ORACLE_PROGRESS),
            K.SUCCESS: torch.tensor(ORACLE_SUCCESS),
            K.TASK_ID: torch.tensor(ORACLE_TASKS),
        },
        batch_size=[6],
    )
    ctx = _ctx(SrpoNodeConfig(reference_scope=scope))
    out = progress_oracle_node(ctx, batch)
    assert out[K.REWARDS].tolist() == pytest.approx(ORACLE_REWARDS, abs=1e-6)
    metrics = ctx.metrics.pop()
    assert metrics["srpo/success_rate"] == pytest.approx((1 / 6, 6.0, "mean"))
    failure_mean = sum(ORACLE_REWARDS[1:]) / 5
    assert metrics["srpo/failure_reward_mean"] == pytest.approx((failure_mean, 5.0, "mean"))
    assert metrics["srpo/tasks_without_reference"] == (1.0, 1.0, "max")


def test_progress_oracle_refuses_a_simulator_without_progress():
    batch = TensorDict(
        {
            K.PRIVILEGED_PROGRESS: torch.tensor([1.0, math.nan]),
            K.SUCCESS: torch.tensor([True, False]),
            K.TASK_ID: torch.tensor([0, 0]),
        },
        batch_size=[2],
    )
    with pytest.raises(ValueError, match="needs privileged progress.*use reward.srpo"):
        progress_oracle_node(_ctx(SrpoNodeConfig(reference_scope="local")), batch)
