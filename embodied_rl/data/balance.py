"""Balanced assignment of weighted units (samples or sample groups) to data-parallel bins.

Every rank of a redistribution runs these functions on the same all-gathered metadata, so they
must be pure and deterministic: no randomness, no dependence on dict or set iteration order,
ties broken by index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from embodied_rl.checks import check_range


def assign_units(weights: Sequence[float], num_bins: int) -> list[int]:
    """Greedy longest-processing-time (LPT) assignment of units to bins.

    Units are visited by weight, heaviest first (equal weights: lower unit index first), and
    each goes to the bin with the smallest current load (equal loads: lowest bin index).

    Bound: ``max(bin_loads) <= mean load + max(weights)`` where the mean load is
    ``sum(weights) / num_bins``. Proof (holds for any list scheduling order): let unit ``j``
    be the last unit placed on the most loaded bin. When it was placed, that bin was the
    lightest, so its load then was at most the average of the loads at that time, which is at
    most ``sum(weights) / num_bins``. Adding ``weights[j] <= max(weights)`` gives the bound.
    LPT order additionally guarantees ``max load <= 4/3 * optimum``.

    Args:
        weights: Non-negative weight per unit, length ``U``.
        num_bins: Number of bins (data-parallel shards), at least 1.

    Returns:
        The bin index of each unit, a list of length ``U`` with values in ``[0, num_bins)``.

    Raises:
        ValueError: If ``num_bins < 1`` or a weight is negative or not finite.
    """
    check_range("num_bins", num_bins, 1)
    for index, weight in enumerate(weights):
        # NaN fails both comparisons, so it is caught here too.
        if not 0 <= weight < float("inf"):
            raise ValueError(f"unit {index} has weight {weight}; weights must be finite and >= 0")
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    # Heap entries (load, bin): the heap's tuple order gives "lightest, then lowest index".
    heap = [(0.0, b) for b in range(num_bins)]
    assignment = [0] * len(weights)
    for unit in order:
        load, bin_index = heapq.heappop(heap)
        assignment[unit] = bin_index
        heapq.heappush(heap, (load + weights[unit], bin_index))
    return assignment


def bin_loads(weights: Sequence[float], assignment: Sequence[int], num_bins: int) -> list[float]:
    """Total weight per bin.

    Args:
        weights: Weight per unit, length ``U``.
        assignment: Bin index per unit, length ``U``.
        num_bins: Number of bins.

    Returns:
        Load of each bin, a list of length ``num_bins``.
    """
    if len(weights) != len(assignment):
        raise ValueError(f"{len(weights)} weights but {len(assignment)} assignments")
    loads = [0.0] * num_bins
    for weight, bin_index in zip(weights, assignment):
        loads[bin_index] += weight
    return loads


def round_robin(num_units: int, num_bins: int) -> list[int]:
    """Unit ``i`` to bin ``i % num_bins``: the unbalanced baseline that ignores weights."""
    return [i % num_bins for i in range(num_units)]


def load_bound(weights: Sequence[float], num_bins: int) -> float:
    """The guaranteed ceiling on the maximum bin load of :func:`assign_units`.

    Returns:
        ``sum(weights) / num_bins + max(weights)`` (0 for no units).
    """
    if not weights:
        return 0.0
    return sum(weights) / num_bins + max(weights)
