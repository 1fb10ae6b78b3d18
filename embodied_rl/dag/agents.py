"""Multi-agent DAGs: agent names and the per-agent outputs each agent's nodes read and write.

A node with ``agent: <name>`` acts for that agent: its per-agent fields
(``keys.AGENT_FIELDS``) live under ``<name>/`` (``embodied_rl.keys.key_of_agent``). These
checks keep agents from reading fields that belong to no agent and from overwriting each
other's outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embodied_rl import keys as K
from embodied_rl.dag.graph import NodeSpec
from embodied_rl.dag.issues import DagIssue


def _valid_agent_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name.strip()) and K.AGENT_SEPARATOR not in name


def check_agent_name(node_id: str, agent: Any, issues: list[DagIssue]) -> bool:
    """Whether a node's ``agent`` is absent or usable as a key namespace; reports it if not."""
    if agent is None or _valid_agent_name(agent):
        return True
    issues.append(
        DagIssue(
            node_id,
            f"agent must be a name without {K.AGENT_SEPARATOR!r}, got {agent!r}",
            "write e.g. agent: tens",
        )
    )
    return False


def check_agent_inputs(
    node: NodeSpec,
    upstream: set[str],
    writers: Mapping[str, list[NodeSpec]],
    issues: list[DagIssue],
) -> None:
    """An agent's node must not be handed per-agent fields that belong to no agent: it would
    not know whose they are (it reads its own under ``<agent>/``)."""
    stray = sorted(upstream & K.AGENT_FIELDS)
    if stray:
        sources = sorted({n.id for k in stray for n in writers.get(k, [])})
        issues.append(
            DagIssue(
                node.id,
                f"(agent {node.agent!r}) is handed the per-agent field(s) {stray} that belong "
                f"to no agent (written by {sources})",
                f"give {sources[0]!r} (and any other node writing them) the agent they "
                "belong to (agent: <name>)",
            )
        )


def check_agent_writers(
    node: NodeSpec, writers: Mapping[str, list[NodeSpec]], issues: list[DagIssue]
) -> None:
    """Two agents writing one key (e.g. both starting GRPO groups), or an agent that acts
    twice (two rollouts of one agent), would overwrite each other's outputs silently."""
    if node.agent is None:
        return
    for key in node.writes:
        others = [n for n in writers.get(key, []) if n.agent is not None]
        other_agent = next((n for n in others if n.agent != node.agent), None)
        if other_agent is not None:
            issues.append(
                DagIssue(
                    node.id,
                    f"(agent {node.agent!r}) writes {key!r}, which agent {other_agent.agent!r} "
                    f"already writes (node {other_agent.id!r})",
                    "let one agent write it: a later agent continues the earlier agents' "
                    "samples (type rollout.llm_agent writes no group or sample ids)",
                )
            )
        elif others and key == K.agent_key(node.agent, K.RESPONSE_IDS):
            issues.append(
                DagIssue(
                    node.id,
                    f"acts a second time for agent {node.agent!r} (node {others[0].id!r} "
                    "already writes its responses)",
                    "give each agent one rollout node; a new agent needs a name of its own",
                )
            )
