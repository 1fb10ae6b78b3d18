"""What every policy's options dataclass does with a config mapping.

A policy's options class subclasses :class:`PolicyOptions` (a ``@dataclass``) and sets
``policy_name`` (for messages) and ``RUNTIME_OPTIONS``: the options that change how the policy
runs, not what its weights mean, so that an ``init_from`` checkpoint may differ in them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from embodied_rl.checks import options_dataclass
from embodied_rl.interfaces import ONE_CAMERA


class PolicyOptions:
    """``from_options`` and ``architecture_options`` of a policy's options dataclass."""

    policy_name: ClassVar[str] = "policy"
    RUNTIME_OPTIONS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Any:
        """Build from a mapping of field values; unknown keys are an error naming valid keys."""
        return options_dataclass(cls, options, f"{cls.policy_name} policy")

    @classmethod
    def architecture_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every option (defaults filled in) but the runtime-only ones: what must match
        between a checkpoint's training run and a run that starts from it."""
        config = cls.from_options(options)
        return {
            f.name: getattr(config, f.name)
            for f in dataclasses.fields(config)
            if f.name not in cls.RUNTIME_OPTIONS
        }

    @property
    def state_size(self) -> int:
        """Size of the proprio state the policy reads (0: none): its ``state_dim`` option,
        where it has one."""
        return int(getattr(self, "state_dim", 0))

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras the policy reads each step (``interfaces.policy_cameras``)."""
        return ONE_CAMERA

    @classmethod
    def cameras_of(cls, options: Mapping[str, Any]) -> tuple[str, ...]:
        """:attr:`cameras` of the options a config gives (checked against ``data.cameras``)."""
        return cls.from_options(options).cameras

    @classmethod
    def state_size_of(cls, options: Mapping[str, Any]) -> int:
        """:attr:`state_size` of the options a config gives (the driver's check of it against
        the simulator's state, ``validate_config``)."""
        return cls.from_options(options).state_size
