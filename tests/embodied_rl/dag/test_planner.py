"""Plans: per-rank node lists, transfers where layouts change, canonical process groups."""

from __future__ import annotations

import embodied_rl.nodes  # noqa: F401
from embodied_rl.dag.planner import RunNode, Transfer, format_plan, plan_dag, process_groups
from embodied_rl.dag.spec import validate_dag


def test_plan_places_nodes_and_transfers():
    nodes = [
        {
            "id": "prompts",
            "type": "data.prompts",
            "config": {"batch_size": 8},
            "parallel": {"workers": [0, 1]},
        },
        {"id": "all", "type": "data.prompts", "config": {"batch_size": 8}},
    ]
    dag = validate_dag(nodes, 4)
    plans = plan_dag(dag)
    assert plans[0].node_ids() == ["prompts", "all"]
    assert plans[3].node_ids() == ["all"]
    step = plans[1].steps[0]
    assert isinstance(step, RunNode) and step.layout.dp_rank(1) == 1 and step.layout.dp_size == 2
    assert step.dp_group == (0, 1)


def test_transfer_between_layouts_involves_the_union():
    from embodied_rl.dag.node_type import register_node
    from embodied_rl.registry import NODE_TYPES

    if "test.passthrough" not in NODE_TYPES:
        register_node("test.passthrough")(lambda ctx, batch: batch)
    nodes = [
        {
            "id": "prompts",
            "type": "data.prompts",
            "config": {"batch_size": 8},
            "parallel": {"workers": [0, 1]},
        },
        {"id": "wide", "type": "test.passthrough", "deps": ["prompts"], "parallel": {"tp": 2}},
        {"id": "same", "type": "test.passthrough", "deps": ["wide"], "parallel": {"tp": 2}},
    ]
    dag = validate_dag(nodes, 4)
    plans = plan_dag(dag)
    transfers = [s for s in plans[3].steps if isinstance(s, Transfer)]
    assert len(transfers) == 1 and transfers[0].ranks == (0, 1, 2, 3)
    assert transfers[0].src.dp_size == 2 and transfers[0].dst.dp_size == 2
    # equal layouts: no transfer between wide and same
    assert all(t.dst_node == "wide" for p in plans for t in p.steps if isinstance(t, Transfer))
    # tp=2 over 4 ranks: dp groups pair ranks with the same tp position
    wide_on_3 = next(s for s in plans[3].steps if isinstance(s, RunNode) and s.node_id == "wide")
    assert wide_on_3.dp_group == (1, 3)
    groups = process_groups(plans)
    assert groups == sorted(groups, key=lambda g: (len(g), g))
    assert (0, 2) in groups and (1, 3) in groups and (0, 1) in groups and (0, 1, 2, 3) in groups
    text = format_plan(dag, plans)
    assert "rank 2:" in text and "transfer prompts -> wide" in text and "[receive]" in text


def test_plan_names_the_code_of_each_node():
    """``embodied-rl plan`` leads from a node to its code: ``module:function`` that imports
    back to the registered function (and its setup)."""
    import importlib

    from embodied_rl.registry import NODE_TYPES

    nodes = [{"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}}]
    dag = validate_dag(nodes, 2)
    text = format_plan(dag, plan_dag(dag))
    line = next(x for x in text.splitlines() if x.startswith("  prompts (data.prompts): "))
    where = line.split(": ", 1)[1]
    function, _, setup = where.partition(" (setup: ")
    node_type = NODE_TYPES.get("data.prompts")
    for named, registered in ((function, node_type.fn), (setup.rstrip(")"), node_type.setup)):
        if registered is None:
            assert not named, where
            continue
        module, _, qualname = named.partition(":")
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        assert found is registered, (named, registered)
