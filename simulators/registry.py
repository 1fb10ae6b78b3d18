"""Simulator registration: the ``SIMULATORS`` entry that builds a vector env here or in a pool.

A simulator registers its builder ``builder(options: Mapping, num_envs: int) -> VectorEnv``
(:class:`simulators.base.VectorEnv`) with ``@register_simulator(name, config=ConfigDataclass)``.
``SIMULATORS.get(name)`` is then a :class:`Simulator`, called as ``(options, num_envs,
processes=0, **worker_options)``: the process pool (:class:`~simulators.workers.ProcessVectorEnv`)
is an option of every simulator, not a simulator of its own.
:func:`config_from_options` turns the options mapping into the simulator's config dataclass
with an error that lists the valid options. Config validation uses the entry without building
an env: :meth:`Simulator.check_options` builds the config dataclass (its range checks run), and
:meth:`Simulator.limits` asks it how many tasks and init states per task the simulator has.

This module sits above both the interface (:mod:`simulators.base`) and the pool
(:mod:`simulators.workers`), which know nothing of registration, so neither imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from embodied_rl.checks import options_dataclass
from embodied_rl.registry import SIMULATORS
from simulators.base import VectorEnv
from simulators.workers import ProcessVectorEnv

ConfigT = TypeVar("ConfigT")

Builder = Callable[[Mapping[str, Any] | None, int], VectorEnv]


class Simulator:
    """A registered simulator: its vector env, built in this process or in a process pool.

    Args:
        name: the registered name (the process pool's children look it up again).
        build: ``build(options, num_envs) -> VectorEnv``, the in-process builder.
        config_cls: the dataclass of the simulator's options (``None``: options are checked
            only when an env is built). Its optional ``limits()`` method returns
            ``{"num_tasks": n, "num_init_states": m, "max_render_size": s, "state_dim": d}``
            (any may be missing when unknown without building an env, or unlimited).
    """

    def __init__(self, name: str, build: Builder, config_cls: type | None = None) -> None:
        self.name = name
        self.build = build
        self.config_cls = config_cls

    def check_options(self, options: Mapping[str, Any] | None) -> Any:
        """The options as the simulator's config dataclass, without building an env.

        Raises:
            ValueError: an unknown option (listing the valid ones) or a value out of range.
        """
        if self.config_cls is None:
            return None
        return config_from_options(self.config_cls, options, self.name)

    def limits(self, options: Mapping[str, Any] | None) -> dict[str, int]:
        """``num_tasks`` / ``num_init_states`` (per task) / ``max_render_size`` (the largest
        ``render(size)``) of the simulator with ``options``, as far as they are known without
        building an env (cheap: no scene, no GL context)."""
        describe = getattr(self.check_options(options), "limits", None)
        return {} if describe is None else dict(describe())

    def pretraining_suite(self, options: Mapping[str, Any] | None) -> str | None:
        """The suite ``options`` name when the simulator marks it a pretraining corpus only
        (LIBERO-90: never an evaluation suite of policies trained on other suites)."""
        return getattr(self.check_options(options), "pretraining_suite", None)

    def __call__(
        self,
        options: Mapping[str, Any] | None,
        num_envs: int,
        processes: int | None = 0,
        **worker_options: Any,
    ) -> VectorEnv:
        """Build ``num_envs`` envs of this simulator.

        Args:
            options: the simulator's options (plain values: a pool pickles them).
            num_envs: ``N``.
            processes: 0 or None = in this process (the builder's own vector env);
                ``P >= 1`` = a :class:`~simulators.workers.ProcessVectorEnv` of ``P``
                processes, each building its envs through this same entry with 0.
            **worker_options: timeouts and ``max_restarts`` of the process pool.
        """
        if not processes:
            if worker_options:
                raise ValueError(
                    f"worker options {sorted(worker_options)} need processes >= 1 (got {processes})"
                )
            return self.build(options, num_envs)
        return ProcessVectorEnv(self.name, options, num_envs, processes, **worker_options)

    def __repr__(self) -> str:
        return f"Simulator({self.name!r}, {self.build.__module__}.{self.build.__qualname__})"


def register_simulator(name: str, config: type | None = None) -> Callable[[Builder], Builder]:
    """Decorator: register ``build`` as the simulator ``name`` (``SIMULATORS``), with the
    dataclass of its options (``config``) so that validation can check them without an env.

    The builder itself is returned unchanged, so it stays callable as
    ``build(options, num_envs)``.
    """

    def decorator(build: Builder) -> Builder:
        SIMULATORS.register(name, Simulator(name, build, config))
        return build

    return decorator


def config_from_options(
    config_cls: type[ConfigT], options: Mapping[str, Any] | None, simulator: str
) -> ConfigT:
    """Build a simulator's config dataclass from its options mapping.

    Raises:
        ValueError: naming the unknown options and listing the valid ones.
    """
    return options_dataclass(config_cls, options, f"simulator {simulator!r}")
