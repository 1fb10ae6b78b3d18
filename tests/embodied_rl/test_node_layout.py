"""Where code lives: a node type's prefix names its module, and one registration style.

- A node type ``<prefix>.<name>`` is defined in ``embodied_rl.nodes.<prefix>`` (a module or a
  package of that name), or in a plugin package named by the prefix (``rollout.*`` in
  ``rollout``), so a reader of a DAG file finds ``advantage.gae`` in ``nodes/advantage.py``.
- No node module is imported by another module for a helper: shared machinery lives in the
  update engine (``embodied_rl.training``) or the node context, and node modules import no
  other node module.
- Components register with the decorator form (``@POLICIES.register("mlp")`` on the builder,
  ``@register_node(...)`` on the node function), never with a bare call at module level.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from embodied_rl.registry import NODE_TYPES, PLUGIN_MODULES, load_plugins

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("embodied_rl", "policies", "simulators", "rollout")
CORE_NODES = "embodied_rl.nodes"


def _defining_module_allowed(type_name: str, module: str) -> bool:
    """Whether ``module`` may define the node type ``type_name`` (the rule in the doc)."""
    prefix = type_name.split(".", 1)[0]
    homes = (f"{CORE_NODES}.{prefix}", prefix if prefix in PLUGIN_MODULES else None)
    return any(home and (module == home or module.startswith(home + ".")) for home in homes)


@pytest.fixture(scope="module")
def every_node_type():
    import embodied_rl.nodes  # noqa: F401  (core node types)
    import embodied_rl.tasks  # noqa: F401

    load_plugins()
    return {name: NODE_TYPES.get(name) for name in NODE_TYPES.names()}


def test_the_rule_accepts_and_refuses_what_it_should():
    assert _defining_module_allowed("advantage.gae", "embodied_rl.nodes.advantage")
    assert _defining_module_allowed("reward.srpo", "embodied_rl.nodes.reward.srpo")
    assert _defining_module_allowed("rollout.env", "rollout.env")
    assert not _defining_module_allowed("advantage.gae", "embodied_rl.nodes.critic")
    assert not _defining_module_allowed("reward.srpo", "embodied_rl.nodes.rewards")
    assert not _defining_module_allowed("encode.video", "policies.encoders")
    assert not _defining_module_allowed("advantage.x", "embodied_rl.nodes.advantages")


def test_every_node_type_lives_in_the_module_its_prefix_names(every_node_type):
    # The registry holds every built-in type (a missing import would hide one from the rule).
    for expected in ("actor.train", "advantage.gae", "reward.srpo", "rollout.env", "data.tasks"):
        assert expected in every_node_type
    # Test modules register node types of their own (``test.*``): only the packages' count.
    shipped = {
        name: node_type.fn.__module__
        for name, node_type in every_node_type.items()
        if node_type.fn.__module__.split(".")[0] in PACKAGES
    }
    assert len(shipped) >= 25, sorted(shipped)
    misplaced = {
        name: module
        for name, module in shipped.items()
        if not _defining_module_allowed(name, module)
    }
    assert not misplaced, (
        f"node types defined outside the module their prefix names: {misplaced}; move each "
        f"<prefix>.<name> to {CORE_NODES}.<prefix> (or a package of that name)"
    )


def _python_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def _imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_imports_a_node_module_for_a_helper():
    offenders = []
    for path in _python_files():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if path.name == "__init__.py" and module.startswith(CORE_NODES):
            continue  # a node package's __init__ imports its modules to register them
        for imported in _imported_modules(ast.parse(path.read_text())):
            if imported.startswith(CORE_NODES + "."):
                offenders.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert not offenders, offenders


def _bare_register_calls(tree: ast.Module) -> list[int]:
    """Lines of module-level statements ``X.register(...)`` or ``register_node(...)(fn)``."""
    lines = []
    for node in tree.body:
        if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
            continue
        call = node.value
        target = call.func.func if isinstance(call.func, ast.Call) else call.func
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name.startswith("register"):
            lines.append(node.lineno)
    return lines


def test_components_register_with_the_decorator_form():
    calls = {}
    for path in _python_files():
        lines = _bare_register_calls(ast.parse(path.read_text()))
        if lines:
            calls[str(path.relative_to(ROOT))] = lines
    assert not calls, f"module-level register calls (use the decorator form): {calls}"
