"""Normaliser: hand-computed maps both ways, round trips, buffers that travel with weights."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from policies.normalization import Normalizer, select_statistics

STATS = {
    "libero_spatial_no_noops": {
        "action": {"q01": [-1.0, 0.0, 2.0], "q99": [1.0, 4.0, 6.0], "mask": [True, True, False]},
        "proprio": {"q01": [0.0, -2.0], "q99": [2.0, 2.0], "mask": [True, False]},
    },
    "other": {"action": {"q01": [0.0] * 3, "q99": [1.0] * 3}},
}
ENTRY = STATS["libero_spatial_no_noops"]


def normalizer(convention: str = "none") -> Normalizer:
    out = Normalizer(3, 2, convention)
    out.set_statistics(ENTRY)
    return out


def test_to_env_by_hand() -> None:
    x = np.array([[0.0, -1.0, 0.3], [1.0, 0.5, -0.7]])
    out = normalizer().to_env(x)
    # 0.5 (x + 1)(q99 - q01) + q01 on masked-in dims; dim 2 (mask false) unchanged.
    assert out.dtype == np.float32
    assert np.allclose(out, [[0.0, 0.0, 0.3], [1.0, 3.0, -0.7]])
    no_mask = Normalizer(3, 0, "none")
    no_mask.set_statistics({"action": {"q01": [0.0] * 3, "q99": [2.0] * 3}})
    assert np.allclose(no_mask.to_env(x), x + 1.0)  # a missing mask means every dimension
    assert np.allclose(Normalizer(3, 0, "none").to_env(x), x)  # no statistics: identity


def test_libero_gripper_both_ways_by_hand() -> None:
    norm = Normalizer(2, 0, "libero")
    out = norm.to_env(np.array([[0.3, 0.0], [0.3, 1.0], [0.3, 0.2], [0.3, 0.8], [0.3, 0.5]]))
    # OpenVLA data: 0 = close, 1 = open; LIBERO: +1 = close, -1 = open; 0.5 gives sign 0.
    assert out[:, 1].tolist() == [1.0, -1.0, 1.0, -1.0, 0.0]
    assert out[:, 0].tolist() == pytest.approx([0.3] * 5)
    # Inverse: 1 - clip(g, 0, 1): open (-1) -> 1, close (+1) -> 0.
    targets = norm.from_env(torch.tensor([[0.3, -1.0], [0.3, 1.0], [0.3, 0.4]]))
    assert targets[:, 1].tolist() == pytest.approx([1.0, 0.0, 0.6])


def test_from_env_by_hand_and_clipped() -> None:
    actions = torch.tensor([[0.0, 1.0, 9.0], [5.0, -4.0, 2.5]])
    out = normalizer().from_env(actions)
    # 2 (a - q01) / (q99 - q01) - 1: dim 0 -> a, dim 1 -> a/2 - 1, clipped; dim 2 untouched.
    expected = torch.tensor([[0.0, -0.5, 9.0], [1.0, -1.0, 2.5]])
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize("convention", ["none", "libero"])
def test_round_trip_of_in_range_env_actions(convention: str) -> None:
    norm = Normalizer(7, 8, convention)
    rng = np.random.default_rng(0)
    low, high = rng.uniform(-2, -0.5, 7), rng.uniform(0.5, 2, 7)
    norm.set_statistics({"action": {"q01": low, "q99": high, "mask": [True] * 6 + [False]}})
    actions = rng.uniform(low, high, (50, 7))
    actions[:, 6] = rng.choice([-1.0, 1.0], 50) if convention == "libero" else actions[:, 6]
    targets = norm.from_env(torch.as_tensor(actions))
    assert float(targets[:, :6].abs().max()) <= 1.0
    assert np.allclose(norm.to_env(targets), actions, atol=1e-5)


def test_normalize_proprio_by_hand() -> None:
    state = torch.tensor([[1.0, 5.0], [3.0, -0.5], [-1.0, 0.25]])
    out = normalizer().normalize_proprio(state)
    # dim 0: 2 (s - 0) / 2 - 1 = s - 1, clipped; dim 1 (mask false): unchanged.
    expected = torch.tensor([[0.0, 5.0], [1.0, -0.5], [-1.0, 0.25]])
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=1e-6)
    assert torch.equal(Normalizer(3, 2, "none").normalize_proprio(state), state)
    assert torch.equal(Normalizer(3, 0, "none").normalize_proprio(state), state)


def test_statistics_are_persistent_buffers_that_survive_dtype_casts() -> None:
    source = normalizer("libero")
    state = source.state_dict()
    assert sorted(state) == sorted(
        f"{part}.{name}"
        for part in ("action", "proprio")
        for name in ("q01", "q99", "mask", "present")
    )
    fresh = Normalizer(3, 2, "libero")
    assert not fresh.has_statistics and fresh.statistics() is None
    fresh.load_state_dict(state)
    assert fresh.has_statistics and fresh.statistics() == {
        "action": {**ENTRY["action"]},
        "proprio": {**ENTRY["proprio"]},
    }
    precise = Normalizer(1, 0, "none")
    precise.set_statistics({"action": {"q01": [0.0123456789], "q99": [1.0]}})
    precise.to(torch.bfloat16)  # a policy cast to bf16 keeps float64 statistics
    assert precise.action.q01.dtype == torch.float64
    assert precise.action.q01.item() == 0.0123456789


def test_bad_statistics_name_the_problem() -> None:
    norm = Normalizer(7, 8, "none")
    with pytest.raises(ValueError, match="this policy has 7 action dimensions"):
        norm.set_statistics({"action": {"q01": [0.0] * 3, "q99": [1.0] * 3}})
    with pytest.raises(ValueError, match="need an 'action' entry"):
        norm.set_statistics({"proprio": {"q01": [0.0] * 8, "q99": [1.0] * 8}})
    with pytest.raises(ValueError, match="lack \\['q99'\\]"):
        norm.set_statistics({"action": {"q01": [0.0] * 7}})
    with pytest.raises(ValueError, match="this policy has 8 proprio dimensions"):
        norm.set_statistics(
            {
                "action": {"q01": [0.0] * 7, "q99": [1.0] * 7},
                "proprio": {"q01": [0.0] * 2, "q99": [1.0] * 2},
            }
        )
    with pytest.raises(ValueError, match="gripper_convention"):
        Normalizer(7, 0, "franka")
    assert not norm.has_statistics  # nothing was half-set


def test_select_statistics() -> None:
    assert select_statistics(STATS, "other") == ("other", STATS["other"])
    assert select_statistics({"only": STATS["other"]}, None) == ("only", STATS["other"])
    assert select_statistics(None, None) is None
    with pytest.raises(ValueError, match="set unnorm_key to one of"):
        select_statistics(STATS, None)
    with pytest.raises(ValueError, match="not one of"):
        select_statistics(STATS, "bridge_orig")
    with pytest.raises(ValueError, match="no dataset statistics"):
        select_statistics(None, "bridge_orig")


def test_a_suite_name_falls_back_to_its_no_noops_statistics(caplog) -> None:
    """OFT's LIBERO checkpoints name their statistics libero_10_no_noops; the suite name works
    and says which entry it used; an exact name is never replaced."""
    stats = {"libero_10_no_noops": STATS["other"], "libero_goal": STATS["other"]}
    with caplog.at_level(logging.WARNING):
        assert select_statistics(stats, "libero_10")[0] == "libero_10_no_noops"
    assert "using the statistics of 'libero_10_no_noops'" in caplog.text
    both = {**stats, "libero_10": STATS["other"]}
    assert select_statistics(both, "libero_10")[0] == "libero_10"
    assert select_statistics(stats, "libero_goal")[0] == "libero_goal"
    with pytest.raises(ValueError, match="'libero_spatial' is not one of"):
        select_statistics(stats, "libero_spatial")
