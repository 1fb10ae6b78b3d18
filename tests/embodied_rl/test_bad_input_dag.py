"""Bad DAG specs never end in a traceback: property-based tests of the DAG validator.

Hypothesis generates broken ``dag.nodes`` lists and mutated copies of the shipped DAGs.
Every outcome must be a consistent DAG or a ``DagValidationError`` that names each node
and ends every problem in ``Fix: <what to change>``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from embodied_rl.dag.spec import NODE_FIELDS, DagSpec, DagValidationError, validate_dag
from embodied_rl.registry import NODE_TYPES
from tests.embodied_rl.bad_input_common import (
    CONFIG_NAMES,
    FAST,
    KEYS,
    SCALARS,
    TYPE_NAMES,
    VALUES,
    assert_user_error,
    shipped_nodes,
)

NODE_IDS = st.sampled_from(["prompts", "rollout", "reward", "train", "a", "b"])


def _usable_id(entry: Any) -> str | None:
    node_id = entry.get("id") if isinstance(entry, dict) else None
    ok = isinstance(node_id, str) and node_id.strip() or type(node_id) is int
    return str(node_id) if ok else None


@st.composite
def node_configs(draw: st.DrawFn, type_name: Any) -> Any:
    """A config block: some of the type's own keys with valid or wild values, maybe more."""
    cls = NODE_TYPES.get(type_name).config_cls if type_name in TYPE_NAMES else None
    if cls is None or draw(st.integers(0, 5)) == 0:
        return draw(st.none() | VALUES)
    config = {}
    for spec in draw(st.lists(st.sampled_from(dataclasses.fields(cls)), unique=True, max_size=4)):
        default = None if spec.default is dataclasses.MISSING else spec.default
        config[spec.name] = draw(st.just(default) | st.integers(1, 4) | VALUES)
    if draw(st.booleans()):
        config[draw(KEYS)] = draw(SCALARS)
    return config


@st.composite
def node_entries(draw: st.DrawFn) -> Any:
    """One entry of ``dag.nodes``: mostly node-like, with every field possibly wrong."""
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)
    entry: dict[Any, Any] = {}
    if draw(st.integers(0, 9)):
        entry["id"] = draw(NODE_IDS | SCALARS)
    type_name = draw(
        st.sampled_from(TYPE_NAMES) | st.sampled_from(["nope", "rollout.lm"]) | SCALARS
    )
    if draw(st.integers(0, 9)):
        entry["type"] = type_name
    if draw(st.booleans()):
        entry["deps"] = draw(st.lists(NODE_IDS, max_size=3) | NODE_IDS | VALUES)
    if draw(st.booleans()):
        entry["config"] = draw(node_configs(type_name))
    if draw(st.integers(0, 3)) == 0:
        placement = {
            "workers": st.lists(st.integers(-1, 5), max_size=4) | VALUES,
            "num_workers": st.integers(-1, 6) | VALUES,
            "tp": st.integers(-1, 3) | VALUES,
        }
        entry["parallel"] = draw(st.fixed_dictionaries({}, optional=placement) | VALUES)
    if draw(st.integers(0, 5)) == 0:
        entry[draw(KEYS)] = draw(SCALARS)
    return entry


def check_dag_outcome(nodes: Any, num_workers: int) -> DagSpec | DagValidationError:
    """Validate; an accepted DAG must be consistent, a refused one must explain itself."""
    try:
        dag = validate_dag(nodes, num_workers)
    except DagValidationError as err:
        assert_user_error(err)
        ids = {_usable_id(e) for e in nodes} if isinstance(nodes, list) else set()
        assert all(issue.node is None or issue.node in ids for issue in err.issues)
        return err
    position = {node.id: i for i, node in enumerate(dag.nodes)}
    for node in dag.nodes:
        assert all(position[d] < position[node.id] for d in node.deps)
        assert set(node.layout.ranks) <= set(range(num_workers))
        assert node.global_batch is None or node.global_batch % node.layout.dp_size == 0
    return dag


@FAST
@given(nodes=st.lists(node_entries(), max_size=6) | VALUES, num_workers=st.integers(1, 5))
def test_random_dag_specs_validate_or_explain_every_problem(nodes, num_workers):
    outcome = check_dag_outcome(nodes, num_workers)
    if not isinstance(outcome, DagValidationError):
        return
    said = {}
    for issue in outcome.issues:
        said[issue.node] = said.get(issue.node, "") + str(issue)
    for entry in nodes if isinstance(nodes, list) else []:
        node_id = _usable_id(entry)
        if node_id is None:
            continue
        for key in set(entry) - set(NODE_FIELDS):  # an unknown field is always named
            assert str(key) in said.get(node_id, ""), (key, said)


@FAST
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data())
def test_mutated_shipped_dags_validate_or_explain_every_problem(name, data):
    nodes = copy.deepcopy(shipped_nodes(name))
    for _ in range(data.draw(st.integers(1, 3))):
        entry = data.draw(st.sampled_from(nodes))
        field = data.draw(st.sampled_from([*NODE_FIELDS, "extra"]))
        if field == "config" and isinstance(entry.get("config"), dict) and entry["config"]:
            key = data.draw(st.sampled_from(sorted(entry["config"])) | KEYS)
            entry["config"][key] = data.draw(VALUES)
        elif data.draw(st.booleans()):
            entry.pop(field, None)
        else:
            entry[field] = data.draw(VALUES | NODE_IDS | st.lists(NODE_IDS, max_size=2))
    check_dag_outcome(nodes, data.draw(st.integers(1, 5)))
