"""Multi-turn LLM rollout: model turns and environment turns alternate in one conversation.

Each input row opens a conversation (its prompt as the user's first message, rendered with
the tokenizer's chat template and its generation prompt). Then, turn after turn, the policy
generates at most ``max_turn_tokens`` tokens for every conversation still running, the text
environment (``embodied_rl.registry.TEXT_ENVS``) answers each turn with a reward and its next
message, and that message is appended through the chat template. A conversation ends when the
environment says done, after ``max_turns`` model turns, or when the next environment message
plus a full model turn would not fit the token budget ``max_response_length`` (truncated).

With ``conversation_format: plain`` (base models, and tiny ones that cannot yet follow a
chat template) there is no template: the prompt's tokens open the conversation, the model's
turn follows them directly, and each environment turn is ``plain_separator`` + its message.

Tokens in, tokens out: a conversation is kept as token ids, and each turn is generated from
exactly the ids the trainer will later score, so no re-tokenisation can make the log-probs of
rollout and training disagree. The model's own tokens (its EOS included) are appended as it
sampled them; an environment turn appends the tokens of the chat template's text between
the model's message and the next generation prompt (for ChatML
``<|im_end|>\\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n``).

Output layout for ``actor.train`` (unchanged): PROMPT_IDS (N, P) is the opening prompt,
left-padded; RESPONSE_IDS (N, R) everything after it, right-padded; RESPONSE_MASK (N, R) is 1
on the model's tokens only, so environment and template tokens are attended to but never
trained on. The rewards go to TURN_REWARDS (N, U), FINAL_REWARDS (N,) and NUM_TURNS (N,);
``reward.turns`` combines them into REWARDS. Shapes: ``B`` input rows, ``N = B * n``
conversations, ``U = max_turns``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, repeat_interleave, strings
from embodied_rl.interfaces import TextEpisode
from embodied_rl.registry import TEXT_ENVS
from embodied_rl.runtime.fsdp import gathered_for_inference
from rollout.llm import (
    LLM_ROLLOUT_WRITES,
    VLLM_STATE,
    check_rollout_options,
    left_pad_prompts,
    score_responses,
    set_strings,
    start_engine,
    weights_version,
)
from rollout.vllm_engine import VLLMOptions

CONVERSATION_FORMATS = ("chat", "plain")


@dataclass
class MultiTurnRolloutConfig:
    """Options of the ``rollout.llm_multiturn`` node.

    Attributes:
        model: name of the policy in ``ctx.models``.
        n: conversations per input row (the GRPO group size).
        env: the text environment's registered name (``TEXT_ENVS``).
        env_options: keyword arguments of the environment's constructor.
        env_role: the chat role of the environment's messages (``user``; or ``tool`` where
            the template knows it).
        conversation_format: ``chat`` renders the conversation with the tokenizer's chat
            template (instruction-tuned models); ``plain`` writes it as plain text, as a base
            model reads a document: the prompt, the model's turn right after it, then
            ``plain_separator`` and the environment's message, the model's next turn right
            after that, and so on (``say 4`` / ``4`` / ``\nsay 8`` / ``8`` ...).
        plain_separator: what precedes each environment message in the ``plain`` format.
        max_turns: U, the most model turns of a conversation.
        max_turn_tokens: tokens the model may generate per turn (its EOS included).
        max_prompt_length: P; the opening prompt through the chat template must fit.
        max_response_length: R, the token budget of everything after the prompt (model and
            environment turns).
        temperature / top_p / do_sample: sampling, as in ``rollout.llm``.
        micro_batch_size: conversations per generate / log-prob call.
        backend: ``hf`` or ``vllm`` (each turn is one engine call on the token ids).
        vllm: engine options (``rollout.vllm``), used with ``backend: vllm``.
    """

    model: str = "actor"
    n: int = 4
    env: str = "running_sum"
    env_options: dict[str, Any] = field(default_factory=dict)
    env_role: str = "user"
    conversation_format: str = "chat"
    plain_separator: str = "\n"
    max_turns: int = 3
    max_turn_tokens: int = 4
    max_prompt_length: int = 32
    max_response_length: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    do_sample: bool = True
    micro_batch_size: int = 64
    backend: str = "hf"
    vllm: VLLMOptions = field(default_factory=VLLMOptions)

    def __post_init__(self) -> None:
        check_rollout_options(
            self,
            (
                "n",
                "max_turns",
                "max_turn_tokens",
                "max_prompt_length",
                "max_response_length",
                "micro_batch_size",
            ),
        )
        if self.conversation_format not in CONVERSATION_FORMATS:
            raise ValueError(
                f"conversation_format must be one of {list(CONVERSATION_FORMATS)}, got "
                f"{self.conversation_format!r}"
            )
        if self.max_response_length < self.max_turn_tokens:
            raise ValueError(
                f"max_response_length ({self.max_response_length}) is the budget of the whole "
                f"conversation and must hold at least one model turn (max_turn_tokens="
                f"{self.max_turn_tokens}); raise it (about max_turns x (max_turn_tokens + "
                "the environment's message tokens))"
            )
        environment = TEXT_ENVS.get(self.env)  # an unknown name fails here, with the known ones
        try:  # options the environment does not take fail at validation, not in a worker
            environment(**self.env_options)
        except TypeError as err:
            raise ValueError(
                f"env_options {dict(self.env_options)} do not fit the text environment "
                f"{self.env!r} ({err}); give only the options its constructor takes "
                f"({environment.__module__}.{environment.__name__})"
            ) from None


@dataclass
class Conversation:
    """One conversation's token ids, loss mask, messages and rewards.

    Attributes:
        prompt: the opening tokens (chat template with its generation prompt).
        response: every token after the prompt: model turns and environment turns.
        loss_mask: per ``response`` token, 1.0 for the model's tokens, 0.0 otherwise.
        messages: the chat so far (``role``/``content``), for the template.
    """

    episode: TextEpisode
    prompt: list[int]
    messages: list[dict[str, str]]
    response: list[int] = field(default_factory=list)
    loss_mask: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    final_reward: float = 0.0
    finished: bool = False
    truncated: bool = False

    @property
    def context(self) -> list[int]:
        return self.prompt + self.response

    def finish(self, truncated: bool = False) -> None:
        self.finished, self.truncated = True, truncated
        self.final_reward = float(self.episode.final_reward())


def render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "multi-turn rollout needs a tokenizer with a chat template; this one has none "
            "(set tokenizer.chat_template, or use a checkpoint that ships one)"
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of template text; its special tokens are the template's, not added ones."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def environment_turn_tokens(
    tokenizer: Any, messages: list[dict[str, str]], observation: str, role: str
) -> list[int]:
    """Tokens between the model's last message and the next generation prompt's end.

    ``messages`` ends with the model's message. The template renders the conversation before
    it (with the generation prompt), then the model's content verbatim, then what closes its
    turn, the environment's message and the next generation prompt: that last part is the
    environment's turn.
    """
    content = messages[-1]["content"]
    before = render(tokenizer, messages[:-1], generation_prompt=True)
    after = render(tokenizer, [*messages, {"role": role, "content": observation}], True)
    if not after.startswith(before + content):
        raise ValueError(
            "the chat template does not render the model's message verbatim right after the "
            "generation prompt, so the environment's turn cannot be appended as tokens; use a "
            "ChatML-style template (Qwen2.5's, or the default of policies/causal_lm)"
        )
    return encode(tokenizer, after[len(before) + len(content) :])


def open_conversation(
    tokenizer: Any, episode: TextEpisode, prompt: str, sample_id: int, cfg: MultiTurnRolloutConfig
) -> Conversation:
    messages = [{"role": "user", "content": prompt}]
    if cfg.conversation_format == "plain":
        tokens = encode(tokenizer, prompt)
    else:
        tokens = encode(tokenizer, render(tokenizer, messages, generation_prompt=True))
    if len(tokens) > cfg.max_prompt_length:
        raise ValueError(
            f"prompt of sample {sample_id} is {len(tokens)} tokens through the "
            f"{cfg.conversation_format} format, "
            f"more than max_prompt_length={cfg.max_prompt_length}; raise the rollout node's "
            "max_prompt_length or shorten the prompt"
        )
    return Conversation(episode=episode, prompt=tokens, messages=messages)


def take_model_turn(
    conversation: Conversation, turn_ids: list[int], tokenizer: Any, cfg: MultiTurnRolloutConfig
) -> None:
    """Append the model's turn, let the environment answer, and append its turn or finish."""
    conversation.response += turn_ids
    conversation.loss_mask += [1.0] * len(turn_ids)
    content = tokenizer.decode(turn_ids, skip_special_tokens=True)
    conversation.messages.append({"role": "assistant", "content": content})
    result = conversation.episode.step(content)
    conversation.turn_rewards.append(float(result.reward))
    if result.done or result.observation is None:
        conversation.finish()
        return
    if len(conversation.turn_rewards) == cfg.max_turns:
        conversation.finish(truncated=True)
        return
    if cfg.conversation_format == "plain":
        env_ids = encode(tokenizer, cfg.plain_separator + result.observation)
    else:
        env_ids = environment_turn_tokens(
            tokenizer, conversation.messages, result.observation, cfg.env_role
        )
    if len(conversation.response) + len(env_ids) + cfg.max_turn_tokens > cfg.max_response_length:
        conversation.finish(truncated=True)
        return
    conversation.response += env_ids
    conversation.loss_mask += [0.0] * len(env_ids)
    conversation.messages.append({"role": cfg.env_role, "content": result.observation})


