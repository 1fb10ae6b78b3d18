"""Balanced unit assignment: hand-checked examples, the load bound, and the LPT advantage."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embodied_rl.data.balance import assign_units, bin_loads, load_bound, round_robin
from tests.hypothesis_profiles import examples


def test_hand_checked_assignment() -> None:
    # Visit order by weight desc, ties by index: u1(7) u4(5) u0(3) u2(3) u3(2) u5(1).
    # u1 -> b0 (7,0,0); u4 -> b1 (7,5,0); u0 -> b2 (7,5,3); u2 -> b2 (7,5,6);
    # u3 -> b1 (7,7,6); u5 -> b2 (7,7,7).
    weights = [3, 7, 3, 2, 5, 1]
    assert assign_units(weights, 3) == [2, 0, 2, 1, 1, 2]
    assert bin_loads(weights, assign_units(weights, 3), 3) == [7.0, 7.0, 7.0]


def test_equal_weights_fill_bins_round_robin_and_extra_bins_stay_empty() -> None:
    assert assign_units([1, 1, 1, 1, 1], 2) == [0, 1, 0, 1, 0]
    # Fewer units than bins: the lowest bins get one each, the rest get nothing.
    assert assign_units([2.0, 5.0], 4) == [1, 0]
    assert assign_units([], 3) == []


def test_zero_weight_units_go_to_the_lowest_lightest_bin() -> None:
    # Loads stay equal (0) after each zero-weight unit, so the lowest index wins every time.
    assert assign_units([0, 0, 0], 2) == [0, 0, 0]
    assert assign_units([0, 4, 0], 2) == [1, 0, 1]


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_bins"):
        assign_units([1.0], 0)
    with pytest.raises(ValueError, match="unit 1"):
        assign_units([1.0, -2.0], 2)
    with pytest.raises(ValueError, match="unit 0"):
        assign_units([float("nan")], 2)


def test_balancing_beats_round_robin_on_skewed_lengths() -> None:
    # Long responses at every other position: round-robin piles all long ones on bin 0.
    weights = [512.0 if i % 2 == 0 else 16.0 for i in range(16)]
    rr = bin_loads(weights, round_robin(len(weights), 2), 2)
    lpt = bin_loads(weights, assign_units(weights, 2), 2)
    assert rr == [8 * 512.0, 8 * 16.0]
    assert lpt == [4 * 512.0 + 4 * 16.0, 4 * 512.0 + 4 * 16.0]
    assert max(lpt) < 0.6 * max(rr)


@settings(max_examples=examples(200))
@given(
    weights=st.lists(st.integers(min_value=0, max_value=1000), max_size=60),
    num_bins=st.integers(min_value=1, max_value=9),
)
def test_assignment_properties(weights: list[int], num_bins: int) -> None:
    assignment = assign_units(weights, num_bins)
    # Every unit gets exactly one valid bin.
    assert len(assignment) == len(weights)
    assert all(0 <= b < num_bins for b in assignment)
    # Deterministic: the same input gives the same answer (every rank computes it).
    assert assign_units(list(weights), num_bins) == assignment
    loads = bin_loads(weights, assignment, num_bins)
    assert sum(loads) == sum(weights)
    assert max(loads) <= load_bound(weights, num_bins) + 1e-9


def _optimal_max_load(weights: list[int], num_bins: int) -> int:
    """Exhaustive optimum of the max bin load (tiny inputs only)."""
    best = sum(weights)
    for assignment in itertools.product(range(num_bins), repeat=len(weights)):
        best = min(best, max(bin_loads(weights, assignment, num_bins)))
    return best


@settings(max_examples=examples(60))
@given(
    weights=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=7),
    num_bins=st.integers(min_value=2, max_value=3),
)
def test_lpt_within_four_thirds_of_optimum(weights: list[int], num_bins: int) -> None:
    loads = bin_loads(weights, assign_units(weights, num_bins), num_bins)
    optimum = _optimal_max_load(weights, num_bins)
    assert optimum <= max(loads) <= (4 / 3 - 1 / (3 * num_bins)) * optimum + 1e-9
