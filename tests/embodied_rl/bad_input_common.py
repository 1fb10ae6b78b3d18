"""Shared parts of the bad-input tests (``test_bad_input_*.py``): value strategies, the
shipped configs and the check that an error is a user-facing one.

Bad input never ends in a traceback: every outcome must be a valid result or a user-facing
error (``ConfigError``, ``DagValidationError``) whose message names what is wrong and ends in
``Fix: <what to change>``. Validation only: nothing here builds a model or starts Ray.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from embodied_rl.dag.spec import DagValidationError
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import CONFIG_DIR, ConfigError, compose, load_all_plugins
from tests.embodied_rl.synthetic_demos import input_overrides
from tests.hypothesis_profiles import examples

load_all_plugins({})  # the node types of every plugin, as `embodied-rl validate` sees them

USER_ERRORS = (ConfigError, DagValidationError)
CONFIG_NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
TYPE_NAMES = NODE_TYPES.names()

KEYS = st.from_regex(r"[a-z_][a-z0-9_]{0,9}", fullmatch=True)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 9)
    | st.integers(-(2**63), 2**63)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["", "auto", "cpu", "1e3", "-1", "data.prompts", "prompts"])
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
FAST = settings(
    max_examples=examples(60)
)  # the rest from the profile (tests/hypothesis_profiles.py)
SLOW = settings(max_examples=examples(25))


@functools.cache
def shipped(name: str) -> dict[str, Any]:
    """A shipped config as composed (with the input files it needs), interpolations not
    resolved (plain data)."""
    return OmegaConf.to_container(compose(name, list(input_overrides(name))), resolve=False)


@functools.cache
def shipped_nodes(name: str) -> list[dict[str, Any]]:
    """The resolved ``dag.nodes`` of a shipped config."""
    composed = compose(name, list(input_overrides(name)))
    return OmegaConf.to_container(composed, resolve=True)["dag"]["nodes"]


def assert_user_error(err: Exception) -> None:
    """A user-facing error: one of ours, with a fix for every problem it lists."""
    assert isinstance(err, USER_ERRORS), f"{type(err).__name__}: {err}"
    if isinstance(err, DagValidationError):
        assert err.issues
        for issue in err.issues:
            assert issue.problem and issue.fix, issue
            assert f". Fix: {issue.fix}" in str(issue)
    else:
        assert err.fix, str(err)
        assert str(err).endswith(f". Fix: {err.fix}")
