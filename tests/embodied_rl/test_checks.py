"""The shared range check: which values pass and the exact message of those that do not; the
shared options-mapping-to-dataclass builder."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from embodied_rl.checks import check_fields, check_range, options_dataclass


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        (0, {"low": 0, "low_open": True}, "x must be > 0, got 0"),
        (-1, {"low": 0}, "x must be >= 0, got -1"),
        (0, {"low": 1}, "x must be >= 1, got 0"),
        (9, {"high": 8}, "x must be <= 8, got 9"),
        (8, {"high": 8, "high_open": True}, "x must be < 8, got 8"),
        (1.5, {"low": 0.0, "high": 1.0, "low_open": True}, "x must be in (0, 1], got 1.5"),
        (0.0, {"low": 0.0, "high": 1.0, "low_open": True}, "x must be in (0, 1], got 0.0"),
        (1.0, {"low": 0, "high": 1, "high_open": True}, "x must be in [0, 1), got 1.0"),
        (0.25, {"low": 0.5, "high": 2.5}, "x must be in [0.5, 2.5], got 0.25"),
        (math.nan, {"low": 0}, "x must be >= 0, got nan"),
    ],
)
def test_out_of_range_values_raise_one_message_shape(value, bounds, message):
    with pytest.raises(ValueError) as raised:
        check_range("x", value, **bounds)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("value", "bounds"),
    [
        (1e-9, {"low": 0, "low_open": True}),
        (0, {"low": 0}),
        (1.0, {"low": 0, "high": 1, "low_open": True}),
        (0.0, {"low": 0, "high": 1}),
        (None, {"low": 1}),  # an optional setting left unset
    ],
)
def test_values_in_range_pass(value, bounds):
    check_range("x", value, **bounds)


def test_note_and_fix_frame_the_value():
    with pytest.raises(ValueError) as raised:
        check_range("t", 0, 0, low_open=True, note=" (a note)", fix="; do this")
    assert str(raised.value) == "t must be > 0 (a note), got 0; do this"


def test_check_fields_names_the_first_bad_field():
    class Options:
        a, b, c = 1, 0, -1

    with pytest.raises(ValueError, match=r"^b must be > 0, got 0$"):
        check_fields(Options(), ("a", "b", "c"), 0, low_open=True)


def test_a_check_without_bounds_is_a_programming_error():
    with pytest.raises(TypeError):
        check_range("x", 1)


@dataclass
class _Options:
    width: int = 4
    name: str = "a"

    def __post_init__(self) -> None:
        check_range("width", self.width, 1)


def test_options_dataclass_builds_defaults_and_refuses_unknown_keys_naming_the_valid_ones():
    assert options_dataclass(_Options, None, "tiny policy") == _Options()
    assert options_dataclass(_Options, {"width": 8}, "tiny policy") == _Options(width=8)
    message = "tiny policy: unknown option(s) ['depth', 'wdth']; valid options: width, name"
    with pytest.raises(ValueError) as error:
        options_dataclass(_Options, {"wdth": 8, "depth": 2, "name": "b"}, "tiny policy")
    assert str(error.value) == message
    with pytest.raises(ValueError, match="width must be >= 1, got 0"):  # the class's own check
        options_dataclass(_Options, {"width": 0}, "tiny policy")
