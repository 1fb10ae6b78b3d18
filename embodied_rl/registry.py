"""Name -> object registries that let the core find components it never imports.

``embodied_rl`` must not import ``policies``, ``simulators`` or ``rollout``
(docs/ARCHITECTURE.md, "Packages and import rules"). Those packages register their components
here when imported; the core imports
them by module name through :func:`load_plugins`, so no static import edge exists.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

PLUGIN_MODULES: tuple[str, ...] = ("policies", "rollout", "simulators")


class UnknownNameError(KeyError):
    """A registry lookup for a name that nobody registered."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it readable.
        return str(self.args[0])


class Registry:
    """A named collection of components, looked up by snake_case name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, obj: Any = None) -> Any:
        """Register ``obj`` under ``name``; usable as ``@REG.register("name")``."""
        if obj is None:
            return lambda o: self.register(name, o)
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = obj
        return obj

    def get(self, name: str) -> Any:
        if name not in self._items:
            raise UnknownNameError(self.unknown_message(name))
        return self._items[name]

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, self._items, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._items)) or 'none'}."

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)


@dataclass(frozen=True)
class Command:
    """A CLI command a plugin package adds to ``embodied-rl`` (registered in ``COMMANDS``).

    Attributes:
        help: what the command does, one sentence: its line in ``embodied-rl --help`` and
            the description in ``embodied-rl <name> --help``.
        add_arguments: adds the command's options to its (empty) argparse subparser.
        run: runs the command from the parsed arguments and returns the exit status. Bad
            input raises ``ConfigError``; an ``ImportError`` (an optional package missing)
            becomes a one-line error that says to install it.
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def register_command(
    name: str,
    *,
    help: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Decorator: register ``run(args) -> exit status`` as the CLI command ``name``."""

    def decorator(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.register(name, Command(help=help, add_arguments=add_arguments, run=run))
        return run

    return decorator


NODE_TYPES = Registry("node type")
POLICIES = Registry("policy")
# Frozen video encoders of SRPO's ``encode.video`` (``builder(options, device) -> nn.Module``
# with ``encode`` and ``embedding_dim``). A ``models.<name>.policy`` entry may name one: the
# model store builds policies and encoders alike (:func:`model_builder`).
VIDEO_ENCODERS = Registry("video encoder")
SIMULATORS = Registry("simulator")
# Text environments of multi-turn LLM rollouts (``rollout.llm_multiturn``): name -> a class
# built with the node's ``env_options`` (``embodied_rl.interfaces.TextEnvironment``).
TEXT_ENVS = Registry("text environment")
# CLI commands that a plugin package adds (e.g. ``demos`` in ``simulators``): name -> a
# :class:`Command`, which ``embodied-rl`` gives a subparser of that name and runs.
COMMANDS = Registry("command")
# The plugin packages that register commands: the CLI imports them to build its parser, on
# every call, so they must import quickly (neither imports transformers, timm or LIBERO until
# a command runs: ``policies`` adds about 0.05 s to the CLI's own imports).
COMMAND_PLUGINS: tuple[str, ...] = ("simulators", "policies")
# Writers of ``embodied-rl export`` (``embodied_rl/export/``), by policy name: ``fn(policy,
# options, folder) -> interfaces.Exported`` writes the built policy in its Hugging Face layout
# and says how it loads again.
EXPORTERS = Registry("exporter")
# The language instructions of a simulator's suite, by task index: ``fn(suite) -> list[str]``
# (``libero``). Demos that do not record their task id (LeRobot datasets, LIBERO's published
# files) are placed among a suite's tasks by their instruction.
SUITE_INSTRUCTIONS = Registry("suite instructions")

_loaded: set[str] = set()


def load_plugins(modules: Iterable[str] = PLUGIN_MODULES) -> None:
    """Import the plugin packages so they fill the registries (idempotent)."""
    for name in modules:
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)


MODEL_REGISTRIES: tuple[Registry, ...] = (POLICIES, VIDEO_ENCODERS)


def is_model_name(name: str) -> bool:
    """Whether ``models.<name>.policy: name`` names something the model store can build."""
    return any(name in registry for registry in MODEL_REGISTRIES)


def model_builder(name: str) -> Callable[..., Any]:
    """The ``builder(options, device)`` of a registered policy or video encoder.

    Raises:
        UnknownNameError: naming the close matches and every known name of both registries.
    """
    for registry in MODEL_REGISTRIES:
        if name in registry:
            return registry.get(name)
    raise UnknownNameError(unknown_model_message(name))


def unknown_model_message(name: str) -> str:
    """The error for a model name that no model registry holds (close matches, known names)."""
    known = sorted(n for registry in MODEL_REGISTRIES for n in registry.names())
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown policy {name!r}.{hint} Known: {', '.join(known) or 'none'}."
