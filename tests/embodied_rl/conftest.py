"""Fixtures of the core's tests."""

from __future__ import annotations

import pytest

from tests.embodied_rl.synthetic_demos import write_synthetic_demos


@pytest.fixture
def demo_writer():
    """``write_synthetic_demos``: learnable synthetic LIBERO demo files (see its module)."""
    return write_synthetic_demos
