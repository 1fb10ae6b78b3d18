"""The metrics of ``world_model_latents.py``: AUC by the Mann-Whitney U, Spearman with average
ranks, per-task z-scoring, leave-one-out success centroids (numpy), and the failure ranking
of SRPO's reward (``embodied_rl.algorithms.srpo``) against privileged progress with bootstrap
intervals.

See that script's docstring for what they measure and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

STD_FLOOR = 1e-6  # z-scoring: a constant dimension divides by this and contributes 0


def average_ranks(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` with ties given their average rank: (N,) float64."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1  # mean of ranks start+1..end+1
        start = end + 1
    return ranks


def mann_whitney_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """AUC of ``scores`` for positives (``labels`` true) vs negatives: the Mann-Whitney U over
    (positive, negative) pairs, a tie counting 1/2, divided by their number.

    Computed from average ranks: ``U = R_pos - P (P + 1) / 2``. ``nan`` without a positive or
    a negative.
    """
    pos = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = average_ranks(scores)
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson's r of the average ranks; ``nan`` if either is
    constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def zscore_stats(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension mean and population std (floored at ``STD_FLOOR``) of (N, D) embeddings."""
    x = np.asarray(embeddings, dtype=np.float64)
    return x.mean(axis=0), np.maximum(x.std(axis=0), STD_FLOOR)


def loo_centroids(z: np.ndarray, success: np.ndarray) -> np.ndarray:
    """Each episode's reference: the centroid of the successes other than itself.

    Args:
        z: (N, D) z-scored embeddings of one task.
        success: (N,) bool, at least 2 true.

    Returns:
        (N, D): for a failure the mean of all successes; for a success the mean of the others.
    """
    success = np.asarray(success, dtype=bool)
    n_succ = int(success.sum())
    if n_succ < 2:
        raise ValueError(f"leave-one-out centroids need >= 2 successes, got {n_succ}")
    total = z[success].sum(axis=0)
    centroids = np.repeat((total / n_succ)[None], len(z), axis=0)
    centroids[success] = (total[None] - z[success]) / (n_succ - 1)
    return centroids


def task_scores(embeddings: np.ndarray, success: np.ndarray) -> np.ndarray:
    """Scores of one task's episodes: minus the L2 distance of each z-scored embedding to the
    centroid of the task's other successes.

    Args:
        embeddings: (N, D) raw embeddings; success: (N,) bool with at least 2 successes.

    Returns:
        (N,) float64 scores (higher = closer to success).
    """
    mean, std = zscore_stats(embeddings)
    z = (np.asarray(embeddings, dtype=np.float64) - mean) / std
    return -np.linalg.norm(z - loo_centroids(z, success), axis=1)


