"""DAPO pieces by hand: the over-length penalty and which groups dynamic sampling keeps."""

from __future__ import annotations

import pytest
import torch

from embodied_rl.nodes.filter import DynamicSamplingConfig, informative_groups
from embodied_rl.nodes.reward.overlong import overlong_penalty


def test_overlong_penalty_by_hand():
    # L_max = 10, L_c = 4: free up to 6 tokens, linear to -1 at 10, -1 beyond.
    lengths = torch.tensor([0, 6, 7, 8, 10, 11])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    assert torch.allclose(overlong_penalty(lengths, 10, 4), expected)


def test_uniform_reward_groups_are_dropped_and_order_is_kept():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.2, 0.2, 0.0, 1.0])
    groups = torch.tensor([5, 5, 9, 9, 3, 3, 7, 7])
    order = torch.tensor([4.0, 5.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0])
    kept = informative_groups(rewards, groups, order, DynamicSamplingConfig())
    assert kept == [9, 7]  # groups 5 and 3 have equal rewards; 9 comes first in order


def test_success_band_keeps_groups_with_mixed_outcomes():
    # success = reward >= 1: group 1 -> 2/4, group 2 -> 4/4, group 3 -> 0/4, group 4 -> 1/4
    rewards = torch.tensor([1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0.5, 0.5, 0], dtype=torch.float)
    groups = torch.arange(1, 5).repeat_interleave(4)
    order = torch.arange(16, dtype=torch.float)
    cfg = DynamicSamplingConfig(success_band=(0.1, 0.9))
    assert informative_groups(rewards, groups, order, cfg) == [1, 4]
    cfg = DynamicSamplingConfig(success_band=(0.3, 1.0))
    assert informative_groups(rewards, groups, order, cfg) == [1, 2]


def test_config_errors_say_what_to_change():
    with pytest.raises(ValueError, match="0 <= lo <= hi <= 1"):
        DynamicSamplingConfig(success_band=(0.9, 0.1))
    with pytest.raises(ValueError, match="on_shortfall"):
        DynamicSamplingConfig(on_shortfall="retry")
