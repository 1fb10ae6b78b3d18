"""Node types: plain functions ``fn(ctx, batch) -> batch`` plus what they read and write.

A node type is registered once under a dotted name (``advantage.grpo``); DAG YAML files refer
to it by that name. The declared ``reads``/``writes`` batch keys let the validator prove,
without building any model, that every node gets the fields it needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from embodied_rl.registry import NODE_TYPES

KeysSpec = tuple[str, ...] | Callable[[Any], tuple[str, ...]]


class NodeConfigError(ValueError):
    """A node's ``config:`` block does not fit its node type."""


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
        """Turn the YAML ``config:`` mapping into the node's config dataclass."""
        raw = dict(raw or {})
        if self.config_cls is None:
            if raw:
                raise NodeConfigError(
                    f"node type {self.name!r} takes no config, got keys {sorted(raw)}; "
                    "remove the config block"
                )
            return None
        fields = {f.name for f in dataclasses.fields(self.config_cls)}
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise NodeConfigError(
                f"unknown config key(s) {unknown} for node type {self.name!r}; "
                f"valid keys: {sorted(fields)}"
            )
        try:
            return self.config_cls(**raw)
        except (TypeError, ValueError) as err:
            raise NodeConfigError(f"bad config for node type {self.name!r}: {err}") from err

    def read_keys(self, node_config: Any) -> tuple[str, ...]:
        return tuple(self.reads(node_config) if callable(self.reads) else self.reads)

    def write_keys(self, node_config: Any) -> tuple[str, ...]:
        return tuple(self.writes(node_config) if callable(self.writes) else self.writes)

    def factor(self, node_config: Any) -> int:
        return 1 if self.batch_factor is None else int(self.batch_factor(node_config))


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
