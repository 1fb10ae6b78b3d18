"""Node types: plain functions ``fn(ctx, batch) -> batch`` plus what they read and write.

A node type is registered once under a dotted name (``advantage.grpo``); DAG YAML files refer
to it by that name. The declared ``reads``/``writes`` batch keys let the validator prove,
without building any model, that every node gets the fields it needs.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

from embodied_rl.registry import NODE_TYPES

KeysSpec = tuple[str, ...] | Callable[[Any], tuple[str, ...]]
DEFAULT_FIX = "correct the node's config block"


class NodeConfigError(ValueError):
    """A node's ``config:`` block does not fit its node type; ``fix`` says what to change."""

    def __init__(self, problem: str, fix: str = DEFAULT_FIX) -> None:
        super().__init__(f"{problem}. Fix: {fix}")
        self.problem, self.fix = problem, fix


def _fits(value: Any, hint: Any) -> bool:
    """Whether a YAML value (None, bool, int, float, str, list, dict) fits a type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:  # YAML writes 1.0 as 1; a NaN is never a meaningful setting
        return isinstance(value, int | float) and not isinstance(value, bool) and value == value
    if origin is Literal:
        return value in args
    if dataclasses.is_dataclass(hint):  # a nested block; its keys are checked on its own
        return isinstance(value, Mapping | hint)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(_fits, value, args))
        return not args or all(_fits(item, args[0]) for item in value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping) and (
            len(args) < 2 or all(_fits(v, args[1]) for v in value.values())
        )
    return not isinstance(hint, type) or isinstance(value, hint)


def _describe(hint: Any) -> str:
    """A type hint in the words of a config file: ``an int``, ``a list of int``, ``null``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple, Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} values ({', '.join(_describe(a) for a in args)})"
        return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}"
    if origin in (dict, Mapping):
        return "a mapping"
    names = {
        type(None): "null",
        bool: "true or false",
        int: "an int",
        float: "a number",
        str: "a string",
        Any: "any value",
    }
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _show(value: Any) -> str:
    text = repr(value)
    shown = text if len(text) <= 60 else text[:57] + "..."
    return f"{shown} ({type(value).__name__})"


def dataclass_problems(cls: type, raw: Any, where: str) -> list[tuple[str, str]]:
    """Why ``raw`` cannot build the config dataclass ``cls``, as ``(problem, fix)`` pairs.

    Checks what the dataclass itself cannot: that ``raw`` is a mapping, that every key is a
    field (with a did-you-mean for a close name), that fields without a default are given,
    and that each value fits its field's type hint (no ``"abc"`` where an int goes). Range
    checks stay in the dataclass's ``__post_init__``.

    Args:
        cls: a dataclass whose hints use None, bool, int, float, str, Any, list/tuple, dict,
            Literal and unions of them.
        raw: the YAML value given for it.
        where: the key path of the block, used in messages (``trainer``, ``config``).

    Returns:
        One ``(problem, fix)`` per problem; empty when ``cls(**raw)`` may be called.
    """
    if not isinstance(raw, Mapping):
        return [
            (f"{where} must be a mapping, got {_show(raw)}", f"write {where} as key: value lines")
        ]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    problems = []
    for key in sorted(set(raw) - set(fields), key=str):
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f" (did you mean {where}.{close[0]}?)" if close else ""
        problems.append(
            (f"unknown key {where}.{key}{hint}", f"use only the valid keys {sorted(fields)}")
        )
    for name, spec in fields.items():
        if name not in raw:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                problems.append((f"{where} lacks the required key {name!r}", f"set {where}.{name}"))
        elif dataclasses.is_dataclass(hints[name]) and isinstance(raw[name], Mapping):
            problems += dataclass_problems(hints[name], raw[name], f"{where}.{name}")
        elif not _fits(raw[name], hints[name]):
            wanted = _describe(hints[name])
            problems.append(
                (
                    f"{where}.{name} must be {wanted}, got {_show(raw[name])}",
                    f"set {where}.{name} to {wanted}",
                )
            )
    return problems


