"""What the LIBERO test modules share: the skip marker, the env's options, a task and moves.

LIBERO is slow on 2 CPU cores (scene builds and hard resets take seconds, a frame tens of
milliseconds; docs/benchmarks/code_figures.md),
so each module builds one module-scoped env of these options (libero_goal task 0, "open the
middle drawer of the cabinet", 64 px, ``max_steps=4``) for most of its tests, and episodes
are a handful of steps.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from simulators.libero.suites import INSTALL_HINT

HAVE_LIBERO = importlib.util.find_spec("libero") is not None
requires_libero = pytest.mark.skipif(
    not HAVE_LIBERO, reason=f"LIBERO is not installed; install it with `{INSTALL_HINT}`"
)

SIZE = 64
OPTIONS = {"suite": "libero_goal", "image_size": SIZE, "render_size": 96, "max_steps": 4}
TASK, INIT = 0, 3
# Actions that move the arm and close the gripper (a soft reset must undo both).
MOVES = np.array(
    [[0.6, -0.3, 0.4, 0.1, -0.2, 0.3, 1.0], [-0.5, 0.5, -0.2, 0.0, 0.2, -0.1, 1.0]], np.float32
)
