"""Keys of the node-fed sections (``data``, ``rollout``, ...) that no node would ever read.

Nodes get their config through interpolation (``config: ${rollout}``), so a key of such a
section that no ``${...}`` reference reaches is silently ignored: a typo there is an error,
a valid option this DAG does not use only a warning.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.config_sections import NODE_FED_SECTIONS

_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")  # ${a.b.c}; resolvers (${x:..}) excluded
# ${oc.select:a.b.c,default} reads a key too (the default when the key is absent)
_SELECT = re.compile(r"\$\{oc\.select:\s*([A-Za-z_][\w.]*)\s*[,}]")


def _references(node: Any) -> Iterator[str]:
    """Every key path an unresolved config refers to: ``${a.b}`` and ``${oc.select:a.b,...}``."""
    if isinstance(node, str):
        yield from _REFERENCE.findall(node)
        yield from _SELECT.findall(node)
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _references(value)


def _unreferenced(value: Any, path: str, refs: set[str]) -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of keys under ``path`` that no reference reaches (itself, a parent
    or a child)."""
    parts = path.split(".")
    if any(".".join(parts[:i]) in refs for i in range(1, len(parts) + 1)):
        return  # this key or a parent is passed on whole
    if not any(r.startswith(path + ".") for r in refs):
        yield path, value
    elif isinstance(value, Mapping):
        for key, child in value.items():
            yield from _unreferenced(child, f"{path}.{key}", refs)


def _node_option_names() -> set[str]:
    """Every key that some registered node type's config accepts."""
    names: set[str] = set()
    for type_name in NODE_TYPES.names():
        config_cls = NODE_TYPES.get(type_name).config_cls
        names |= {f.name for f in fields(config_cls)} if config_cls is not None else set()
    return names


def _unknown_leaf(path: str, value: Any, options: set[str]) -> str | None:
    """The first key under ``path`` that no node type accepts, or ``None``."""
    if isinstance(value, Mapping) and value:
        for key, child in value.items():
            found = _unknown_leaf(f"{path}.{key}", child, options)
            if found is not None:
                return found
        return None
    return None if path.rsplit(".", 1)[-1] in options else path


def _missing_pass_hint(unknown: str, options: set[str]) -> str:
    """A hint when a parent of ``unknown`` is what a node option passes on whole.

    ``simulator.options.render_size`` is unreferenced when a node lost its
    ``simulator_options: ${simulator.options}`` line; the option named after the parent
    (``simulator_options``) says where the reference belongs.
    """
    parts = unknown.split(".")[:-1]
    for end in range(len(parts), 0, -1):
        option = "_".join(parts[:end])
        if option in options:
            parent = ".".join(parts[:end])
            return (
                f" (the node option {option!r} takes ${{{parent}}}: is it missing from a "
                "node's config?)"
            )
    return ""


def check_unused(unresolved: Mapping[Any, Any]) -> list[str]:
    """Keys of the node-fed sections that no interpolation passes to a node.

    Such a key never reaches a node. When it is no option of any node type (a typo such as
    ``data.batch_sise``) it is an error; a valid option that this DAG does not use (e.g. a
    section inherited from a parent config whose DAG differs) is returned for a warning.

    Raises:
        ConfigError: naming the unknown key, with a did-you-mean where one is close.
    """
    refs = set(_references(unresolved))
    options = _node_option_names()
    unused = []
    for name in (n for n in NODE_FED_SECTIONS if n in unresolved):
        for path, value in _unreferenced(unresolved[name], name, refs):
            unknown = _unknown_leaf(path, value, options)
            if unknown is None:
                unused.append(path)
                continue
            parent, leaf = unknown.rsplit(".", 1) if "." in unknown else ("", unknown)
            siblings = unresolved.get(name) if parent == name else None
            candidates = sorted((options | set(map(str, siblings or ()))) - {leaf})
            close = difflib.get_close_matches(leaf, candidates, n=1)
            # A parent that a node option passes on whole explains the key better than a
            # near-miss name: the key only looks unknown because that reference is gone.
            hint = _missing_pass_hint(unknown, options)
            hint = hint or (f" (did you mean {parent}.{close[0]}?)" if close and parent else "")
            raise ConfigError(
                f"unknown config key {unknown}: no node type has an option {leaf!r} and no "
                f"node's config refers to {unknown}{hint}",
                f"remove {unknown} or correct its name",
            )
    return unused
