"""Every DAG validation error names the node and the fix."""

from __future__ import annotations

import copy

import pytest

import embodied_rl.nodes  # noqa: F401  (registers the core node types)
from embodied_rl import keys as K
from embodied_rl.dag.node_type import register_node
from embodied_rl.dag.spec import DagValidationError, validate_dag
from embodied_rl.registry import NODE_TYPES

if "test.count_prompts" not in NODE_TYPES:
    # A real (tiny) node type whose reads the dataloader satisfies.
    register_node("test.count_prompts", reads=(K.PROMPT_TEXT,), writes=(K.REWARDS, K.GROUP_ID))(
        lambda ctx, batch: batch
    )

GOOD = [
    {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
    {"id": "advantage", "type": "test.count_prompts", "deps": ["prompts"]},
]


def issues_of(nodes, num_workers=2) -> list[str]:
    with pytest.raises(DagValidationError) as info:
        validate_dag(nodes, num_workers)
    return [str(issue) for issue in info.value.issues]


def test_good_dag_validates():
    dag = validate_dag(GOOD, 2)
    assert [n.id for n in dag.nodes] == ["prompts", "advantage"]
    assert dag.by_id["advantage"].global_batch == 8
    assert dag.by_id["advantage"].reads == (K.PROMPT_TEXT,)


def test_topological_order_follows_deps_not_yaml_order():
    nodes = [
        {"id": "b", "type": "data.prompts", "config": {"batch_size": 4}},
        {"id": "a", "type": "data.prompts", "config": {"batch_size": 4}},
    ]
    dag = validate_dag(nodes, 2)
    assert [n.id for n in dag.nodes] == ["b", "a"]
    assert dag.by_id["a"].global_batch == 4


def test_cycle_is_reported_with_its_path():
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
        {"id": "x", "type": "ref.logprobs", "deps": ["prompts", "y"]},
        {"id": "y", "type": "ref.logprobs", "deps": ["x"]},
    ]
    errors = issues_of(nodes)
    cycle = [e for e in errors if "cycle" in e]
    assert len(cycle) == 1
    assert "x -> y -> x" in cycle[0] or "y -> x -> y" in cycle[0]
    assert "Fix: remove one dependency" in cycle[0]


def test_unknown_dependency_suggests_close_id():
    nodes = copy.deepcopy(GOOD)
    nodes[1]["deps"] = ["promts"]
    errors = issues_of(nodes)
    assert any(
        "node 'advantage': unknown dependency 'promts' (did you mean 'prompts'?)" in e
        for e in errors
    )


def test_unknown_node_type_lists_registered_types():
    nodes = copy.deepcopy(GOOD)
    nodes[1]["type"] = "advantage.grp"
    (error,) = issues_of(nodes)
    assert (
        "node 'advantage': unknown node type 'advantage.grp' (did you mean 'advantage.grpo'?)"
        in error
    )
    assert "use a registered type:" in error and "data.prompts" in error


def test_duplicate_id():
    nodes = copy.deepcopy(GOOD) + [{"id": "prompts", "type": "data.prompts"}]
    (error,) = issues_of(nodes)
    assert error.startswith("node 'prompts': duplicate node id")
    assert "rename one of the nodes" in error


def test_unreachable_node_without_source():
    nodes = copy.deepcopy(GOOD) + [{"id": "lonely", "type": "test.count_prompts"}]
    errors = issues_of(nodes)
    assert any(
        e.startswith("node 'lonely': unreachable")
        and "add 'prompts' (or a node it feeds) to its deps" in e
        for e in errors
    )


def test_missing_input_key_names_the_keys():
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
        {"id": "train", "type": "actor.train", "deps": ["prompts"]},
    ]
    (error,) = issues_of(nodes)
    assert error.startswith("node 'train': reads [")
    assert "'advantages'" in error and "'old_logprobs'" in error
    assert "add a dep on a node that writes these keys" in error


def test_kl_needs_reference_logprobs():
    """kl_coef > 0 makes actor.train read REF_LOGPROBS: config-dependent reads."""
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
        {"id": "train", "type": "actor.train", "deps": ["prompts"], "config": {"kl_coef": 0.1}},
    ]
    (error,) = issues_of(nodes)
    assert "'ref_logprobs'" in error


