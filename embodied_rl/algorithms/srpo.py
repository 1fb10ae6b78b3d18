"""SRPO trajectory rewards (docs/ALGORITHMS.md, "SRPO"; arXiv 2511.15605).

A successful trajectory gets reward 1. A failed one is scored by how close its trajectory
embedding (a frozen video encoder's output, ``(N, D)``) lies to the successful trajectories
of the same task: the *reference set*. Two shapings of that distance are provided:

- ``reference`` (the SRPO reference implementation): distances min-max normalised over the
  task's failures, ``r_i = 0.6 * sigmoid(10 * (0.5 - n_i))``, so failures lie in
  ``[0.6*sigmoid(-5), 0.6*sigmoid(5)] = [0.004, 0.596]``;
- ``paper`` (the paper's formula): ``r_i = alpha * phi(z_i)`` with ``z_i`` the distance
  standardised over the task's failures and ``phi(x) = sigmoid(-x)`` decreasing.

Both use the same reference points: the successes are standardised per dimension, clustered
with DBSCAN, and the cluster centres (mapped back to raw space) are the references; when
DBSCAN finds no cluster (e.g. one success, or all successes far apart) the single reference
is the mean success embedding. ``d_i`` is the Euclidean distance to the nearest reference.

An all-zero embedding marks an invalid trajectory (e.g. no frames): as a failure it gets
reward 0 and takes no part in the normalisation; as a success it keeps reward 1 (success is
the simulator's verdict) but is not a reference point. Everything is computed in float64 on
CPU, so every rank that computes the same batch gets bit-identical rewards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from embodied_rl.checks import check_range

VARIANTS = ("reference", "paper")
RANGE_EPS = 1e-6  # reference impl.: distance range (or, for "paper", std) below this -> flat
CONSTANT_DIM_EPS = 1e-12  # a success dimension with std below this is divided by 1


@dataclass
class SrpoRewardConfig:
    """Options of the SRPO reward.

    Attributes:
        variant: ``reference`` (min-max + sigmoid, the reference implementation) or
            ``paper`` (``alpha * sigmoid(-z)``).
        eps: DBSCAN neighbourhood radius, in standardised units.
        min_samples: DBSCAN core-point threshold (the point itself counts).
        alpha: the paper variant's maximum failure reward (0.8 was best in its ablation).
        scale: the reference variant's maximum failure reward (0.6).
        sharpness: the reference variant's sigmoid slope (10).
    """

    variant: str = "reference"
    eps: float = 0.5
    min_samples: int = 2
    alpha: float = 0.8
    scale: float = 0.6
    sharpness: float = 10.0

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"srpo variant must be one of {VARIANTS}, got {self.variant!r}")
        check_range("srpo eps (DBSCAN radius)", self.eps, 0, low_open=True)
        check_range("srpo min_samples", self.min_samples, 1)
        for name in ("alpha", "scale", "sharpness"):
            check_range(f"srpo {name}", getattr(self, name), 0)


def _pairwise_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact Euclidean distances (A, B) between rows of ``a`` (A, D) and ``b`` (B, D)."""
    # The matmul shortcut of cdist loses digits; DBSCAN compares distances against eps.
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")


def dbscan(points: torch.Tensor, eps: float, min_samples: int) -> torch.Tensor:
    """DBSCAN clustering (Ester et al., 1996) with Euclidean distance, O(N^2) memory.

    A point is *core* when at least ``min_samples`` points (itself included) lie within
    distance ``<= eps``. Clusters grow from core points in index order by breadth-first search
    over neighbourhoods; a non-core point reached by a cluster is a *border* point and joins
    the first cluster that reaches it; unreached points are noise. The result is
    deterministic.

    Args:
        points: (N, D) float.
        eps: neighbourhood radius.
        min_samples: core-point threshold.

    Returns:
        (N,) int64 cluster labels ``0, 1, ...`` in order of discovery; ``-1`` marks noise.
    """
    points = torch.as_tensor(points, dtype=torch.float64)
    neighbours = _pairwise_distances(points, points) <= eps  # (N, N), diagonal True
    is_core = (neighbours.sum(dim=1) >= min_samples).tolist()
    labels = [-1] * len(points)
    cluster = -1
    for seed in range(len(points)):
        if labels[seed] != -1 or not is_core[seed]:
            continue
        cluster += 1
        labels[seed] = cluster
        frontier = deque([seed])
        while frontier:
            point = frontier.popleft()
            for other in neighbours[point].nonzero().flatten().tolist():
                if labels[other] == -1:
                    labels[other] = cluster
                    if is_core[other]:  # only core points extend the cluster
                        frontier.append(other)
    return torch.tensor(labels, dtype=torch.int64)


