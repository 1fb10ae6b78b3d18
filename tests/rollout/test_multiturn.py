"""Multi-turn rollout (rollout.llm_multiturn) with a real tiny causal LM, the real Qwen2.5
tokenizer's ChatML template and the running-sum text environment; reward.turns by hand."""

from __future__ import annotations

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
from pathlib import Path

import pytest
import torch

import policies  # noqa: F401  (registers the causal_lm policy)
import rollout  # noqa: F401  (registers rollout.llm_multiturn)
from embodied_rl import keys as K
from embodied_rl.data.batch import batch_len, make_batch, strings
from embodied_rl.data.layout import Layout
from embodied_rl.nodes.reward.outcome import TurnRewardConfig, turn_reward_node
from embodied_rl.registry import POLICIES, TEXT_ENVS, UnknownNameError
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.tasks.echo import Echo, generate_echo_episodes
from embodied_rl.tasks.running_sum import RunningSum, generate_episodes, parse_script
from rollout.multiturn import (
    MultiTurnRolloutConfig,
    environment_turn_tokens,
    multiturn_rollout,
)

CPU = torch.device("cpu")
DIGITS = [str(d) for d in range(10)]
EOS = 151643
ROWS = {"3+4=": "7 +5 -2", "12+7=": "19 -9 +3", "0+0=": "0 +8 +1"}


@pytest.fixture(scope="module")
def policy():
    return POLICIES.get("causal_lm")({"seed": 0, "allowed_response_tokens": DIGITS}, CPU)


def make_ctx(policy, node_config, seed: int = 7) -> NodeContext:
    return NodeContext(
        cfg=None,
        node_id="rollout",
        node_config=node_config,
        rank=0,
        world_size=1,
        layout=Layout((0,)),
        dp_group=None,
        models={"actor": policy},
        state={},
        step=0,
        metrics=MetricSink(),
        device=CPU,
        run_dir=Path("."),
        seed_fn=lambda tag: seed,
    )


def rows():
    return make_batch(
        {
            K.PROMPT_TEXT: list(ROWS),
            K.ANSWER_TEXT: list(ROWS.values()),
            K.SAMPLE_ID: torch.tensor([5, 6, 7]),
        }
    )


def rollout_of(policy, **options):
    cfg = MultiTurnRolloutConfig(**{"max_turn_tokens": 3, "max_response_length": 48, **options})
    ctx = make_ctx(policy, cfg)
    return multiturn_rollout(ctx, rows()), ctx


# ----------------------------------------------------------------------------- environment
def test_running_sum_turns_rewards_and_final_by_hand():
    episode = RunningSum(partial_weight=0.5, partial_scale=10.0).start("3+4=", "7 +5 -2")
    first = episode.step("7")
    assert (first.observation, first.reward, first.done) == ("correct. +5=", 1.0, False)
    second = episode.step("11")  # the total is 12: 0.5 * (1 - 1/10)
    assert second.observation == "no, 12. -2=" and second.reward == pytest.approx(0.45)
    third = episode.step("10")  # 12 - 2: right although the turn before was wrong
    assert (third.observation, third.reward, third.done) == (None, 1.0, True)
    assert episode.final_reward() == 0.0  # not every turn exact
    solved = RunningSum().start("3+4=", "7 +5 -2")
    assert [solved.step(a).reward for a in ("7", "12", "10")] == [1.0, 1.0, 1.0]
    assert solved.final_reward() == 1.0
    with pytest.raises(ValueError, match="space-separated integers"):
        parse_script("7, +5")


def test_generated_episodes_are_distinct_deterministic_and_in_range():
    episodes = generate_episodes(300, seed=3)
    assert episodes == generate_episodes(300, seed=3)
    assert len({(e["prompt"], e["answer"]) for e in episodes}) == 300
    for episode in episodes:
        a, b = map(int, episode["prompt"].removesuffix("=").split("+"))
        first, operands = parse_script(episode["answer"])
        assert first == a + b and len(operands) == 2
        totals = [first + sum(operands[:k]) for k in range(1, 3)]
        assert all(0 <= t <= 30 for t in totals) and 0 not in operands


