"""MARFT's agent-level credit assignment (advantage.marft) against hand-computed numbers,
and the digit-team reward by hand."""

from __future__ import annotations

import pytest
import torch

import embodied_rl.nodes  # noqa: F401  (registers advantage.marft)
from embodied_rl import keys as K
from embodied_rl.algorithms.marft import (
    agent_level_gae,
    agent_state_values,
    team_reward_on_last_agent,
)
from embodied_rl.data.batch import make_batch
from embodied_rl.nodes.advantage import MarftAdvantageConfig, marft_advantage_node
from embodied_rl.nodes.reward.tasks import digit_team_reward
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.tasks.digit_team import (
    DigitTeamRewardConfig,
    answer_digits,
    team_answer,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, t(expected), atol=atol, rtol=0.0)


def test_two_agents_by_hand():
    # V_1 = 0.2 (task alone), V_2 = 0.5 (task + agent 1's message), team reward R = 1.
    # delta_2 = 1 - 0.5 = 0.5;  delta_1 = 0 + 0.5 - 0.2 = 0.3
    # lam = 0.5: A_2 = 0.5, A_1 = 0.3 + 0.5 * 0.5 = 0.55;  returns = A + V = [0.75, 1.0]
    rewards = team_reward_on_last_agent(t([1.0]), 2)
    close(rewards, [[0.0, 1.0]])
    adv, ret = agent_level_gae(rewards, t([[0.2, 0.5]]), gamma=1.0, lam=0.5)
    close(adv, [[0.55, 0.5]])
    close(ret, [[0.75, 1.0]])
    # lam = 0: agent 1 is credited only with the change its message made: V_2 - V_1.
    adv, _ = agent_level_gae(rewards, t([[0.2, 0.5]]), gamma=1.0, lam=0.0)
    close(adv, [[0.3, 0.5]])
    # lam = 1: every agent gets R - V_k.
    adv, ret = agent_level_gae(rewards, t([[0.2, 0.5]]), gamma=1.0, lam=1.0)
    close(adv, [[0.8, 0.5]])
    close(ret, [[1.0, 1.0]])


def test_three_agents_with_discount_by_hand():
    # V = [0.1, 0.4, 0.3], R = 0 (a failed episode), gamma = 0.9, lam = 0.5.
    # delta_3 = 0 - 0.3 = -0.3
    # delta_2 = 0.9 * 0.3 - 0.4 = -0.13
    # delta_1 = 0.9 * 0.4 - 0.1 = 0.26
    # A_3 = -0.3;  A_2 = -0.13 + 0.45 * -0.3 = -0.265;  A_1 = 0.26 + 0.45 * -0.265 = 0.14075
    rewards = team_reward_on_last_agent(t([0.0]), 3)
    adv, ret = agent_level_gae(rewards, t([[0.1, 0.4, 0.3]]), gamma=0.9, lam=0.5)
    close(adv, [[0.14075, -0.265, -0.3]])
    close(ret, [[0.24075, 0.135, 0.0]])


def test_agent_state_value_is_the_value_before_the_first_response_token():
    close(agent_state_values(t([[0.7, 0.1, 0.0], [0.3, 0.9, 0.5]])), [0.7, 0.3])


def ctx_for(config) -> NodeContext:
    return NodeContext.single_process("advantage", config, metrics=MetricSink())


def marft_batch() -> dict:
    """Two episodes of agents a (2 response tokens, the second one padding in episode 1)
    and b (1 token), with their critic values and the team rewards."""
    return {
        K.SAMPLE_ID: torch.arange(2),
        K.REWARDS: t([1.0, 0.0]),
        "a/values": t([[0.2, 9.0], [0.6, 9.0]]),  # only position 0 is V_a
        "a/response_mask": t([[1, 1], [1, 0]]),
        "b/values": t([[0.5], [0.1]]),
        "b/response_mask": t([[1], [1]]),
    }