def build_dataclass(cls: type, raw: Any, where: str) -> Any:
    """``cls(**raw)`` after :func:`dataclass_problems`; every error is a NodeConfigError.

    A ``ValueError`` from ``__post_init__`` (a range check) becomes the problem's text.
    """
    problems = dataclass_problems(cls, raw, where)
    if problems:
        raise NodeConfigError(
            "; ".join(p for p, _ in problems), "; ".join(dict.fromkeys(f for _, f in problems))
        )
    hints = typing.get_type_hints(cls)
    raw = {
        key: build_dataclass(hints[key], value, f"{where}.{key}")
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, Mapping)
        else value
        for key, value in raw.items()
    }
    try:
        return cls(**raw)
    except (TypeError, ValueError) as err:  # __post_init__ checks of ranges and combinations
        raise NodeConfigError(f"{where}: {err}", f"change the value in {where}") from err


@dataclass(frozen=True)
class NodeType:
    """A registered node function and its contract.

    Attributes:
        name: registry name used in DAG YAML (``type:``).
        fn: ``fn(ctx, batch) -> batch``; ``batch`` is ``None`` for source nodes.
        reads: batch keys the node needs, or a function of the node config returning them.
        writes: batch keys the node adds, or a function of the node config returning them.
        source: the node creates a batch from nothing (e.g. the dataloader node).
        config_cls: dataclass of the node's options; ``None`` means the node takes none.
        batch_factor: samples out per sample in (``rollout.n``); a function of the node config.
        setup: ``setup(ctx)`` called once per worker before the first step (build state).
        resamples: the node may call ``ctx.resample()`` to re-run its upstream nodes for more
            data in the same step (dynamic sampling); all its ancestors must then run on a
            subset of its workers, so every worker involved takes part in each re-run.
    """

    name: str
    fn: Callable[..., Any]
    reads: KeysSpec = ()
    writes: KeysSpec = ()
    source: bool = False
    config_cls: type | None = None
    batch_factor: Callable[[Any], int] | None = None
    setup: Callable[[Any], None] | None = None
    resamples: bool = False

    def build_config(self, raw: Mapping[str, Any] | None) -> Any:
        """Turn the YAML ``config:`` mapping into the node's config dataclass.

        Raises:
            NodeConfigError: naming the key and what to change (unknown key, wrong type, or
                the message of a range check in the dataclass's ``__post_init__``).
        """
        if self.config_cls is None:
            if raw:
                raise NodeConfigError(
                    f"node type {self.name!r} takes no config, got {raw!r}",
                    "remove the config block",
                )
            return None
        return build_dataclass(self.config_cls, {} if raw is None else raw, "config")

    def read_keys(self, node_config: Any) -> tuple[str, ...]:
        return tuple(self.reads(node_config) if callable(self.reads) else self.reads)

    def write_keys(self, node_config: Any) -> tuple[str, ...]:
        return tuple(self.writes(node_config) if callable(self.writes) else self.writes)

    def factor(self, node_config: Any) -> int:
        return 1 if self.batch_factor is None else int(self.batch_factor(node_config))

    def implementation(self) -> str:
        """Where the node's code is, as ``module:function`` (and its setup's, when it has one):
        what ``embodied-rl plan`` prints, so that a reader goes from a DAG node to its code
        in one hop."""
        where = _qualified(self.fn)
        return where if self.setup is None else f"{where} (setup: {_qualified(self.setup)})"


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def register_node(
    name: str,
    *,
    reads: KeysSpec = (),
    writes: KeysSpec = (),
    source: bool = False,
    config: type | None = None,
    batch_factor: Callable[[Any], int] | None = None,
    setup: Callable[[Any], None] | None = None,
    resamples: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn(ctx, batch) -> batch`` as node type ``name``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        NODE_TYPES.register(
            name,
            NodeType(name, fn, reads, writes, source, config, batch_factor, setup, resamples),
        )
        return fn

    return wrap