def separation(tasks: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Metric 1 over tasks ``{instruction: (embeddings (N, D), success (N,))}``.

    Returns:
        ``pooled_auc`` (every scored episode), ``mean_task_auc``, counts, and ``per_task``
        (an ``auc`` or the reason it was ``skipped``).
    """
    per_task: dict[str, dict[str, Any]] = {}
    scores, labels = [], []
    for key, (emb, succ) in sorted(tasks.items()):
        succ = np.asarray(succ, dtype=bool)
        row: dict[str, Any] = {"episodes": len(succ), "successes": int(succ.sum())}
        row["failures"] = row["episodes"] - row["successes"]
        if row["successes"] < 2:
            row["skipped"] = "fewer than 2 successes"
        elif row["failures"] == 0:
            row["skipped"] = "no failure"
        else:
            s = task_scores(emb, succ)
            row["auc"] = mann_whitney_auc(s, succ)
            scores.append(s)
            labels.append(succ)
        per_task[key] = row
    scored = [r for r in per_task.values() if "auc" in r]
    pooled = np.concatenate(labels) if labels else np.zeros(0, dtype=bool)
    return {
        "tasks_scored": len(scored),
        "tasks_skipped": {
            reason: sum(r.get("skipped") == reason for r in per_task.values())
            for reason in ("fewer than 2 successes", "no failure")
        },
        "episodes": len(pooled),
        "successes": int(pooled.sum()),
        "failures": int((~pooled).sum()),
        "pooled_auc": mann_whitney_auc(np.concatenate(scores), pooled) if scores else None,
        "mean_task_auc": float(np.mean([r["auc"] for r in scored])) if scored else None,
        "per_task": per_task,
    }


def progress_distances(
    prefixes: np.ndarray, embeddings: np.ndarray, success: np.ndarray, index: int
) -> np.ndarray:
    """Distances of one success's prefix embeddings to the centroid of the task's other
    successes, in the task's z-scoring (:func:`zscore_stats` of ``embeddings``).

    Args:
        prefixes: (F, D) embeddings of episode ``index``'s prefixes.
        embeddings: (N, D) full-episode embeddings of the task; success: (N,) bool.
        index: the episode (a success; the task has another one).

    Returns:
        (F,) float64 L2 distances.
    """
    mean, std = zscore_stats(embeddings)
    z = (np.asarray(embeddings, dtype=np.float64) - mean) / std
    reference = loo_centroids(z, success)[index]
    zp = (np.asarray(prefixes, dtype=np.float64) - mean) / std
    return np.linalg.norm(zp - reference, axis=1)


def progress_summary(curves: list[np.ndarray], fractions: Sequence[float]) -> dict[str, Any]:
    """Metric 2 from per-episode distance curves (each (F,) over ``fractions``).

    Returns:
        Spearman of ``fractions`` vs minus the distance per episode (mean, population std,
        the values; a constant curve gives ``nan`` and is left out of mean and std), and the
        mean/std over episodes of each curve divided by its own maximum.
    """
    rhos = [spearman(fractions, -d) for d in curves]
    finite = [r for r in rhos if np.isfinite(r)]
    norm = np.array([d / max(float(d.max()), 1e-12) for d in curves]).reshape(-1, len(fractions))
    return {
        "episodes": len(curves),
        "spearman_mean": float(np.mean(finite)) if finite else None,
        "spearman_std": float(np.std(finite)) if finite else None,
        "spearman": [None if not np.isfinite(r) else r for r in rhos],
        "fractions": list(fractions),
        "normalisation": "each episode's distances divided by its maximum distance",
        "curve_mean": norm.mean(axis=0).tolist() if len(norm) else None,
        "curve_std": norm.std(axis=0).tolist() if len(norm) else None,
    }


MIN_RANKED_FAILURES = 3  # a task's failures ranked: fewer give no meaningful rank correlation


def _bootstrap_interval(
    pieces: Sequence[tuple[np.ndarray, np.ndarray]], resamples: int, rng: np.random.Generator
) -> list[float] | None:
    """95% percentile interval of the Spearman correlation of the concatenated ``pieces``
    ``[(rewards (F_k,), progress (F_k,)), ...]``, each resampled with replacement within
    itself (a task keeps its number of failures); ``None`` when no resample is defined."""
    values = []
    for _ in range(resamples):
        drawn = [rng.integers(0, len(r), len(r)) for r, _ in pieces]
        rewards = np.concatenate([r[ix] for (r, _), ix in zip(pieces, drawn)])
        progress = np.concatenate([p[ix] for (_, p), ix in zip(pieces, drawn)])
        rho = spearman(rewards, progress)
        if not np.isnan(rho):
            values.append(rho)
    if not values:
        return None
    low, high = np.percentile(values, [2.5, 97.5])
    return [float(low), float(high)]


def failure_ranking(
    tasks: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Metric 3, the reward's quality where SRPO uses it: does SRPO's failure reward rank the
    failed episodes of a task as their privileged progress does?

    Args:
        tasks: ``{instruction: (rewards (N,), success (N,), progress (N,))}``: SRPO's reward
            of every episode (computed with the task's successes as references), its outcome,
            and its privileged progress at the end (NaN: not recorded).
        resamples: bootstrap resamples of the 95% intervals; seed: their generator's seed.

    Returns:
        ``pooled_spearman`` over the failures of every ranked task with its ``pooled_interval``,
        ``mean_task_spearman``, ``tasks_ranked`` and ``per_task`` (a ``spearman`` with its
        ``interval``, or the reason it was ``skipped``: no success to shape against, fewer
        than :data:`MIN_RANKED_FAILURES` failures with a recorded progress).
    """
    rng = np.random.default_rng(seed)
    per_task: dict[str, dict[str, Any]] = {}
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    for key, (rewards, succ, progress) in sorted(tasks.items()):
        succ, progress = np.asarray(succ, dtype=bool), np.asarray(progress, dtype=np.float64)
        failed = ~succ & ~np.isnan(progress)
        row: dict[str, Any] = {"successes": int(succ.sum()), "failures": int(failed.sum())}
        if not succ.any():
            row["skipped"] = "no success"
        elif failed.sum() < MIN_RANKED_FAILURES:
            row["skipped"] = f"fewer than {MIN_RANKED_FAILURES} failures with progress"
        else:
            piece = (np.asarray(rewards, dtype=np.float64)[failed], progress[failed])
            row["spearman"] = spearman(*piece)
            row["interval"] = _bootstrap_interval([piece], resamples, rng)
            pieces.append(piece)
        per_task[key] = row
    ranked = [r["spearman"] for r in per_task.values() if "spearman" in r]
    finite = [rho for rho in ranked if not np.isnan(rho)]
    pooled = spearman(*map(np.concatenate, zip(*pieces))) if pieces else float("nan")
    return {
        "tasks_ranked": len(ranked),
        "failures_ranked": int(sum(len(r) for r, _ in pieces)),
        "pooled_spearman": None if np.isnan(pooled) else pooled,
        "pooled_interval": _bootstrap_interval(pieces, resamples, rng) if pieces else None,
        "mean_task_spearman": float(np.mean(finite)) if finite else None,
        "per_task": per_task,
    }


def rank_failures(
    full: np.ndarray, infos: Sequence[Any], groups: dict[str, list[int]]
) -> dict[str, Any] | None:
    """Metric 3 (:func:`failure_ranking`) of ``full`` (N, D) embeddings of ``infos``: SRPO's failure reward of each task's
    episodes (the reference shaping, the task's successes as references) against their
    privileged progress; ``None`` when no video recorded a progress (demos, older files)."""
    if all(info.progress is None for info in infos):
        return None
    import torch

    from embodied_rl.algorithms.srpo import SrpoRewardConfig, srpo_rewards

    tasks = {}
    for key, ix in groups.items():
        success = torch.tensor([infos[i].success for i in ix])
        rewards = srpo_rewards(
            torch.from_numpy(full[ix]), success, torch.zeros(len(ix), dtype=torch.long),
            SrpoRewardConfig(),
        )  # fmt: skip
        progress = [np.nan if infos[i].progress is None else infos[i].progress for i in ix]
        tasks[key] = (rewards.numpy(), success.numpy(), np.array(progress))
    return failure_ranking(tasks)