def valid_embeddings(embeddings: torch.Tensor) -> torch.Tensor:
    """(N,) bool: rows of ``embeddings`` (N, D) that are not all zero."""
    return (embeddings != 0).any(dim=-1)


def reference_points(successes: torch.Tensor, eps: float, min_samples: int) -> torch.Tensor:
    """The reference set of one task from its successful embeddings.

    Successes are standardised per dimension (mean and population std over the successes,
    as a standard scaler does; a constant dimension is divided by 1 instead of 0), then
    clustered with DBSCAN. Each cluster centre is the mean of its standardised points mapped
    back to raw space (``c * std + mean``); noise points are not references. Without any
    cluster the reference is the mean success embedding.

    Args:
        successes: (S, D) float, S >= 1, valid embeddings only.

    Returns:
        (C, D) float64 reference points, C >= 1.
    """
    successes = successes.double()
    mean = successes.mean(dim=0)
    std = successes.std(dim=0, correction=0)
    std = torch.where(std < CONSTANT_DIM_EPS, torch.ones_like(std), std)
    standardised = (successes - mean) / std
    labels = dbscan(standardised, eps, min_samples)
    clusters = [c for c in labels.unique().tolist() if c >= 0]
    if not clusters:
        return mean[None]
    centres = torch.stack([standardised[labels == c].mean(dim=0) for c in clusters])
    return centres * std + mean


