"""Range checks with one message shape, for config ``__post_init__`` and function arguments,
and :func:`options_dataclass`: an options mapping into its dataclass, unknown keys refused.

``check_range("top_p", 1.5, low=0, high=1, low_open=True)`` raises
``ValueError("top_p must be in (0, 1], got 1.5")``; a bound alone reads ``> 0``, ``>= 1`` or
``<= 65536``. The node and section validators add where the value came from (e.g.
``node 'rollout': config: n must be >= 1, got 0. Fix: ...``), so the name here is the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

OptionsT = TypeVar("OptionsT")


def _number(bound: float) -> str:
    """``1`` for 1 and 1.0 (the messages read ``(0, 1]``), else the value as written."""
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The allowed range in words: ``> 0``, ``<= 8``, ``in [0, 1)``."""
    if high is None:
        return f"{'>' if low_open else '>='} {_number(low)}"
    if low is None:
        return f"{'<' if high_open else '<='} {_number(high)}"
    opening, closing = "(" if low_open else "[", ")" if high_open else "]"
    return f"in {opening}{_number(low)}, {_number(high)}{closing}"


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    note: str = "",
    fix: str = "",
) -> None:
    """Raise unless ``low <= value <= high`` (``<`` on a side marked open).

    ``None`` passes: an optional setting left unset (its type is checked elsewhere). NaN
    fails: it is in no range.

    Args:
        name: the key as the user writes it (``temperature``, ``optimizer.lr``).
        value: the number to check.
        low, high: the bounds; ``None`` leaves that side unbounded.
        low_open, high_open: exclude that bound (``> 0`` rather than ``>= 0``).
        note: words after the range, e.g. ``" (0 = no warmup)"``.
        fix: words after the value, e.g. ``"; set do_sample: false for greedy decoding"``.

    Raises:
        ValueError: ``"<name> must be <range><note>, got <value><fix>"``.
    """
    if low is None and high is None:
        raise TypeError("check_range needs a low or a high bound")
    if value is None:
        return
    # Written as "inside" tests so that NaN, for which every comparison is false, fails.
    above_low = low is None or (value > low if low_open else value >= low)
    below_high = high is None or (value < high if high_open else value <= high)
    if not (above_low and below_high):
        bounds = _bounds(low, high, low_open, high_open)
        raise ValueError(f"{name} must be {bounds}{note}, got {value}{fix}")


def check_fields(owner: Any, names: tuple[str, ...], *args: Any, **kwargs: Any) -> None:
    """:func:`check_range` on each named attribute of ``owner`` (a config dataclass), e.g.
    ``check_fields(self, ("lr", "eps"), 0, low_open=True)``; the bounds as in check_range."""
    for name in names:
        check_range(name, getattr(owner, name), *args, **kwargs)


def options_dataclass(
    cls: type[OptionsT], options: Mapping[str, Any] | None, owner: str
) -> OptionsT:
    """``cls(**options)`` for an options dataclass, refusing keys it has no field for.

    ``owner`` names whose options they are, e.g. ``"simulator 'libero'"``, ``"mlp policy"``,
    ``"data.lerobot"``; ``None`` options are the defaults.

    Raises:
        ValueError: ``"<owner>: unknown option(s) ['x']; valid options: a, b"`` (then any
            error of ``cls``'s own checks).
    """
    options = dict(options or {})
    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"{owner}: unknown option(s) {unknown}; valid options: {', '.join(valid)}")
    return cls(**options)