def test_echo_rewards_saying_back_the_number_of_the_latest_message():
    episode = Echo().start("say 4", "4 19 7")
    first = episode.step("4")
    assert (first.observation, first.reward, first.done) == ("correct. say 19", 1.0, False)
    second = episode.step("18")
    assert (second.observation, second.reward) == ("no, 19. say 7", 0.0)
    assert episode.step("7").done and episode.final_reward() == 0.0
    with pytest.raises(ValueError, match="must be 'say 4'"):
        Echo().start("say 5", "4 19 7")
    rows = generate_echo_episodes(50, seed=1)
    assert rows == generate_echo_episodes(50, seed=1)
    assert all(r["prompt"] == "say " + r["answer"].split()[0] for r in rows)


def test_unknown_environment_or_options_are_refused_at_validation():
    with pytest.raises(UnknownNameError, match="running_sum"):
        MultiTurnRolloutConfig(env="running_summ")
    assert "running_sum" in TEXT_ENVS
    with pytest.raises(ValueError, match="do not fit the text environment 'echo'"):
        MultiTurnRolloutConfig(env="echo", env_options={"partial_weight": 0.5})


# ----------------------------------------------------------------------------- chat template
def test_environment_turn_is_the_chatml_text_between_two_model_messages(policy):
    messages = [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
    ids = environment_turn_tokens(policy.tokenizer, messages, "correct. +5=", "user")
    text = policy.tokenizer.decode(ids)
    assert text == "<|im_end|>\n<|im_start|>user\ncorrect. +5=<|im_end|>\n<|im_start|>assistant\n"


# ----------------------------------------------------------------------------- the rollout
def _turn_spans(mask: list[float]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s: the model's turns."""
    spans, start = [], None
    for i, value in enumerate([*mask, 0.0]):
        if value and start is None:
            start = i
        if not value and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_conversation_tokens_mask_and_rewards_replay(policy):
    """Every conversation: prompt + response tokens are exactly the chat template's text of
    its messages (the model's EOS tokens aside); the mask is 1 on the model's tokens only;
    the rewards are what the environment gives the decoded turns."""
    out, ctx = rollout_of(policy, n=4)
    tokenizer = policy.tokenizer
    assert batch_len(out) == 12
    assert out[K.GROUP_ID].tolist() == [5] * 4 + [6] * 4 + [7] * 4
    assert out[K.SAMPLE_ID].tolist() == list(range(20, 32))
    allowed = {tokenizer.convert_tokens_to_ids(d) for d in DIGITS} | {EOS}
    prompts, answers = strings(out, K.PROMPT_TEXT), strings(out, K.ANSWER_TEXT)
    multi_turn = 0
    for row in range(12):
        prompt = out[K.PROMPT_IDS][row][out[K.PROMPT_MASK][row] > 0].tolist()
        mask = out[K.RESPONSE_MASK][row].tolist()
        response = out[K.RESPONSE_IDS][row].tolist()
        spans = _turn_spans(mask)
        turns = int(out[K.NUM_TURNS][row])
        assert len(spans) == turns and 1 <= turns <= 3
        multi_turn += turns > 1
        end = spans[-1][1]
        assert all(m == 0 for m in mask[end:]) and set(response[end:]) == {EOS}  # padding
        contents = [tokenizer.decode(response[a:b], skip_special_tokens=True) for a, b in spans]
        for a, b in spans:  # the model's tokens: digits, at most one EOS, at its turn's end
            assert set(response[a:b]) <= allowed and EOS not in response[a : b - 1]
        # Replay: the same environment, fed the decoded turns, gives the same rewards.
        episode = RunningSum().start(prompts[row], answers[row])
        replies = [episode.step(c) for c in contents]
        expected = [r.reward for r in replies] + [0.0] * (3 - turns)
        assert out[K.TURN_REWARDS][row].tolist() == pytest.approx(expected)
        assert float(out[K.FINAL_REWARDS][row]) == episode.final_reward()
        # The tokens are the template's text (model EOS tokens dropped).
        messages = [{"role": "user", "content": prompts[row]}]
        for content, reply in zip(contents[:-1], replies):
            messages += [{"role": "assistant", "content": content}]
            messages += [{"role": "user", "content": reply.observation}]
        expected_text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        kept = [t for i, t in enumerate(prompt + response[:end]) if t != EOS or i < len(prompt)]
        assert tokenizer.decode(kept) == expected_text + contents[-1]
    assert multi_turn >= 6  # most conversations got past the first turn
    assert ctx.metrics.records["rollout/turns"][0] == pytest.approx(
        out[K.NUM_TURNS].float().mean().item()
    )


def test_plain_format_is_the_prompt_then_turns_and_separated_environment_messages(policy):
    """conversation_format plain: no template; the tokens are exactly the prompt's, each
    model turn's, and plain_separator + each environment message's, in order."""
    out, _ = rollout_of(policy, n=2, conversation_format="plain", plain_separator=" | ")
    tokenizer = policy.tokenizer
    prompts, answers = strings(out, K.PROMPT_TEXT), strings(out, K.ANSWER_TEXT)
    assert int((out[K.NUM_TURNS] > 1).sum()) >= 3  # environment messages were appended
    for row in range(batch_len(out)):
        prompt = out[K.PROMPT_IDS][row][out[K.PROMPT_MASK][row] > 0].tolist()
        assert prompt == tokenizer(prompts[row], add_special_tokens=False)["input_ids"]
        mask = out[K.RESPONSE_MASK][row].tolist()
        response = out[K.RESPONSE_IDS][row].tolist()
        spans = _turn_spans(mask)
        episode = RunningSum().start(prompts[row], answers[row])
        expected: list[int] = []
        for k, (a, b) in enumerate(spans):
            expected += response[a:b]
            reply = episode.step(tokenizer.decode(response[a:b], skip_special_tokens=True))
            if k + 1 < len(spans):
                expected += tokenizer(" | " + reply.observation, add_special_tokens=False)[
                    "input_ids"
                ]
        assert response[: spans[-1][1]] == expected
    with pytest.raises(ValueError, match="conversation_format must be one of"):
        MultiTurnRolloutConfig(conversation_format="markdown")


def test_old_logprobs_equal_turn_by_turn_scores_of_unpadded_contexts(policy):
    """OLD_LOGPROBS come from one padded pass over prompt + whole conversation; each model
    token's log-prob must equal the one the model gives it with only its own context (no
    padding), so positions and attention over environment tokens match generation."""
    out, _ = rollout_of(policy, n=2, temperature=0.9)
    allowed_ids = policy.allowed_ids
    for row in range(batch_len(out)):
        prompt = out[K.PROMPT_IDS][row][out[K.PROMPT_MASK][row] > 0]
        response, mask = out[K.RESPONSE_IDS][row], out[K.RESPONSE_MASK][row]
        sequence = torch.cat([prompt, response]).unsqueeze(0)
        with torch.no_grad():
            logits = policy.model(input_ids=sequence).logits[0].float() / 0.9
        for t in torch.nonzero(mask).flatten().tolist():
            position = len(prompt) + t - 1  # the logit that predicts response token t
            scores = torch.log_softmax(logits[position, allowed_ids], dim=-1)
            index = (allowed_ids == response[t]).nonzero().item()
            assert float(out[K.OLD_LOGPROBS][row, t]) == pytest.approx(
                float(scores[index]), abs=2e-5
            )
        assert torch.all(out[K.OLD_LOGPROBS][row][mask == 0] == 0)


def test_turn_limit_and_token_budget_end_conversations(policy):
    limited, _ = rollout_of(policy, n=2, max_turns=2)
    assert limited[K.NUM_TURNS].max() == 2 and limited[K.TURN_REWARDS].shape == (6, 2)
    assert torch.all(limited[K.FINAL_REWARDS] == 0)  # three totals, never all answered
    # 20 tokens: a model turn (3) + an environment turn (~16) + the next model turn (3) do
    # not fit, so every conversation stops after its first turn, truncated.
    budget, ctx = rollout_of(policy, n=2, max_response_length=20)
    assert budget[K.NUM_TURNS].tolist() == [1] * 6
    assert int(budget[K.RESPONSE_MASK].sum(dim=1).max()) <= 3
    assert ctx.metrics.records["rollout/truncated_ratio"][0] == 1.0


def test_long_prompt_and_small_budget_are_refused_with_the_fix(policy):
    with pytest.raises(ValueError, match="max_prompt_length=8"):
        rollout_of(policy, n=1, max_prompt_length=8)
    with pytest.raises(ValueError, match="at least one model turn"):
        MultiTurnRolloutConfig(max_turn_tokens=8, max_response_length=4)


# ----------------------------------------------------------------------------- reward.turns
def test_turn_rewards_combine_as_mean_over_turns_taken_plus_final():
    batch = make_batch(
        {
            K.TURN_REWARDS: torch.tensor([[1.0, 0.45, 1.0], [0.5, 0.0, 0.0], [1.0, 1.0, 1.0]]),
            K.NUM_TURNS: torch.tensor([3, 1, 3]),
            K.FINAL_REWARDS: torch.tensor([0.0, 0.0, 1.0]),
        }
    )
    ctx = make_ctx(None, TurnRewardConfig(turn_weight=1.0, final_weight=2.0))
    out = turn_reward_node(ctx, batch)
    assert out[K.REWARDS].tolist() == pytest.approx([2.45 / 3, 0.5, 1.0 + 2.0])
    metrics = {k: v for k, (v, _, _) in ctx.metrics.records.items()}
    assert metrics["reward/turn_1"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)
    assert metrics["reward/turn_2"] == pytest.approx((0.45 + 1.0) / 2)  # rows that got there
    assert metrics["reward/final"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="not both 0"):
        TurnRewardConfig(turn_weight=0.0, final_weight=0.0)


# ----------------------------------------------------------------------------- vLLM backend
@pytest.mark.vllm
def test_vllm_conversations_equal_hf_ones_greedy():
    """backend vllm: one engine call per turn on the same token ids. Greedy decoding in
    float32 on both sides must give the same conversations, token for token."""
    from embodied_rl.runtime.models import ModelStore
    from rollout.llm import start_engine
    from rollout.vllm_engine import VLLMOptions

    options = {"seed": 0, "allowed_response_tokens": DIGITS}
    store = ModelStore({"actor": {"policy": "causal_lm", "options": options}}, CPU)
    policy = store["actor"]
    sampling = {"n": 2, "do_sample": False, "max_turn_tokens": 3, "max_response_length": 48}
    hf_out, _ = rollout_of(policy, **sampling)
    cfg = MultiTurnRolloutConfig(backend="vllm", vllm=VLLMOptions(dtype="float32"), **sampling)
    ctx = make_ctx(policy, cfg)
    ctx.models = store  # the engine's weight version is the optimizer's step count
    start_engine(ctx)
    try:
        vllm_out = multiturn_rollout(ctx, rows())
    finally:
        ctx.state["vllm_engine"].close()
    assert torch.equal(vllm_out[K.RESPONSE_IDS], hf_out[K.RESPONSE_IDS])
    assert torch.equal(vllm_out[K.RESPONSE_MASK], hf_out[K.RESPONSE_MASK])
    assert torch.equal(vllm_out[K.TURN_REWARDS], hf_out[K.TURN_REWARDS])
    torch.testing.assert_close(vllm_out[K.OLD_LOGPROBS], hf_out[K.OLD_LOGPROBS])