def nearest_reference_distance(points: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    """``d_i = min_c ||E_i - c||_2`` for points (F, D) and references (C, D); returns (F,)."""
    return _pairwise_distances(points.double(), references.double()).min(dim=1).values


def reference_shaping(distances: torch.Tensor, scale: float, sharpness: float) -> torch.Tensor:
    """Reference implementation: ``scale * sigmoid(sharpness * (0.5 - n_i))``, min-max ``n_i``.

    ``n_i = (d_i - min d) / (max d - min d)``, or 0.5 for every failure when the range is
    below 1e-6 (so all get ``scale * sigmoid(0) = scale / 2``).

    Args:
        distances: (F,) float64, F >= 1.

    Returns:
        (F,) float64 failure rewards in ``[scale*sigmoid(-sharpness/2), scale*sigmoid(sharpness/2)]``.
    """
    low, high = distances.min(), distances.max()
    if high - low < RANGE_EPS:
        normalised = torch.full_like(distances, 0.5)
    else:
        normalised = (distances - low) / (high - low)
    return scale * torch.sigmoid(sharpness * (0.5 - normalised))


def paper_shaping(distances: torch.Tensor, alpha: float) -> torch.Tensor:
    """Paper (arXiv 2511.15605): ``alpha * phi((d_i - mean d) / std d)``, ``phi(x) = sigmoid(-x)``.

    Mean and population std are over the task's valid failures; a std below 1e-6 (e.g. one
    failure) gives ``z = 0`` and so ``alpha / 2``.

    Args:
        distances: (F,) float64, F >= 1.

    Returns:
        (F,) float64 failure rewards in ``(0, alpha)``.
    """
    std = distances.std(correction=0)
    if std < RANGE_EPS:
        z = torch.zeros_like(distances)
    else:
        z = (distances - distances.mean()) / std
    return alpha * torch.sigmoid(-z)


def _shape(distances: torch.Tensor, config: SrpoRewardConfig) -> torch.Tensor:
    if config.variant == "paper":
        return paper_shaping(distances, config.alpha)
    return reference_shaping(distances, config.scale, config.sharpness)


def srpo_rewards(
    embeddings: torch.Tensor,
    success: torch.Tensor,
    task_keys: torch.Tensor,
    config: SrpoRewardConfig,
) -> torch.Tensor:
    """SRPO rewards of a batch, each task key handled independently.

    Args:
        embeddings: (N, D) float trajectory embeddings; an all-zero row is invalid.
        success: (N,) bool.
        task_keys: (N,) int64; the reference set of a failure is its task key's successes.
        config: the shaping variant and its constants.

    Returns:
        (N,) float32: 1 for successes; for valid failures the shaped reward when the task has
        at least one valid success, else 0; 0 for invalid failures.
    """
    embeddings = embeddings.detach().cpu().double()
    success = success.detach().cpu().bool()
    task_keys = task_keys.detach().cpu().long()

    def distances(failures: torch.Tensor, refs: torch.Tensor) -> torch.Tensor:
        references = reference_points(embeddings[refs], config.eps, config.min_samples)
        return nearest_reference_distance(embeddings[failures], references)

    return _shape_failures(success, task_keys, valid_embeddings(embeddings), config, distances)


def _shape_failures(
    success: torch.Tensor,
    task_keys: torch.Tensor,
    valid: torch.Tensor,
    config: SrpoRewardConfig,
    distances: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The per-task rule both SRPO rewards share: successes 1; the valid failures of a task
    with a valid success shaped from ``distances(failures, refs)`` ((F,) float64 from the
    (F,) failure indices and the (N,) bool reference mask); the other failures 0.

    Returns:
        (N,) float32.
    """
    rewards = success.double()  # successes 1, every failure 0 until shaped
    for key in task_keys.unique().tolist():
        in_task = task_keys == key
        refs = in_task & success & valid
        failures = (in_task & ~success & valid).nonzero().flatten()
        if not refs.any() or len(failures) == 0:
            continue  # nothing to compare with (or nobody to shape): failures stay 0
        rewards[failures] = _shape(distances(failures, refs), config)
    return rewards.float()


def progress_oracle_rewards(
    progress: torch.Tensor,
    success: torch.Tensor,
    task_keys: torch.Tensor,
    config: SrpoRewardConfig,
) -> torch.Tensor:
    """SRPO's rewards with privileged progress in place of the embedding distance: an oracle.

    The failure's distance to its task's successes is ``1 - progress`` (a success has progress
    1), shaped exactly as :func:`srpo_rewards` shapes embedding distances, with the same rule
    that a task needs a success in the batch before its failures are shaped. So the oracle
    differs from SRPO only in how well it ranks the failures: an upper bound for an encoder,
    from simulator state no policy sees; never a default.

    Args:
        progress: (N,) float in [0, 1], each episode's privileged progress at its end.
        success: (N,) bool.
        task_keys: (N,) int64.
        config: the shaping variant and its constants.

    Returns:
        (N,) float32: 1 for successes; the shaped reward for the failures of a task with a
        success; 0 for the other failures.
    """
    distance = 1.0 - progress.detach().cpu().double().clamp(0.0, 1.0)
    success = success.detach().cpu().bool()
    task_keys = task_keys.detach().cpu().long()
    every = torch.ones_like(success)  # progress is defined for every episode
    return _shape_failures(success, task_keys, every, config, lambda f, _: distance[f])


def srpo_reference_rewards(
    embeddings: torch.Tensor,
    success: torch.Tensor,
    task_keys: torch.Tensor,
    **options: Any,
) -> torch.Tensor:
    """:func:`srpo_rewards` with the reference implementation's shaping (options override)."""
    return srpo_rewards(
        embeddings, success, task_keys, SrpoRewardConfig(variant="reference", **options)
    )


def srpo_paper_rewards(
    embeddings: torch.Tensor,
    success: torch.Tensor,
    task_keys: torch.Tensor,
    alpha: float = 0.8,
    **options: Any,
) -> torch.Tensor:
    """:func:`srpo_rewards` with the paper's shaping ``alpha * sigmoid(-z)``."""
    return srpo_rewards(
        embeddings, success, task_keys, SrpoRewardConfig(variant="paper", alpha=alpha, **options)
    )


def tasks_without_reference(
    embeddings: torch.Tensor, success: torch.Tensor, task_keys: torch.Tensor
) -> int:
    """Number of task keys with valid failures but no valid success (their failures stay 0).

    Args:
        embeddings: (N, D); success: (N,) bool; task_keys: (N,) int64.
    """
    valid = valid_embeddings(embeddings.detach().cpu())
    return tasks_without_success(success, task_keys, valid)


def tasks_without_success(
    success: torch.Tensor, task_keys: torch.Tensor, valid: torch.Tensor | None = None
) -> int:
    """Number of task keys with (valid) failures but no (valid) success.

    Args:
        success: (N,) bool; task_keys: (N,) int64; valid: (N,) bool, ``None`` = all valid.
    """
    success, task_keys = success.detach().cpu().bool(), task_keys.detach().cpu().long()
    valid = torch.ones_like(success) if valid is None else valid.detach().cpu().bool()
    with_failure = set(task_keys[valid & ~success].tolist())
    with_success = set(task_keys[valid & success].tolist())
    return len(with_failure - with_success)
