"""Arithmetic task: problem generation, data files, rule reward and the reward node."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import embodied_rl.nodes  # noqa: F401  (registers reward.arithmetic)
from embodied_rl import keys as K
from embodied_rl.dag.node_type import NodeConfigError
from embodied_rl.data.batch import make_batch
from embodied_rl.data.layout import Layout
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.tasks.arithmetic import (
    ArithmeticRewardConfig,
    generate_problems,
    make_splits,
    parse_integer,
    read_jsonl,
    score,
)

DATA = Path(__file__).resolve().parents[2] / "assets" / "data"
PROMPT = re.compile(r"(\d+)([+-])(\d+)=")


def solve(prompt: str) -> int:
    a, op, b = PROMPT.fullmatch(prompt).groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


def test_problems_are_deterministic_distinct_and_correct():
    problems = generate_problems(300, seed=3)
    assert problems == generate_problems(300, seed=3)
    assert problems != generate_problems(300, seed=4)
    assert len({p["prompt"] for p in problems}) == 300
    for problem in problems:
        answer = solve(problem["prompt"])
        assert problem["answer"] == str(answer) and 0 <= answer <= 99
    assert {p["prompt"][-1] for p in problems} == {"="}
    assert any("-" in p["prompt"] for p in problems) and any("+" in p["prompt"] for p in problems)


def test_problem_ranges_are_configurable():
    problems = generate_problems(
        20, seed=0, min_operand=1, max_operand=9, operators=("+",), max_answer=10
    )
    for problem in problems:
        a, op, b = PROMPT.fullmatch(problem["prompt"]).groups()
        assert op == "+" and 1 <= int(a) <= 9 and 1 <= int(b) <= 9
        assert int(problem["answer"]) <= 10
    # 1..9 + 1..9 with sum <= 10: 9 + 8 + ... + 1 = 45 problems exist, not more.
    assert (
        len(
            generate_problems(
                45, seed=0, min_operand=1, max_operand=9, operators=("+",), max_answer=10
            )
        )
        == 45
    )
    with pytest.raises(ValueError, match="only 45 distinct"):
        generate_problems(46, seed=0, min_operand=1, max_operand=9, operators=("+",), max_answer=10)
    with pytest.raises(ValueError, match="unknown operators"):
        generate_problems(1, seed=0, operators=("*",))


def test_data_files_match_generator_and_are_disjoint():
    train, test = (
        read_jsonl(DATA / "arithmetic_train.jsonl"),
        read_jsonl(DATA / "arithmetic_test.jsonl"),
    )
    assert (len(train), len(test)) == (2000, 200)
    assert (train, test) == make_splits(2000, 200, seed=0)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert all(set(row) == {"prompt", "answer"} for row in train + test)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("19", "19", 1.0),
        (" 19\n", "19", 1.0),
        ("019", "19", 1.0),  # integer match
        ("17", "19", 0.4),  # 0.5 * (1 - 2/10)
        ("25", "19", 0.2),  # 0.5 * (1 - 6/10)
        ("29", "19", 0.0),  # 10 away: no credit
        ("400", "19", 0.0),
        ("-3", "2", 0.25),  # 0.5 * (1 - 5/10)
        ("", "19", 0.0),
        ("19 apples", "19", 0.0),
        ("1 9", "19", 0.0),
        ("19.0", "19", 0.0),
        ("1e1", "10", 0.0),
        ("__import__('os').system('x')", "0", 0.0),  # parsed, never evaluated
        ("\u0661\u0669", "19", 0.0),  # Arabic-Indic digits are not ASCII digits
        ("9" * 19, "19", 0.0),  # longer than 18 digits: not a number here
    ],
)
def test_score_hand_computed(response, answer, expected):
    assert score(response, answer) == pytest.approx(expected)


def test_score_partial_options_and_bad_answer():
    assert score("18", "19", partial_weight=0.2, partial_scale=4) == pytest.approx(0.15)
    assert score("15", "19", partial_weight=0.2, partial_scale=4) == 0.0
    assert score("18", "19", partial_weight=0.0) == 0.0
    assert parse_integer(" -12 ") == -12 and parse_integer("12a") is None
    with pytest.raises(ValueError, match="not an integer"):
        score("1", "one")


def make_ctx(**options) -> NodeContext:
    return NodeContext(
        cfg=None,
        node_id="reward",
        node_config=ArithmeticRewardConfig(**options),
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


def test_reward_node_writes_rewards_and_metrics():
    node = NODE_TYPES.get("reward.arithmetic")
    batch = make_batch(
        {
            K.RESPONSE_TEXT: ["19", "17", "x", "2"],
            K.ANSWER_TEXT: ["19", "19", "5", "2"],
            K.SAMPLE_ID: torch.arange(4),
        }
    )
    ctx = make_ctx()
    out = node.fn(ctx, batch)
    assert out[K.REWARDS].dtype == torch.float32
    torch.testing.assert_close(out[K.REWARDS], torch.tensor([1.0, 0.4, 0.0, 1.0]))
    assert K.REWARDS not in batch.keys()  # the input batch is left as it was
    assert ctx.metrics.records["reward/mean"] == pytest.approx((0.6, 4.0, "mean"))
    assert ctx.metrics.records["reward/exact_match"] == pytest.approx((0.5, 4.0, "mean"))
    assert node.read_keys(None) == (K.RESPONSE_TEXT, K.ANSWER_TEXT)
    assert node.write_keys(None) == (K.REWARDS,)


def test_reward_node_config_and_empty_batch():
    node = NODE_TYPES.get("reward.arithmetic")
    config = node.build_config({"partial_weight": 0.0})
    batch = make_batch({K.RESPONSE_TEXT: ["17"], K.ANSWER_TEXT: ["19"]})
    ctx = make_ctx(partial_weight=config.partial_weight)
    assert node.fn(ctx, batch)[K.REWARDS].tolist() == [0.0]
    with pytest.raises(NodeConfigError, match="partial_weight"):
        node.build_config({"partial_weight": 1.0})
    with pytest.raises(NodeConfigError, match="valid keys"):
        node.build_config({"scale": 3})
    empty = make_batch({K.RESPONSE_TEXT: [], K.ANSWER_TEXT: []}, batch_size=0)
    out = node.fn(make_ctx(), empty)
    assert out[K.REWARDS].shape == (0,)
