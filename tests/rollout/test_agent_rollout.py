"""Two agents acting in order (rollout.llm with agent: tens, then rollout.llm_agent with agent:
units) on real tiny causal LMs and the real Qwen2.5 tokenizer, through the executor's
per-agent key mapping."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
import pytest
import torch

import policies  # noqa: F401  (registers the causal_lm policy)
import rollout  # noqa: F401  (registers rollout.llm and rollout.llm_agent)
from embodied_rl import keys as K
from embodied_rl.data.batch import agent_view, batch_len, from_agent_view, make_batch, strings
from embodied_rl.registry import POLICIES
from embodied_rl.runtime.context import MetricSink, NodeContext
from rollout.agents import AgentRolloutConfig, agent_rollout
from rollout.llm import LLMRolloutConfig, llm_rollout

CPU = torch.device("cpu")
DIGITS = [str(d) for d in range(10)]
PROMPTS = ["49+34=", "3+4="]


@pytest.fixture(scope="module")
def models():
    build = POLICIES.get("causal_lm")
    return {
        "tens": build({"seed": 1, "allowed_response_tokens": DIGITS}, CPU),
        "units": build({"seed": 2, "allowed_response_tokens": DIGITS}, CPU),
    }


def run_as_agent(fn, agent: str, config, batch, models, seed: int = 3):
    """What the executor does for a node with ``agent:``: plain keys in, namespaced out."""
    ctx = NodeContext.single_process(
        f"{agent}_rollout", config, models=models, metrics=MetricSink(), seed_fn=lambda t: seed
    )
    return from_agent_view(fn(ctx, agent_view(batch, agent)), agent)


def two_agents(models, **units_options):
    prompts = make_batch(
        {
            K.PROMPT_TEXT: PROMPTS,
            K.ANSWER_TEXT: ["83", "7"],
            K.SAMPLE_ID: torch.tensor([4, 9]),
        }
    )
    tens_cfg = LLMRolloutConfig(model="tens", n=3, max_prompt_length=8, max_response_length=1)
    after_tens = run_as_agent(llm_rollout, "tens", tens_cfg, prompts, models)
    units_cfg = AgentRolloutConfig(
        model="units", max_prompt_length=9, max_response_length=1, **units_options
    )
    return after_tens.clone(recurse=False), run_as_agent(
        agent_rollout, "units", units_cfg, after_tens, models, seed=5
    )


def prompt_text(models, batch, agent: str) -> list[str]:
    tokenizer = models[agent].tokenizer
    ids, mask = batch[f"{agent}/prompt_ids"], batch[f"{agent}/prompt_mask"]
    return [tokenizer.decode(row[m.bool()].tolist()) for row, m in zip(ids, mask)]


def test_the_later_agent_sees_the_task_and_the_earlier_agents_response(models):
    after_tens, after_units = two_agents(models, sees=["tens"])
    assert batch_len(after_units) == 6  # 2 prompts x n = 3 episodes
    tens_said = strings(after_units, "tens/response_text")
    assert all(d in DIGITS or d == "" for d in tens_said)  # one token: a digit or EOS
    expected = [p + d for p, d in zip([p for p in PROMPTS for _ in range(3)], tens_said)]
    assert prompt_text(models, after_units, "units") == expected
    assert prompt_text(models, after_units, "tens") == [p for p in PROMPTS for _ in range(3)]
    # The episodes and their groups are the first agent's; its fields are untouched.
    assert after_units[K.GROUP_ID].tolist() == [4, 4, 4, 9, 9, 9]
    assert after_units[K.SAMPLE_ID].tolist() == [12, 13, 14, 27, 28, 29]
    for key in ("tens/response_ids", "tens/old_logprobs", "tens/prompt_ids"):
        assert torch.equal(after_units[key], after_tens[key]), key
    assert not any(key in after_units.keys() for key in K.AGENT_FIELDS)  # all namespaced


def test_each_agents_old_logprobs_are_its_own_policys(models):
    _, batch = two_agents(models, sees=["tens"])
    for agent in ("tens", "units"):
        view = agent_view(batch, agent)
        with torch.no_grad():
            logprobs, _ = models[agent].evaluate(view, temperature=1.0)
        torch.testing.assert_close(batch[f"{agent}/old_logprobs"], logprobs.float())
    # The other agent's model gives its tokens different log-probs: they are not shared.
    with torch.no_grad():
        theirs, _ = models["tens"].evaluate(agent_view(batch, "units"), temperature=1.0)
    assert not torch.allclose(theirs.float(), batch["units/old_logprobs"])


def test_prompt_template_and_an_agent_that_sees_nothing(models):
    _, batch = two_agents(models, sees=["tens"], prompt_template="{tens}|{prompt}")
    tens_said = strings(batch, "tens/response_text")
    assert prompt_text(models, batch, "units")[0] == f"{tens_said[0]}|{PROMPTS[0]}"
    _, blind = two_agents(models)  # acts after tens, without seeing it
    assert prompt_text(models, blind, "units") == [p for p in PROMPTS for _ in range(3)]


def test_same_seed_same_episodes(models):
    _, first = two_agents(models, sees=["tens"])
    _, again = two_agents(models, sees=["tens"])
    assert torch.equal(first["units/response_ids"], again["units/response_ids"])