def test_batch_not_divisible_by_dp_size():
    nodes = [{"id": "prompts", "type": "data.prompts", "config": {"batch_size": 6}}]
    (error,) = issues_of(nodes, num_workers=4)
    assert "global batch of 6 samples is not divisible by its data-parallel size 4" in error
    assert "multiple of 4" in error


def test_tp_reduces_dp_size_for_divisibility():
    nodes = [
        {
            "id": "prompts",
            "type": "data.prompts",
            "config": {"batch_size": 6},
            "parallel": {"tp": 2},
        }
    ]
    dag = validate_dag(nodes, 4)  # dp = 2 divides 6
    assert dag.by_id["prompts"].layout.dp_size == 2


def test_node_on_more_workers_than_exist():
    nodes = copy.deepcopy(GOOD)
    nodes[1]["parallel"] = {"workers": [0, 1, 2, 5]}
    (error,) = issues_of(nodes, num_workers=4)
    assert "placed on workers [0, 1, 2, 5] but the run has only 4 worker(s)" in error
    assert "raise workers.num_workers to at least 6" in error


def test_num_workers_larger_than_run():
    nodes = copy.deepcopy(GOOD)
    nodes[0]["parallel"] = {"num_workers": 3}
    (error,) = issues_of(nodes, num_workers=2)
    assert "node 'prompts': placed on 3 workers but the run has only 2 worker(s)" in error
    assert "Fix: raise workers.num_workers to at least 3" in error


def test_unknown_node_config_key_lists_valid_keys():
    nodes = copy.deepcopy(GOOD)
    nodes[1]["type"] = "advantage.grpo"
    nodes[1]["config"] = {"norm_by_sdt": False}
    (error,) = issues_of(nodes)
    assert error == (
        "node 'advantage': unknown key config.norm_by_sdt (did you mean config.norm_by_std?). "
        "Fix: use only the valid keys ['eps', 'norm_by_std']"
    )


def test_unknown_node_field():
    nodes = copy.deepcopy(GOOD)
    nodes[1]["dependencies"] = ["prompts"]
    errors = issues_of(nodes)
    assert any("unknown field(s) ['dependencies']" in e for e in errors)


def test_all_problems_reported_at_once():
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
        {"id": "a", "type": "nope"},
        {"id": "b", "type": "advantage.grpo", "deps": ["zzz"]},
    ]
    errors = issues_of(nodes)
    assert len(errors) >= 2
    assert any("'a'" in e for e in errors) and any("'zzz'" in e for e in errors)


def test_missing_data_file_fails_validation():
    nodes = [{"id": "prompts", "type": "data.prompts", "config": {"path": "no/such.jsonl"}}]
    (error,) = issues_of(nodes)
    assert "data file 'no/such.jsonl' not found" in error
    assert "set data.train_path to an existing JSONL or Parquet file" in error


def test_resampling_node_must_run_on_its_upstream_workers():
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"batch_size": 8}},
        {"id": "score", "type": "test.count_prompts", "deps": ["prompts"]},
        {
            "id": "filter",
            "type": "filter.dynamic_sampling",
            "deps": ["score"],
            "parallel": {"workers": [0]},
        },
    ]
    errors = issues_of(nodes)
    assert any(
        "node 'filter': re-runs its upstream nodes, which also run on worker(s) [1]" in e
        and "place the node on every worker its upstream nodes use" in e
        for e in errors
    )


def test_wrong_value_types_name_the_key_and_the_type_wanted():
    nodes = copy.deepcopy(GOOD)
    nodes[0]["config"] = {"batch_size": "eight", "shuffle": "yes"}
    (error,) = issues_of(nodes)
    assert error == (
        "node 'prompts': config.batch_size must be an int, got 'eight' (str); "
        "config.shuffle must be true or false, got 'yes' (str). "
        "Fix: set config.batch_size to an int; set config.shuffle to true or false"
    )