def _valid_prefix(policy: Any, ids: Sequence[int]) -> list[int]:
    """The generated ids up to and including the first EOS (padding after it dropped)."""
    ids = torch.as_tensor(list(ids), dtype=torch.long).view(1, -1)
    length = int(policy.response_mask(ids).sum()) if ids.numel() else 0
    return ids[0, :length].tolist()


def _generate_hf(policy: Any, contexts: list[list[int]], cfg: MultiTurnRolloutConfig) -> list:
    """One turn per context with HF ``generate`` (left-padded micro-batches)."""
    turns: list[list[int]] = []
    for start in range(0, len(contexts), cfg.micro_batch_size):
        part = contexts[start : start + cfg.micro_batch_size]
        width = max(len(c) for c in part)
        ids, mask = left_pad_prompts(part, list(range(len(part))), width, policy.pad_token_id)
        response, response_mask = policy.generate(
            ids,
            mask,
            max_new_tokens=cfg.max_turn_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            do_sample=cfg.do_sample,
        )
        lengths = response_mask.sum(dim=1).long().tolist()
        turns += [row[:length] for row, length in zip(response.tolist(), lengths)]
    return turns


def _generate_vllm(
    ctx: Any, policy: Any, contexts: list[list[int]], cfg: MultiTurnRolloutConfig, turn: int
) -> list[list[int]]:
    """One turn per context from this worker's vLLM engine (weights pushed when stale)."""
    engine = ctx.state[VLLM_STATE].engine
    version = weights_version(ctx, cfg.model)
    if engine.synced_version != version:
        seconds = engine.push_weights(policy.inference_weights(), version)
        ctx.metrics.log("time/rollout/weight_sync", seconds, reduce="max")
    out = engine.generate(
        contexts,
        n=1,
        max_new_tokens=cfg.max_turn_tokens,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        do_sample=cfg.do_sample,
        stop_token_ids=policy.eos_ids.tolist(),
        allowed_token_ids=None if policy.allowed_ids is None else policy.allowed_ids.tolist(),
        seed=ctx.seed(f"generate/turn{turn}"),
    )
    return [_valid_prefix(policy, ids) for ids in out.token_ids]