def test_node_broadcasts_each_agents_advantage_over_its_tokens():
    config = MarftAdvantageConfig(agents=["a", "b"], gamma=1.0, lam=0.5, whiten=False)
    ctx = ctx_for(config)
    out = marft_advantage_node(ctx, make_batch(marft_batch()))
    # Episode 1: A_b = 1 - 0.5 = 0.5, A_a = (0.5 - 0.2) + 0.5 * 0.5 = 0.55.
    # Episode 2: A_b = 0 - 0.1 = -0.1, A_a = (0.1 - 0.6) + 0.5 * -0.1 = -0.55.
    close(out["a/advantages"], [[0.55, 0.55], [-0.55, 0.0]])
    close(out["b/advantages"], [[0.5], [-0.1]])
    close(out["a/returns"], [[0.75, 0.75], [0.05, 0.0]])
    close(out["b/returns"], [[1.0], [0.0]])
    metrics = {name: value for name, (value, _, _) in ctx.metrics.pop().items()}
    assert metrics["marft/a/value"] == pytest.approx(0.4)
    assert metrics["marft/a/advantage_raw"] == pytest.approx(0.0)
    assert metrics["marft/b/advantage_raw"] == pytest.approx(0.2)


def test_node_whitens_each_agent_over_its_episodes():
    config = MarftAdvantageConfig(agents=["a", "b"], gamma=1.0, lam=0.5, whiten=True)
    out = marft_advantage_node(ctx_for(config), make_batch(marft_batch()))
    # a: [0.55, -0.55] -> mean 0, unbiased std 0.7778 -> +-0.7071; b: [0.5, -0.1] -> +-0.7071.
    s = 0.5**0.5
    close(out["a/advantages"], [[s, s], [-s, 0.0]], atol=1e-5)
    close(out["b/advantages"], [[s], [-s]], atol=1e-5)


def test_marft_config_refuses_fewer_than_two_agents_and_bad_ranges():
    with pytest.raises(ValueError, match="two or more distinct agents"):
        MarftAdvantageConfig(agents=["a"])
    with pytest.raises(ValueError, match="two or more distinct agents"):
        MarftAdvantageConfig(agents=["a", "a"])
    with pytest.raises(ValueError, match="lam must be in"):
        MarftAdvantageConfig(agents=["a", "b"], lam=1.5)


# ----------------------------------------------------------------------------- digit team
def test_team_answer_needs_one_digit_from_every_agent():
    assert team_answer(["8", "3"]) == "83"
    assert team_answer(["0", "7"]) == "07"
    assert team_answer(["", "7"]) == "" and team_answer(["12", "3"]) == ""
    assert answer_digits("7", 2) == "07" and answer_digits("83", 2) == "83"
    with pytest.raises(ValueError, match="cannot be written with 2 digits"):
        answer_digits("100", 2)
    with pytest.raises(ValueError, match="cannot be written with 2 digits"):
        answer_digits("-3", 2)


def test_digit_team_reward_by_hand():
    config = DigitTeamRewardConfig(agents=["tens", "units"], partial_weight=0.5, partial_scale=50)
    batch = make_batch(
        {
            K.ANSWER_TEXT: ["83", "7", "83", "40"],
            "tens/response_text": ["8", "0", "7", "4"],
            "units/response_text": ["3", "7", "9", ""],
        }
    )
    ctx = NodeContext.single_process("reward", config, metrics=MetricSink())
    out = digit_team_reward(ctx, batch)
    # 83 exact; 07 = 7 exact; 79 vs 83: 0.5 * (1 - 4/50) = 0.46; "4" + "" is invalid: 0.
    close(out[K.REWARDS], [1.0, 1.0, 0.46, 0.0])
    metrics = {name: value for name, (value, _, _) in ctx.metrics.pop().items()}
    assert metrics["reward/exact_match"] == pytest.approx(0.5)
    assert metrics["reward/all_digits"] == pytest.approx(0.75)
    assert metrics["reward/tens_digit"] == pytest.approx(0.75)  # 8, 0, 4 right; 7 wrong
    assert metrics["reward/units_digit"] == pytest.approx(0.5)  # 3, 7 right