def test_range_checks_of_the_config_class_become_issues():
    nodes = copy.deepcopy(GOOD)
    nodes[0]["config"] = {"batch_size": -2}
    (error,) = issues_of(nodes)
    assert error.startswith("node 'prompts': config: batch_size must be >= 1, got -2. Fix:")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"type": "advantage.grpo", "config": [1]}, "config must be a mapping, got [1] (list)"),
        ({"config": {"x": 1}}, "node type 'test.count_prompts' takes no config"),
        ({"deps": 5.5}, "'deps' must be a list of node ids, got 5.5"),
        ({"deps": [["prompts"]]}, "'deps' must be a list of node ids"),
        ({"parallel": {"tp": "2"}}, "parallel.tp must be an int >= 1, got '2'"),
        ({"parallel": {"workers": "01"}}, "parallel.workers must be a non-empty list"),
        ({"parallel": {"num_workers": 0}}, "parallel.num_workers must be an int >= 1, got 0"),
        ({"parallel": {"tpp": 1}}, "unknown parallel key(s) ['tpp'] (did you mean 'tp'?)"),
        ({"type": None}, "has no 'type'"),
        ({"type": ["data.prompts"]}, "unknown node type ['data.prompts']"),
    ],
)
def test_malformed_node_entries_are_issues_not_crashes(entry, expected):
    nodes = copy.deepcopy(GOOD)
    nodes[1].update(entry)
    if entry.get("type", 0) is None:
        del nodes[1]["type"]
    errors = issues_of(nodes)
    assert any(e.startswith("node 'advantage': ") and expected in e for e in errors), errors
    assert all(". Fix: " in e for e in errors)


def test_entries_without_a_usable_id_are_counted_by_position():
    errors = issues_of([GOOD[0], "rollout", {"id": ["x"], "type": "data.prompts"}])
    assert errors == [
        "dag: node #1 has no usable 'id' (it is not a mapping). Fix: give every node a "
        "unique id: a non-empty name such as 'rollout'",
        "dag: node #2 has no usable 'id' (got id ['x']). Fix: give every node a unique id: "
        "a non-empty name such as 'rollout'",
    ]


def test_an_invalid_node_is_reported_once_not_again_by_its_dependents():
    nodes = copy.deepcopy(GOOD) + [
        {"id": "after", "type": "test.count_prompts", "deps": ["advantage"]}
    ]
    nodes[1]["type"] = "advantage.grp"
    (error,) = issues_of(nodes)  # no "unknown dependency" or "unreachable" for 'after'
    assert error.startswith("node 'advantage': unknown node type 'advantage.grp'")


def test_without_answers_a_reward_that_needs_them_fails_validation():
    nodes = [
        {"id": "prompts", "type": "data.prompts", "config": {"with_answers": False}},
        {"id": "reward", "type": "reward.arithmetic", "deps": ["prompts"]},
    ]
    (error,) = issues_of(nodes)  # this graph lacks a rollout: responses are missing anyway
    assert error.startswith("node 'reward': reads ['response_text', 'answer_text'] but no")
    nodes[0]["config"]["with_answers"] = True
    (error,) = issues_of(nodes)
    assert error.startswith("node 'reward': reads ['response_text'] but no")


def test_task_manifest_config_errors_name_the_key():
    base = {"id": "tasks", "type": "data.tasks"}
    (missing,) = issues_of([{**base, "config": {"num_init_states": 10}}])
    assert missing == (
        "node 'tasks': config lacks the required key 'num_tasks'. Fix: set config.num_tasks"
    )
    config = {"num_tasks": 3, "num_init_states": 10, "batch_size": 2}
    (unknown,) = issues_of([{**base, "config": {**config, "tasks": [0, 3, 7]}}])
    assert "task ids [3, 7] do not exist: a suite of num_tasks=3 has ids 0..2" in unknown
    (twice,) = issues_of([{**base, "config": {**config, "tasks": [1, 1]}}])
    assert "task ids [1] are listed more than once" in twice
    (empty,) = issues_of([{**base, "config": {**config, "tasks": []}}])
    assert "tasks is an empty list; list task ids, or set tasks: null for all" in empty
    (split,) = issues_of([{**base, "config": {**config, "split": "heldout", "heldout_every": 0}}])
    assert "split 'heldout' of 10 init states with heldout_every=0 is empty" in split


