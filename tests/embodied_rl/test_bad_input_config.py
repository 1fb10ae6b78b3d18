"""Bad configs never end in a traceback: property-based tests of the config validator.

Hypothesis generates mutated copies of the shipped run configs and hydra overrides. Every
outcome must be a valid result or a user-facing error (``ConfigError``,
``DagValidationError``) whose message names what is wrong and ends in
``Fix: <what to change>``. Validation only: nothing here builds a model or starts Ray.
The DAG and prompt-file cases are in ``test_bad_input_dag.py`` and ``test_bad_input_data.py``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import types
import typing
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from embodied_rl.cli import main
from embodied_rl.dag.spec import NODE_FIELDS, PARALLEL_FIELDS, DagSpec, DagValidationError
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import (
    SECTIONS,
    TOP_LEVEL,
    ConfigError,
    compose,
    validate_config,
)
from embodied_rl.runtime.config_keys import check_unused
from embodied_rl.runtime.models import ModelSpec, OptimizerConfig, ParallelConfig
from tests.embodied_rl.bad_input_common import (
    CONFIG_NAMES,
    FAST,
    KEYS,
    SCALARS,
    SLOW,
    TYPE_NAMES,
    USER_ERRORS,
    VALUES,
    assert_user_error,
    shipped,
)
from tests.embodied_rl.synthetic_demos import input_overrides

CONFIG_CLASSES = [NODE_TYPES.get(n).config_cls for n in TYPE_NAMES]
OPTION_NAMES = {f.name for c in CONFIG_CLASSES if c is not None for f in dataclasses.fields(c)}


def _field_names(cls: type) -> set[str]:
    """The fields of a config dataclass and of the blocks nested in it (``trainer.wandb``)."""
    hints = typing.get_type_hints(cls)
    names = set()
    for f in dataclasses.fields(cls):
        names.add(f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            names |= _field_names(hints[f.name])
    return names


# Every name that is a valid key somewhere: a generated key outside this set is unknown
# wherever it is put.
KNOWN_NAMES = (
    TOP_LEVEL
    | OPTION_NAMES
    | {name for cls in SECTIONS.values() for name in _field_names(cls)}
    | {
        f.name
        for cls in (ModelSpec, OptimizerConfig, ParallelConfig)
        for f in dataclasses.fields(cls)
    }
    | set(NODE_FIELDS)
    | set(PARALLEL_FIELDS)
    | {"nodes"}
)
# Option mappings typed dict[str, Any]: their keys are checked by the policy or simulator
# when it is built, not by the validator.
OPEN_MAPPINGS = ("options", "simulator_options")


def validate_or_error(config: Any) -> DagSpec | Exception:
    try:
        return validate_config(OmegaConf.create(config))
    except USER_ERRORS as err:
        assert_user_error(err)
        return err


def _walk(tree: Any, path: tuple = ()) -> typing.Iterator[tuple[tuple, Any]]:
    """Every ``(path, value)`` below ``tree``; list items are addressed by index."""
    yield path, tree
    children = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for key, value in children:
        yield from _walk(value, (*path, key))


def _get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _open(path: tuple) -> bool:
    return any(key in OPEN_MAPPINGS for key in path)


def _dotted(path: tuple) -> str:
    return ".".join(str(key) for key in path)


@SLOW
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data())
def test_random_mutations_of_shipped_configs_never_crash(name, data):
    """Set, add and delete keys anywhere: a DAG or a user error, never a traceback."""
    tree = copy.deepcopy(shipped(name))
    for _ in range(data.draw(st.integers(1, 4))):
        path, value = data.draw(st.sampled_from(list(_walk(tree))[1:]))
        parent = _get(tree, path[:-1])
        action = data.draw(st.sampled_from(["set", "add", "delete"]))
        if action == "add" and isinstance(value, dict):
            value[data.draw(KEYS)] = data.draw(VALUES)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(VALUES)
    validate_or_error(tree)


@FAST
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data())
def test_an_unknown_key_at_any_level_is_an_error_naming_it(name, data):
    tree = copy.deepcopy(shipped(name))
    places = [
        path
        for path, value in _walk(tree)
        if isinstance(value, dict) and not _open(path) and path != ("models",)
    ]
    where = data.draw(st.sampled_from(places))
    key = data.draw(KEYS.filter(lambda k: k not in KNOWN_NAMES))
    _get(tree, where)[key] = data.draw(VALUES)
    outcome = validate_or_error(tree)
    assert isinstance(outcome, USER_ERRORS), f"{_dotted((*where, key))} was accepted"
    assert key in str(outcome)


def _wrong_values(hint: Any) -> st.SearchStrategy:
    """Values a config file might hold that do not fit ``hint`` (None, int, str, ...)."""
    allowed = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
    origins = {typing.get_origin(a) for a in allowed}
    choices = []
    if dict not in origins and not dataclasses.is_dataclass(hint):  # a nested block is a dict
        choices.append(st.dictionaries(KEYS, SCALARS, min_size=1, max_size=2))
    if not {list, tuple} & origins:
        choices.append(st.lists(st.integers(), min_size=1, max_size=2))
    if str not in allowed:
        choices.append(st.text(max_size=4))
    if allowed.isdisjoint({int, float}):
        choices.append(st.integers(-5, 5))
    if bool not in allowed:
        choices.append(st.booleans())
    if type(None) not in allowed:
        choices.append(st.none())
    return st.one_of(choices)


@FAST
@given(
    name=st.sampled_from(CONFIG_NAMES), section=st.sampled_from(sorted(SECTIONS)), data=st.data()
)
def test_a_wrong_type_in_a_section_names_the_key_and_the_type(name, section, data):
    tree = copy.deepcopy(shipped(name))
    hints = typing.get_type_hints(SECTIONS[section])
    field = data.draw(st.sampled_from(sorted(hints)))
    value = data.draw(_wrong_values(hints[field]))
    tree.setdefault(section, {})[field] = value
    outcome = validate_or_error(tree)
    assert isinstance(outcome, ConfigError), f"{section}.{field}={value!r} was accepted"
    assert f"{section}.{field} must be " in str(outcome)
    assert f"Fix: set {section}.{field} to " in str(outcome)


@FAST
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data())
def test_a_wrong_type_in_a_node_config_names_the_node_and_the_key(name, data):
    tree = copy.deepcopy(shipped(name))
    nodes = tree["dag"]["nodes"]
    index = data.draw(
        st.sampled_from([i for i, n in enumerate(nodes) if NODE_TYPES.get(n["type"]).config_cls])
    )
    node = nodes[index]
    hints = typing.get_type_hints(NODE_TYPES.get(node["type"]).config_cls)
    field = data.draw(st.sampled_from(sorted(f for f, h in hints.items() if h is not Any)))
    value = data.draw(_wrong_values(hints[field]))
    config = node.get("config")
    if isinstance(config, str):  # ${section}: the node reads that whole section
        _get(tree, tuple(config[2:-1].split(".")))[field] = value
    else:
        node.setdefault("config", {})[field] = value
    outcome = validate_or_error(tree)
    assert isinstance(outcome, DagValidationError), f"{node['id']}.{field}={value!r} accepted"
    assert any(
        issue.node == node["id"] and f"config.{field} must be " in issue.problem
        for issue in outcome.issues
    ), str(outcome)


@FAST
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data(), missing=KEYS)
def test_a_broken_interpolation_names_the_missing_key(name, data, missing):
    tree = copy.deepcopy(shipped(name))
    leaves = [p for p, v in _walk(tree) if p and not isinstance(v, dict | list)]
    path = data.draw(st.sampled_from(leaves))
    _get(tree, path[:-1])[path[-1]] = f"${{nope.{missing}}}"
    outcome = validate_or_error(tree)
    assert isinstance(outcome, ConfigError)
    assert f"Interpolation key 'nope.{missing}' not found" in str(outcome)


@FAST
@given(name=st.sampled_from(CONFIG_NAMES), data=st.data())
def test_a_deleted_key_is_either_optional_or_named_in_the_error(name, data):
    """A missing key: its default, or an error naming it (or the node its default breaks)."""
    tree = copy.deepcopy(shipped(name))
    keys = [p for p, _ in _walk(tree) if p and isinstance(_get(tree, p[:-1]), dict)]
    path = data.draw(st.sampled_from(keys))
    del _get(tree, path[:-1])[path[-1]]
    outcome = validate_or_error(tree)
    if isinstance(outcome, ConfigError):
        assert str(path[-1]) in str(outcome), (_dotted(path), str(outcome))
    elif isinstance(outcome, DagValidationError):  # a default took its place: the node is named
        named = [issue for issue in outcome.issues if str(path[-1]) in str(issue)]
        assert named or all(issue.node is not None for issue in outcome.issues), str(outcome)


def _section_references(tree: Any) -> list[tuple]:
    """Paths of keys whose value passes a whole section on (``${simulator.options}``)."""
    return [
        path
        for path, value in _walk(tree)
        if path
        and isinstance(value, str)
        and value.startswith("${")
        and isinstance(_resolves_to(tree, value[2:-1]), dict)
    ]


def _resolves_to(tree: Any, dotted: str) -> Any:
    try:
        return _get(tree, tuple(dotted.split(".")))
    except (KeyError, TypeError):
        return None


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_deleted_section_reference_is_named_in_the_error(name):
    """Deleting ``simulator_options: ${simulator.options}`` leaves the section's keys
    unreferenced; the error must name the deleted option, not a near-miss spelling of one of
    those keys (CI's hypothesis run once drew rollout.reach.simulator_options and got
    'did you mean simulator.options.video_size?')."""
    for path in _section_references(shipped(name)):
        tree = copy.deepcopy(shipped(name))
        del _get(tree, path[:-1])[path[-1]]
        outcome = validate_or_error(tree)
        if isinstance(outcome, ConfigError):
            assert str(path[-1]) in str(outcome), (_dotted(path), str(outcome))


OVERRIDE_VALUES = st.sampled_from(["abc", "-1", "0", "null", "[1,2]", "{a: 1}", "1.5", "${x}"])


@st.composite
def overrides(draw: st.DrawFn, name: str) -> list[str]:
    """Hydra command-line overrides: changes, additions and deletions of real or made-up keys."""
    paths = [_dotted(p) for p, _ in _walk(shipped(name)) if p and not isinstance(p[-1], int)]
    paths = [p for p in paths if ".nodes." not in p]  # hydra cannot address list items
    made = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        value = draw(OVERRIDE_VALUES | st.integers(-2, 99).map(str))
        made.append(
            draw(
                st.sampled_from(
                    [f"{path}={value}", f"+{path}.{draw(KEYS)}={value}", f"~{path}", f"{path}"]
                )
            )
        )
    return made


@SLOW
@given(data=st.data(), name=st.sampled_from(CONFIG_NAMES))
def test_the_validate_command_answers_bad_overrides_with_an_error_line(data, name):
    args = data.draw(overrides(name))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["validate", "--config-name", name, *args])
    assert code in (0, 2), err.getvalue()
    if code == 2:
        lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
        assert lines, err.getvalue()
        assert "Fix: " in err.getvalue()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["trainer.foo=1"],
            "unknown key trainer.foo in the override of 'grpo_llm'. Fix: use a key trainer has: ['checkpoint_every',",
        ),
        (["rollout.temprature=2"], "unknown key rollout.temprature (did you mean 'temperature'?)"),
        (
            ["+rollout.temprature=2"],
            "node 'rollout': unknown key config.temprature (did you mean config.temperature?)",
        ),
        (
            ["+data.batch_sise=4"],
            "unknown config key data.batch_sise: no node type has an option 'batch_sise' and no node's config refers to data.batch_sise (did you mean data.batch_size?)",
        ),
        (
            ["+models.actor.optimizer.lrr=1"],
            "unknown key models.actor.optimizer.lrr (did you mean models.actor.optimizer.lr?)",
        ),
        (
            ["+models.actor.dtype=float32"],
            "unknown key models.actor.dtype. Fix: use only the valid keys ['policy', 'options', "
            "'trainable', 'optimizer', 'parallel', 'init_from']",
        ),
        (["+eval.evry=2"], "unknown key eval.evry (did you mean eval.every?)"),
        (["+foo=1"], "unknown top-level key 'foo'"),
        (
            ["workers.num_workers=abc"],
            "workers.num_workers must be an int, got 'abc' (str). Fix: set workers.num_workers to an int",
        ),
        (
            ["rollout.n=2.5"],
            "node 'rollout': config.n must be an int, got 2.5 (float). Fix: set config.n to an int",
        ),
        (["trainer.total_steps=-3"], "trainer: total_steps must be > 0, got -3"),
        (
            ["algorithm.actor.model=critic"],
            "node 'train': its config.model is 'critic', but models has no 'critic'",
        ),
        (
            ["data.batch_size=${data.size}"],
            "cannot resolve dag.nodes[0].config.batch_size: Interpolation key 'data.size' not found",
        ),
        (["dag=-1"], "cannot compose 'grpo_llm' with ['dag=-1']"),
        (["dag=[1,2]"], "cannot compose 'grpo_llm' with ['dag=[1,2]']"),  # found by hypothesis
        (["device=tpu"], "device must be one of ('cpu', 'cuda', 'npu'), got 'tpu'"),
    ],
)
def test_the_validate_command_names_the_key_and_the_fix(overrides, expected, capsys):
    assert main(["validate", "--config-name", "grpo_llm", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and "Fix: " in err, err


def test_keys_that_no_node_of_this_dag_uses_are_named_in_a_warning(caplog):
    # grpo_libero inherits srpo_libero's SRPO sections but runs the binary-reward DAG.
    with caplog.at_level("WARNING", logger="embodied_rl.runtime.config"):
        validate_config(compose("grpo_libero"))
    assert [r.getMessage() for r in caplog.records] == [
        "config keys not used by this run's DAG(s): algorithm.dynamic_sampling, encoder, srpo"
    ]


def test_a_key_read_through_oc_select_is_used(caplog):
    # dag/sft.yaml reads data.suite as ${oc.select:data.suite,null} (configs without it pass);
    # sft_libero sets it, and it was named unused on every run.
    with caplog.at_level("WARNING", logger="embodied_rl.runtime.config"):
        validate_config(compose("sft_libero", list(input_overrides("sft_libero"))))
    assert [r.getMessage() for r in caplog.records] == []
    assert check_unused({"data": {"suite": "s"}, "x": "${oc.select:data.suite, null}"}) == []
    assert check_unused({"data": {"suite": "s"}, "x": "${oc.select:data.suit,null}"}) == [
        "data.suite"
    ]
