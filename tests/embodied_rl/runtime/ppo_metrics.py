"""A check of a PPO run's logged critic metrics against each other (test_ppo*, on Ray)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

# One critic update per step, from the weights that computed the rollout-time values: the
# overrides under which :func:`assert_value_loss_is_half_the_mean_squared_advantage` holds.
ONE_CRITIC_UPDATE = ("algorithm.critic.ppo_epochs=1", "algorithm.critic.num_mini_batches=1")


def assert_value_loss_is_half_the_mean_squared_advantage(m: Mapping[str, float]) -> None:
    """The logged value loss of one step recomputed from the step's other metrics.

    With one update (:data:`ONE_CRITIC_UPDATE`) the critic still has the weights that computed
    the rollout-time values, so ``V = V_old``: the value clip cannot bite and the token-mean
    loss is ``0.5 * mean((V - R)^2)`` over the valid tokens. GAE's returns are ``R = A + V``
    there, so ``R - V`` is the raw advantage, whose global mean and population std the GAE
    node logs: ``mean((V - R)^2) = std^2 + mean^2`` and ``mean = mean(R) - mean(V)``.
    """
    assert m["critic/vf_clip_fraction"] == 0.0, m
    mean, std = m["advantage/raw_mean"], m["advantage/raw_std"]
    assert mean == pytest.approx(m["critic/returns_mean"] - m["critic/values_mean"], abs=1e-5)
    assert m["critic/value_loss"] == pytest.approx(0.5 * (std**2 + mean**2), rel=1e-4), m