# ----------------------------------------------------------------------------- branches
BRANCHES = {"llm": {"workers": [0, 1]}, "vla": {"workers": [2, 3]}}


def branch_nodes(prefix: str, branch: str, **extra) -> list[dict]:
    return [
        {"id": f"{prefix}_prompts", "type": "data.prompts", "branch": branch, "config": {"batch_size": 8}, **extra},
        {"id": f"{prefix}_count", "type": "test.count_prompts", "branch": branch, "deps": [f"{prefix}_prompts"]},
    ]  # fmt: skip


def branch_issues(nodes, branches, num_workers=4) -> list[str]:
    with pytest.raises(DagValidationError) as info:
        validate_dag(nodes, num_workers, branches)
    return [str(issue) for issue in info.value.issues]


def test_branches_place_their_nodes_on_their_own_workers():
    dag = validate_dag(branch_nodes("a", "llm") + branch_nodes("b", "vla"), 4, BRANCHES)
    assert dag.branches == {"llm": (0, 1), "vla": (2, 3)}
    assert dag.by_id["a_count"].layout.ranks == (0, 1) and dag.by_id["a_count"].branch == "llm"
    assert dag.by_id["b_prompts"].layout.ranks == (2, 3)
    # A node may narrow its placement inside its branch.
    narrow = branch_nodes("a", "llm") + branch_nodes("b", "vla", parallel={"workers": [3]})
    narrow[3]["parallel"] = {"workers": [3]}
    assert validate_dag(narrow, 4, BRANCHES).by_id["b_prompts"].layout.ranks == (3,)


def test_bad_branches_are_refused_naming_the_branch_or_node_and_the_fix():
    both = branch_nodes("a", "llm") + branch_nodes("b", "vla")
    errors = branch_issues(both, {"llm": {"workers": [0, 1]}, "vla": {"workers": []}})
    assert errors == [
        "branch 'vla': has no workers. Fix: give it workers of its own, e.g. workers: [0, 1] "
        "(or num_workers: 2)",
        "node 'b_prompts': names branch 'vla', which dag.branches does not define (known: "
        "llm). Fix: define it under dag.branches with its workers, or fix the node's branch",
        "node 'b_count': names branch 'vla', which dag.branches does not define (known: llm). "
        "Fix: define it under dag.branches with its workers, or fix the node's branch",
    ]
    outside = branch_nodes("a", "llm", parallel={"workers": [1, 2]})
    errors = branch_issues(outside, {"llm": {"workers": [0, 1]}})
    assert errors[0].startswith("node 'a_prompts': is placed on worker(s) [2] outside its branch")
    errors = branch_issues(branch_nodes("a", "llm"), BRANCHES)
    assert errors == [
        "branch 'vla': has no nodes. Fix: set 'branch: vla' on the nodes it should run, or "
        "remove it"
    ]
    errors = branch_issues(branch_nodes("a", "llm"), {"llm": {"workers": [0, 5]}})
    assert errors[0].startswith("branch 'llm': placed on workers [0, 5] but the run has only 4")


# ----------------------------------------------------------------------------- agents
def marft_nodes() -> list[dict]:
    """The marft_llm DAG (two agents, tens on worker 0 and units on worker 1) as plain data."""
    from omegaconf import OmegaConf

    import rollout  # noqa: F401  (registers rollout.llm and rollout.llm_agent)
    from embodied_rl.runtime.config import compose

    cfg = compose("marft_llm")
    return OmegaConf.to_container(cfg.dag.nodes, resolve=True)


def node_of(nodes: list[dict], node_id: str) -> dict:
    return next(n for n in nodes if n["id"] == node_id)


