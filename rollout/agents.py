"""Rollout of a later agent in a multi-agent DAG: it continues the earlier agents' samples.

In a MARFT-style DAG (``configs/dag/marft.yaml``) the agents act in order on one task. The
first agent's rollout is a plain ``rollout.llm`` node with ``agent: <name>``: it samples
``n`` responses per task prompt, and each becomes one joint episode (one batch row) whose
GRPO group is the prompt. Every later agent is a ``rollout.llm_agent`` node: for each row it
builds its own prompt from the task prompt and the responses of the agents it ``sees``
(agent k sees agents 1..k-1), and samples exactly one response, so the row stays one episode
and the group and sample ids stay those of the first agent.

The node writes the plain per-agent fields (PROMPT_IDS, RESPONSE_IDS, OLD_LOGPROBS, ...);
its ``agent:`` field puts them under ``<agent>/`` in the batch (``embodied_rl.keys``).

Shapes: ``B`` rows in and out, ``P`` = ``max_prompt_length``, ``R`` = ``max_response_length``.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, strings
from rollout.llm import (
    LLM_ROLLOUT_WRITES,
    LLMRolloutConfig,
    empty_rollout_output,
    left_pad_prompts,
    respond,
    start_engine,
)

PROMPT_FIELD = "prompt"  # the task prompt's name in ``prompt_template``


@dataclass
class AgentRolloutConfig(LLMRolloutConfig):
    """Options of ``rollout.llm_agent``: those of ``rollout.llm`` (``n`` must stay 1) and

    Attributes:
        sees: the agents whose responses this agent reads, in acting order.
        prompt_template: this agent's prompt, a Python format string over ``{prompt}`` (the
            task prompt) and ``{<agent>}`` for each agent in ``sees`` (its response text).
            Empty: the task prompt followed by the seen responses, e.g. ``"49+34=" + "8"``.
    """

    n: int = 1
    sees: list[str] = field(default_factory=list)
    prompt_template: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n != 1:
            raise ValueError(
                f"rollout.llm_agent continues each incoming episode with one response, so n "
                f"must be 1 (got {self.n}); sample several episodes per prompt in the first "
                "agent's rollout.llm (its n)"
            )
        if len(set(self.sees)) != len(self.sees):
            raise ValueError(f"sees lists an agent twice: {self.sees}")
        if not self.prompt_template:
            self.prompt_template = "{" + PROMPT_FIELD + "}" + "".join(f"{{{a}}}" for a in self.sees)
        _check_template(self.prompt_template, self.sees)


def _check_template(template: str, sees: list[str]) -> None:
    """Every ``{field}`` is ``prompt`` or a seen agent, and every seen agent is shown."""
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as err:
        raise ValueError(f"prompt_template {template!r} is not a format string: {err}") from err
    known = {PROMPT_FIELD, *sees}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(
            f"prompt_template names {unknown}, which are neither {{prompt}} nor agents in "
            f"sees {sees}; add the agents to sees or fix the template"
        )
    unshown = [a for a in sees if a not in fields]
    if unshown:
        raise ValueError(
            f"agents {unshown} are in sees but prompt_template {template!r} never shows "
            f"them; add {{{unshown[0]}}} to the template or drop them from sees"
        )


def agent_rollout_reads(cfg: AgentRolloutConfig) -> tuple[str, ...]:
    """The task prompt, the sample ids, and each seen agent's response text."""
    seen = tuple(K.agent_key(agent, K.RESPONSE_TEXT) for agent in cfg.sees)
    return (K.PROMPT_TEXT, K.SAMPLE_ID, *seen)


# Continuing rows keeps the first agent's group and sample ids.
AGENT_ROLLOUT_WRITES = tuple(k for k in LLM_ROLLOUT_WRITES if k not in (K.GROUP_ID, K.SAMPLE_ID))


def agent_prompts(batch: TensorDict, cfg: AgentRolloutConfig) -> list[str]:
    """This agent's prompt text for every row: ``prompt_template`` filled in."""
    columns = {PROMPT_FIELD: strings(batch, K.PROMPT_TEXT)}
    for agent in cfg.sees:
        columns[agent] = strings(batch, K.agent_key(agent, K.RESPONSE_TEXT))
    rows = range(batch_len(batch))
    return [cfg.prompt_template.format(**{k: v[i] for k, v in columns.items()}) for i in rows]


@register_node(
    "rollout.llm_agent",
    reads=agent_rollout_reads,
    writes=AGENT_ROLLOUT_WRITES,
    config=AgentRolloutConfig,
    setup=lambda ctx: start_engine(ctx),
)
def agent_rollout(ctx: Any, batch: TensorDict) -> TensorDict:
    """One response of this agent for every row of ``batch``, prompted with what it sees.

    Args:
        ctx: the node context (``ctx.node_config`` is an :class:`AgentRolloutConfig`).
        batch: B episodes with PROMPT_TEXT, SAMPLE_ID and ``<agent>/response_text`` of every
            agent in ``sees``.

    Returns:
        The same B rows with this agent's PROMPT_IDS/PROMPT_MASK (B, P), RESPONSE_IDS (B, R),
        RESPONSE_MASK/OLD_LOGPROBS (B, R) float32 and RESPONSE_TEXT added.
    """
    cfg: AgentRolloutConfig = ctx.node_config
    if batch_len(batch) == 0:
        out = empty_rollout_output(batch, cfg)
        return batch.update({k: out.get(k) for k in AGENT_ROLLOUT_WRITES})
    policy = ctx.models[cfg.model]
    tokenizer = policy.tokenizer
    encoded = tokenizer(agent_prompts(batch, cfg))["input_ids"]
    batch[K.PROMPT_IDS], batch[K.PROMPT_MASK] = left_pad_prompts(
        encoded, batch[K.SAMPLE_ID].tolist(), cfg.max_prompt_length, tokenizer.pad_token_id
    )
    respond(ctx, policy, batch, encoded, cfg)
    return batch
