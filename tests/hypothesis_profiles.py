"""Hypothesis profiles of the test suite, registered by tests/conftest.py before any test
module is imported.

- ``ci`` (the default): derandomized, so every run of the default tier draws the same
  examples: a CI result is reproducible, and a change cannot fail on a draw nobody else sees.
  Searching for new bugs with fresh random draws is the ``full`` profile's job.
- ``full``: fresh random draws and ten times the examples of each test, chosen with
  hypothesis' own option: ``python -m pytest --hypothesis-profile=full tests/embodied_rl``.

A test states the examples it needs at the ``ci`` strength with :func:`examples`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 100  # hypothesis' default max_examples: the unit of examples()
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, max_examples=CI_EXAMPLES, **COMMON)
settings.register_profile("full", derandomize=False, max_examples=10 * CI_EXAMPLES, **COMMON)
settings.load_profile("ci")  # hypothesis' pytest plugin loads --hypothesis-profile after this


def examples(ci_examples: int) -> int:
    """``max_examples`` for a test that draws ``ci_examples`` at the ``ci`` strength, scaled
    by the loaded profile. Call it at import time of a test module: the plugin has loaded the
    profile by then (collection follows ``pytest_configure``)."""
    return ci_examples * settings.default.max_examples // CI_EXAMPLES
