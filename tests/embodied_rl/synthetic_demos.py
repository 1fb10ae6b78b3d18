"""Synthetic LIBERO demonstration files, written with the real writer, for the SFT tests.

Imported by tests (``from tests.embodied_rl.synthetic_demos import ...``, also in spawned
processes) and offered as the ``demo_writer`` fixture by ``conftest.py``.

The demonstrated actions are a function of what the policy observes, so behaviour cloning can
fit them: step ``t`` of an episode of length ``T`` has proprio whose first value is ``t / T``
and a camera frame whose brightness is ``t / T`` (a task-coloured channel tells tasks apart),
and its action is ``0.3 sin(2 pi t / T + j + task)`` on dimension ``j < 6`` with the gripper
closing (+1) in the second half. Demo ``d`` starts from training init state ``TRAIN_INITS[d]``.
"""

from __future__ import annotations

import atexit
import functools
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np

from embodied_rl.data.demo_writer import DemoEpisode, write_demo_file

TRAIN_INITS = (0, 1, 2, 3, 5, 6, 7, 8)  # none is held out with heldout_every = 5
INSTRUCTIONS = ("put the bowl on the plate", "open the top drawer")


def synthetic_episode(task: int, demo: int, length: int, size: int) -> DemoEpisode:
    t = np.arange(length)
    phase = 2 * math.pi * t / length
    actions = np.stack([0.3 * np.sin(phase + j + task) for j in range(6)], axis=1)
    gripper = np.where(t >= length // 2, 1.0, -1.0)[:, None]
    frames = np.zeros((length, size, size, 3), np.uint8)
    frames[..., 0] = (255 * t / length).astype(np.uint8)[:, None, None]
    frames[..., 1 + task % 2] = 200
    rng = np.random.default_rng(100 * task + demo)
    ee = np.concatenate([(t / length)[:, None], rng.normal(0, 0.01, (length, 5))], axis=1)
    return DemoEpisode(
        actions=np.concatenate([actions, gripper], axis=1),
        agentview_rgb=frames,
        eye_in_hand_rgb=255 - frames,  # another image than agentview's, as the wrist camera gives
        ee_states=ee,
        gripper_states=np.where(gripper > 0, 0.01, 0.04).repeat(2, axis=1),
        joint_states=rng.normal(size=(length, 7)),
        attrs={"embodied_rl_init_state_id": TRAIN_INITS[demo]},
    )


def write_synthetic_demos(
    folder: Path,
    tasks: int = 2,
    demos: int = 2,
    length: int = 12,
    size: int = 16,
    init_states: tuple[int, ...] = TRAIN_INITS,
    suite: str = "libero_spatial",
) -> Path:
    """One file per task (``task_<i>_demo.hdf5``) in ``folder``; returns the folder.

    ``suite`` is recorded as the files' ``embodied_rl_suite``: the suite of sft_libero, the
    config these demos stand in for (a run refuses demos of another suite).
    """
    for task in range(tasks):
        episodes = [synthetic_episode(task, d, length, size) for d in range(demos)]
        for d, episode in enumerate(episodes):
            episode.attrs["embodied_rl_init_state_id"] = init_states[d]
        write_demo_file(
            folder / f"task_{task}_demo.hdf5",
            episodes,
            problem_info={
                "problem_name": f"task_{task}",
                "domain_name": "synthetic",
                "language_instruction": INSTRUCTIONS[task % len(INSTRUCTIONS)],
            },
            bddl_file_name=f"task_{task}.bddl",
            bddl_file_content="(define (problem synthetic))",
            env_name="Libero_Tabletop_Manipulation",
            env_args={"type": 1},
            attrs={"embodied_rl_suite": suite, "embodied_rl_task_id": task},
        )
    return folder


@functools.cache
def input_overrides(name: str) -> tuple[str, ...]:
    """Overrides that give a shipped config the input files validation opens: for
    sft_libero, whose ``demos/libero_spatial`` the user generates, pretrain_libero90 (the
    LIBERO-90 corpus) and pretrain_vjepa_libero (demos are videos of successes to it), a
    folder of synthetic demo files of the config's suite (written once per process and
    config, removed at exit)."""
    made = {  # suite, frame size (pretrain_libero90 refuses frames it would have to resize)
        "sft_libero": ("libero_spatial", 16),
        "pretrain_vjepa_libero": ("libero_spatial", 16),
        "pretrain_libero90": ("libero_90", 64),
    }
    if name not in made:
        return ()
    suite, size = made[name]
    folder = Path(tempfile.mkdtemp(prefix="synthetic_demos_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return (f"data.paths=['{write_synthetic_demos(folder, size=size, suite=suite)}']",)
