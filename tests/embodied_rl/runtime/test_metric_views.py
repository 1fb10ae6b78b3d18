"""Where the nodes of a step log: the training DAG under plain names, a branch or an agent
under its prefix, and the evaluation DAG apart from the training step it is logged with."""

from __future__ import annotations

import pytest

from embodied_rl.runtime.context import MetricSink, node_metrics


def test_an_evaluation_does_not_merge_into_the_training_rollout_metrics():
    """The main job's step 0 (eval.at_start): 10 of 32 training episodes succeed, 2 of 10
    greedy evaluation episodes. Under one name the step read (10 + 2) / 42 = 0.286."""
    sink = MetricSink()
    train = node_metrics(sink, None, None)
    evaluation = node_metrics(sink, None, None, "eval", ("eval",))
    train.log("rollout/success_rate", 10 / 32, weight=32)
    evaluation.log("rollout/success_rate", 2 / 10, weight=10)
    evaluation.log("eval/success_rate", 2 / 10, weight=10)  # the report's own name stays
    train.log("data/epoch", 0.0, reduce="max")
    evaluation.log("data/epoch", 3.0, reduce="max")
    train.log("time/rollout/simulate", 150.0, reduce="max")
    evaluation.log("time/rollout/simulate", 170.0, reduce="max")
    values = {name: value for name, (value, _, _) in sink.records.items()}
    assert values == {
        "rollout/success_rate": pytest.approx(0.3125),
        "eval/rollout/success_rate": pytest.approx(0.2),
        "eval/success_rate": pytest.approx(0.2),
        "data/epoch": 0.0,
        "eval/data/epoch": 3.0,
        "time/rollout/simulate": 150.0,
        "time/eval/rollout/simulate": 170.0,
    }


def test_another_evaluation_name_and_a_branch():
    """``eval.name=eval_train`` keeps the report's names; a branch's node keeps its prefix
    outside the evaluation's."""
    sink = MetricSink()
    evaluation = node_metrics(sink, "llm", None, "eval", ("eval_train",))
    evaluation.log("eval_train/success_rate", 0.5)
    evaluation.log("rollout/success_rate", 0.5)
    evaluation.log("time/rollout/policy", 1.0, reduce="max")
    assert sorted(sink.records) == [
        "llm/eval/rollout/success_rate",
        "llm/eval_train/success_rate",
        "llm/time/eval/rollout/policy",
    ]