def test_agent_nodes_read_and_write_in_their_agents_namespace():
    dag = validate_dag(marft_nodes(), 2)
    units = dag.by_id["units_rollout"]
    assert units.agent == "units" and units.layout.ranks == (1,)
    assert "tens/response_text" in units.reads and K.PROMPT_TEXT in units.reads
    assert "units/response_ids" in units.writes and "units/old_logprobs" in units.writes
    # The later agent continues the first agent's episodes: it writes no group ids.
    assert K.GROUP_ID not in units.writes and K.GROUP_ID in dag.by_id["tens_rollout"].writes
    train = dag.by_id["tens_train"]
    assert "tens/advantages" in train.reads and "tens/response_ids" in train.reads
    assert dag.by_id["advantage"].writes == (
        "tens/advantages",
        "tens/returns",
        "units/advantages",
        "units/returns",
    )


def test_an_agent_reading_an_output_no_earlier_agent_writes_is_refused():
    typo = marft_nodes()
    node_of(typo, "units_rollout")["config"]["sees"] = ["tns"]
    assert issues_of(typo) == [
        "node 'units_rollout': (agent 'units') reads 'tns/response_text', an output of agent "
        "'tns', but no node of agent 'tns' writes it. Fix: depend on the node of agent 'tns' "
        "that writes it (an agent sees only agents that acted before it), or fix the agent's "
        "name in the config"
    ]
    # The tens agent cannot see the units agent: units acts after it.
    backwards = marft_nodes()
    node_of(backwards, "tens_rollout").update(type="rollout.llm_agent")
    node_of(backwards, "tens_rollout")["config"].update(n=1, sees=["units"])
    problems = issues_of(backwards)
    assert (
        "node 'tens_rollout': (agent 'tens') reads 'units/response_text', an output of agent "
        "'units', but only ['units_rollout'] write(s) it, which do(es) not run before this node"
    ) in problems[0]


def test_two_agents_writing_one_key_are_refused():
    both_group = marft_nodes()
    units = node_of(both_group, "units_rollout")
    units["type"] = "rollout.llm"  # samples n groups of its own: rewrites the group ids
    for key in ("sees", "prompt_template"):
        units["config"].pop(key, None)
    problems = issues_of(both_group)
    assert problems[0] == (
        "node 'units_rollout': (agent 'units') writes 'group_id', which agent 'tens' already "
        "writes (node 'tens_rollout'). Fix: let one agent write it: a later agent continues "
        "the earlier agents' samples (type rollout.llm_agent writes no group or sample ids)"
    )
    twice = marft_nodes()
    node_of(twice, "units_rollout")["agent"] = "tens"
    assert (
        "node 'units_rollout': acts a second time for agent 'tens' (node 'tens_rollout' "
        "already writes its responses). Fix: give each agent one rollout node; a new agent "
        "needs a name of its own"
    ) in issues_of(twice)


def test_per_agent_fields_of_no_agent_and_bad_agent_names_are_refused():
    stray = marft_nodes()
    node_of(stray, "tens_rollout").pop("agent")  # its responses belong to no agent now
    problems = issues_of(stray)
    assert (
        "node 'units_rollout': (agent 'units') is handed the per-agent field(s) ['old_logprobs', "
        "'prompt_ids', 'prompt_mask', 'response_ids', 'response_mask', 'response_text'] that "
        "belong to no agent (written by ['tens_rollout']). Fix: give 'tens_rollout' (and any "
        "other node writing them) the agent they belong to (agent: <name>)"
    ) in problems, problems
    slash = marft_nodes()
    node_of(slash, "tens_values")["agent"] = "tens/critic"
    assert issues_of(slash) == [
        "node 'tens_values': agent must be a name without '/', got 'tens/critic'. Fix: write "
        "e.g. agent: tens"
    ]


def test_an_agent_rollout_config_that_cannot_work_is_refused():
    for config, message in (
        ({"n": 4, "sees": ["tens"]}, "n must be 1 (got 4)"),
        ({"sees": ["tens"], "prompt_template": "{prompt}{units}"}, "names ['units']"),
        ({"sees": ["tens"], "prompt_template": "{prompt}"}, "never shows them"),
    ):
        nodes = marft_nodes()
        node_of(nodes, "units_rollout")["config"].update(config)
        (problem,) = issues_of(nodes)
        assert problem.startswith("node 'units_rollout': config: ") and message in problem