def run_conversations(
    ctx: Any, policy: Any, conversations: list[Conversation], cfg: MultiTurnRolloutConfig
) -> None:
    """Alternate model and environment turns until every conversation has finished."""
    for turn in range(cfg.max_turns):
        running = [c for c in conversations if not c.finished]
        if not running:
            break
        contexts = [c.context for c in running]
        if cfg.backend == "vllm":
            turns = _generate_vllm(ctx, policy, contexts, cfg, turn)
        else:
            turns = _generate_hf(policy, contexts, cfg)
        for conversation, turn_ids in zip(running, turns):
            take_model_turn(conversation, turn_ids, policy.tokenizer, cfg)
    if cfg.backend == "vllm":
        ctx.state[VLLM_STATE].engine.sleep()  # the trainer gets the memory back


def conversations_to_batch(
    rows: TensorDict, conversations: list[Conversation], policy: Any, cfg: MultiTurnRolloutConfig
) -> TensorDict:
    """The trainer's layout (module doc) for ``rows``, one row per conversation."""
    count, width = len(conversations), cfg.max_response_length
    prompt_ids, prompt_mask = left_pad_prompts(
        [c.prompt for c in conversations],
        rows[K.SAMPLE_ID].tolist(),
        cfg.max_prompt_length,
        policy.pad_token_id,
    )
    response_ids = torch.full((count, width), policy.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(count, width)
    turn_rewards = torch.zeros(count, cfg.max_turns)
    for row, conversation in enumerate(conversations):
        length = len(conversation.response)
        response_ids[row, :length] = torch.as_tensor(conversation.response, dtype=torch.long)
        response_mask[row, :length] = torch.as_tensor(conversation.loss_mask)
        rewards = conversation.turn_rewards
        turn_rewards[row, : len(rewards)] = torch.as_tensor(rewards, dtype=torch.float32)
    out = rows
    out[K.PROMPT_IDS], out[K.PROMPT_MASK] = prompt_ids, prompt_mask
    out[K.RESPONSE_IDS], out[K.RESPONSE_MASK] = response_ids, response_mask
    out[K.TURN_REWARDS] = turn_rewards
    out[K.NUM_TURNS] = torch.tensor([len(c.turn_rewards) for c in conversations])
    out[K.FINAL_REWARDS] = torch.tensor([c.final_reward for c in conversations])
    transcripts = [
        policy.tokenizer.decode(c.response, skip_special_tokens=True) for c in conversations
    ]
    set_strings(out, K.RESPONSE_TEXT, transcripts)
    return out


def _log_metrics(ctx: Any, conversations: list[Conversation]) -> None:
    count = len(conversations)
    turns = torch.tensor([len(c.turn_rewards) for c in conversations], dtype=torch.float32)
    model_tokens = torch.tensor([sum(c.loss_mask) for c in conversations])
    all_tokens = torch.tensor([len(c.response) for c in conversations], dtype=torch.float32)
    truncated = torch.tensor([c.truncated for c in conversations], dtype=torch.float32)
    ctx.metrics.log("rollout/turns", turns.mean(), weight=count)
    ctx.metrics.log("rollout/response_length", model_tokens.mean(), weight=count)
    ctx.metrics.log("rollout/conversation_length", all_tokens.mean(), weight=count)
    ctx.metrics.log("rollout/truncated_ratio", truncated.mean(), weight=count)


@register_node(
    "rollout.llm_multiturn",
    reads=(K.PROMPT_TEXT, K.ANSWER_TEXT, K.SAMPLE_ID),
    writes=(*LLM_ROLLOUT_WRITES, K.TURN_REWARDS, K.NUM_TURNS, K.FINAL_REWARDS),
    config=MultiTurnRolloutConfig,
    batch_factor=lambda c: c.n,
    setup=lambda ctx: start_engine(ctx),
)
def multiturn_rollout(ctx: Any, batch: TensorDict) -> TensorDict:
    """Run ``n`` conversations per input row with the configured text environment.

    Args:
        ctx: the node context (``ctx.node_config`` is a :class:`MultiTurnRolloutConfig`).
        batch: B rows with PROMPT_TEXT, ANSWER_TEXT and SAMPLE_ID (B,).

    Returns:
        N = B * n conversations grouped by row (GROUP_ID = the row's SAMPLE_ID, SAMPLE_ID =
        ``row_sample_id * n + j``) with the keys of the module doc, OLD_LOGPROBS (N, R) and
        RESPONSE_TEXT (the transcript after the prompt); tensors on the CPU.
    """
    cfg: MultiTurnRolloutConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    environment = TEXT_ENVS.get(cfg.env)(**cfg.env_options)
    rows = repeat_interleave(batch, cfg.n)
    group_ids = batch[K.SAMPLE_ID].long().repeat_interleave(cfg.n)
    rows[K.GROUP_ID] = group_ids
    rows[K.SAMPLE_ID] = group_ids * cfg.n + torch.arange(cfg.n).repeat(batch_len(batch))
    conversations = [
        open_conversation(policy.tokenizer, environment.start(prompt, answer), prompt, sid, cfg)
        for prompt, answer, sid in zip(
            strings(rows, K.PROMPT_TEXT), strings(rows, K.ANSWER_TEXT), rows[K.SAMPLE_ID].tolist()
        )
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed("generate"))
        with gathered_for_inference(policy):
            run_conversations(ctx, policy, conversations, cfg)
            out = conversations_to_batch(rows, conversations, policy, cfg)
            if conversations:
                score_responses(policy, out, cfg)
            else:
                out[K.OLD_LOGPROBS] = out[K.RESPONSE_MASK].clone()
    if conversations:
        _log_metrics(ctx, conversations)
    return out
