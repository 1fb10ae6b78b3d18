"""Demonstration steps for behaviour cloning, sharded over data-parallel ranks and resumable.

A *row* is one step ``t`` of one demo: its observation (camera image, proprio, instruction)
and the chunk of the next ``C`` env actions ``actions[t : t + C]``; near the end of an
episode the chunk is padded with the demo's last action and the padded actions are masked
out of the loss. Rows are drawn by :class:`embodied_rl.data.sampler.EpochSampler` (the same
per-epoch permutation on every rank, each rank its own slice), so a resumed run sees the
batches the interrupted one would have seen.

Every rank reads the actions and proprio of all selected demos at start-up (a few floats per
step: the statistics need them all) and the camera frames of a demo only when one of its rows
is first drawn, resized to the rollout's observation size and cached.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.data.demo_formats import load_demo, scan_demos
from embodied_rl.data.demos import ACTION_DIM, DemoInfo, dataset_statistics
from embodied_rl.data.lerobot import LeRobotFeatures
from embodied_rl.data.sampler import EpochSampler
from embodied_rl.data.tasks import is_heldout
from embodied_rl.registry import SUITE_INSTRUCTIONS, load_plugins

CAMERAS = K.CAMERAS  # a policy reads none, the first (OBS_IMAGE) alone, or both


def select_demos(
    paths: Sequence[str],
    max_demos_per_task: int | None,
    heldout_every: int,
    tasks: Sequence[int] | None = None,
    suite: str | None = None,
    lerobot: LeRobotFeatures | None = None,
) -> list[DemoInfo]:
    """Scan the demo files and keep the first ``max_demos_per_task`` demos of each task.

    Demos are taken in file order, then demo order; a task is its recorded task id, or its
    instruction in files that record none (LIBERO's published ones). ``tasks``
    (``data.tasks``: the suite indices the run trains and evaluates) keeps only the demos of
    those tasks, by the task id that ``embodied-rl demos`` records; ``None`` keeps all.
    ``suite`` (the simulator's) refuses files recorded in another suite. A path that is a
    LeRobot dataset folder is read with the ``lerobot`` feature mapping (see
    :func:`~embodied_rl.data.demo_formats.scan_demos`).

    Raises:
        DemoFormatError / FileNotFoundError: from the reader (naming file, demo and key).
        ValueError: a selected demo started from a held-out init state (see
            :func:`check_not_heldout`); ``tasks`` is set and a file does not record its task,
            or no demo is of those tasks.
    """
    infos = scan_demos(paths, lerobot)
    if suite is not None:
        check_suite(infos, suite)
    if tasks is not None:
        infos = demos_of_tasks(infos, tasks, suite)
    taken: Counter[int | str] = Counter()
    selected = []
    for info in infos:
        task = info.instruction if info.task_id is None else info.task_id
        if max_demos_per_task is None or taken[task] < max_demos_per_task:
            taken[task] += 1
            selected.append(info)
    check_not_heldout(selected, heldout_every)
    return selected


def check_suite(infos: Sequence[DemoInfo], suite: str) -> None:
    """Refuse demos recorded in another suite than the run's (their task ids and scenes mean
    other tasks); files that record no suite (LIBERO's published ones, older files) pass."""
    other = [info for info in infos if info.suite is not None and info.suite != suite]
    if other:
        files = sorted({str(info.path) for info in other})
        more = f" ({len(files) - 1} more files too)" if len(files) > 1 else ""
        raise ValueError(
            f"{files[0]} holds demos of suite {other[0].suite!r} (embodied_rl_suite){more}, "
            f"but the config asks for {suite!r} (simulator.options.suite). Fix: point "
            f"data.paths at demos of {suite} (`embodied-rl demos --suite {suite}`), or set "
            f"simulator.options.suite={other[0].suite}"
        )


def check_frame_sizes(infos: Sequence[DemoInfo]) -> None:
    """With ``image_size: null`` frames keep the files' size: refuse demos whose sizes differ
    (one batch cannot stack them)."""
    sizes: dict[tuple[int, int, int], DemoInfo] = {}
    for info in infos:
        sizes.setdefault(info.image_shape, info)  # the first demo of each size
    if len(sizes) > 1:
        (a, first), (b, second) = list(sizes.items())[:2]
        raise ValueError(
            f"{first.source} has frames of {a[0]}x{a[1]} and {second.source} of {b[0]}x{b[1]}. "
            "Fix: set data.image_size (the rollout's image size) so frames are resized"
        )


def check_frame_size(infos: Sequence[DemoInfo], image_size: int) -> None:
    """With ``data.resize_frames`` false: refuse demos whose frames are not ``image_size``
    square (a corpus built for another size; resizing would train on other pixels than the
    rollouts render)."""
    for info in infos:
        if info.image_shape[:2] != (image_size, image_size):
            height, width = info.image_shape[:2]
            raise ValueError(
                f"{info.source} has frames of {height}x{width}, the run's frames are "
                f"{image_size}x{image_size} (data.image_size) and data.resize_frames is false. "
                f"Fix: build the demos at that size (`embodied-rl demos --image-size "
                f"{image_size}`), or set data.resize_frames=true to resize them"
            )


# LIBERO's env actions: delta position and rotation scaled to [-1, 1], gripper -1 open / +1 close.
GRIPPER_VALUES = (-1.0, 1.0)
ACTION_TOLERANCE = 1e-4


def check_action_convention(infos: Sequence[DemoInfo]) -> None:
    """Refuse demos whose actions are not the env's convention (reads every demo's actions,
    no pixels): a delta pose outside [-1, 1] (absolute poses, unscaled deltas) or a gripper
    that is not -1 / +1 (e.g. OpenVLA's [0, 1] with 1 = open)."""
    for info in infos:
        actions = load_demo(info, cameras=()).actions
        pose, gripper = np.abs(actions[:, : ACTION_DIM - 1]), actions[:, ACTION_DIM - 1]
        if pose.max() > 1 + ACTION_TOLERANCE:
            raise ValueError(
                f"{info.source}: delta-pose actions reach {pose.max():.3g}, outside LIBERO's "
                "[-1, 1] (scaled delta end-effector actions): another action convention. Fix: "
                "convert the actions to scaled deltas, or regenerate the demos with "
                "`embodied-rl demos`"
            )
        off = ~np.isclose(gripper[:, None], GRIPPER_VALUES, atol=ACTION_TOLERANCE).any(axis=1)
        if off.any():
            found = sorted({round(float(v), 3) for v in gripper})[:4]
            raise ValueError(
                f"{info.source}: gripper actions take values {found}, not LIBERO's -1 (open) / "
                "+1 (close): another gripper convention. Fix: convert them (a LeRobot dataset "
                "of OpenVLA's [0, 1], 1 = open: data.lerobot.gripper=openvla), or regenerate "
                "the demos with `embodied-rl demos`"
            )


def demos_of_tasks(
    infos: Sequence[DemoInfo], tasks: Sequence[int], suite: str | None = None
) -> list[DemoInfo]:
    """The demos whose task id is in ``tasks`` (file order kept).

    A folder of a whole suite with ``data.tasks=[0]`` must train on task 0 only, as the RL
    and evaluation of the same config do. A demo's task id is the one ``embodied-rl demos``
    records; a demo that records none (a LeRobot dataset's episode, LIBERO's published files)
    is placed by its instruction among ``suite``'s tasks (an instruction of no task of the
    suite, e.g. another suite's episode in a dataset of all four, is not selected). Without a
    suite such demos cannot be placed and are refused rather than silently kept or dropped.
    """
    unplaced = [info for info in infos if info.task_id is None]
    if unplaced and suite is None:
        files = sorted({str(info.path) for info in unplaced})
        raise ValueError(
            f"data.tasks={list(tasks)} selects demos by task id, and {files[0]} does not "
            f"record one{f' ({len(files) - 1} more neither)' if len(files) > 1 else ''}. "
            "Fix: set data.suite (the simulator's) so they are placed by their instruction, "
            "or set data.tasks=null and list only those tasks' demos in data.paths"
        )
    if unplaced:
        # Case and spacing aside: datasets converted by others may lower-case or re-space.
        task_of = {_words(text): i for i, text in enumerate(suite_instructions(suite))}
        infos = [
            info
            if info.task_id is not None or _words(info.instruction) not in task_of
            else replace(info, task_id=task_of[_words(info.instruction)])
            for info in infos
        ]
    wanted = set(tasks)
    kept = [info for info in infos if info.task_id in wanted]
    if not kept:
        found = sorted({info.task_id for info in infos if info.task_id is not None})
        strays = any(info.task_id is None for info in infos)  # instructions not in the suite
        raise ValueError(
            f"no demo in data.paths is of data.tasks={list(tasks)} (the demos hold tasks "
            f"{found}{f' and instructions of no task of {suite}' if strays else ''}). Fix: "
            f"generate them with `embodied-rl demos --tasks {' '.join(map(str, tasks))}` or "
            "point data.paths at their folder"
        )
    return kept


def _words(text: str) -> str:
    return " ".join(text.lower().split())


def suite_instructions(suite: str) -> list[str]:
    """The instructions of ``suite``'s tasks, from the simulator plugin that knows the suite."""
    load_plugins()
    return SUITE_INSTRUCTIONS.get("libero")(suite)


def check_not_heldout(infos: Sequence[DemoInfo], heldout_every: int) -> None:
    """Refuse demos that started from a held-out init state (the rule of ``data/tasks.py``).

    Demos without ``embodied_rl_init_state_id`` (e.g. LIBERO's published files, recorded
    from their own start states) cannot be checked and pass.
    """
    for info in infos:
        init = info.init_state_id
        if init is not None and is_heldout(init, heldout_every):
            raise ValueError(
                f"{info.source} started from init state {init}, which is held out for "
                f"evaluation (every {heldout_every}-th: {heldout_every - 1}, "
                f"{2 * heldout_every - 1}, ...). Training on it would leak the evaluation "
                "split. Fix: record demos from training init states only, remove this demo, or "
                "set data.heldout_every to match the evaluation's split"
            )


def resize_frames(frames: np.ndarray, size: int | None) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, size, size, 3) uint8; as-is for None.

    Downscaling averages the input pixels each output pixel covers (a box filter, like a
    camera sensor integrating over a larger pixel); upscaling is bilinear.
    """
    if size is None or frames.shape[1:3] == (size, size):
        return frames
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float()
    if size <= min(frames.shape[1:3]):
        x = F.interpolate(x, size=(size, size), mode="area")
    else:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()


def check_cameras(cameras: Sequence[str]) -> None:
    """Refuse cameras a policy cannot read: none, ``[agentview]`` or ``[agentview, wrist]``."""
    if tuple(cameras) not in {CAMERAS[:n] for n in range(len(CAMERAS) + 1)}:
        raise ValueError(
            f"cameras {list(cameras)}: a policy reads none, [agentview], or [agentview, wrist] "
            "(OpenVLA-OFT with num_images_in_input: 2), in that order"
        )


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """DrQ's random shift (arXiv 2004.13649): pad by ``pad`` (edge pixels), crop back at a
    random offset per image. images: (N, H, W, 3) uint8 -> (N, H, W, 3) uint8."""
    if pad <= 0 or len(images) == 0:
        return images
    n, h, w, _ = images.shape
    padded = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    crops = [padded[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(offsets.tolist())]
    return torch.stack(crops).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class DemoLoader:
    """This rank's rows of demonstration steps, ``global_batch_size / dp_size`` per step.

    Attributes:
        infos: the selected demos; statistics: their OpenVLA-format ``norm_stats`` entry.
        sampler: the sharded, resumable row order.
    """

    def __init__(
        self,
        infos: Sequence[DemoInfo],
        *,
        chunk: int,
        cameras: Sequence[str],
        image_size: int | None,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        shuffle: bool = True,
        shift: int = 0,
    ) -> None:
        if not infos:
            raise ValueError("no demonstrations selected; check data.paths")
        check_cameras(cameras)
        self.infos, self.chunk, self.cameras = list(infos), chunk, tuple(cameras)
        self.image_size, self.shift, self.seed, self.dp_rank = image_size, shift, seed, dp_rank
        demos = [load_demo(info, cameras=()) for info in self.infos]  # no pixels yet
        self.actions = [torch.from_numpy(d.actions) for d in demos]
        self.proprio = [torch.from_numpy(d.proprio) for d in demos]
        self.statistics = dataset_statistics([d.actions for d in demos], [d.proprio for d in demos])
        lengths = [info.length for info in self.infos]
        self.row_demo = np.repeat(np.arange(len(lengths)), lengths)
        self.row_step = np.concatenate([np.arange(n) for n in lengths])
        # Demos are few: repeat rows to fill the last batch of an epoch rather than drop them.
        self.sampler = EpochSampler(
            len(self.row_demo),
            global_batch_size=global_batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=False,
            source="the demonstrations",
        )
        self._frames: dict[int, dict[str, np.ndarray]] = {}

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def dropped(self) -> dict[str, int]:
        """Rows dropped at start-up by reason: none (bad files are refused, not dropped)."""
        return {}

    def frames(self, demo: int) -> dict[str, np.ndarray]:
        """Camera -> (T, S, S, 3) uint8 frames of a demo, read and resized on first use."""
        if demo not in self._frames:
            images = load_demo(self.infos[demo], cameras=self.cameras).images
            self._frames[demo] = {
                camera: resize_frames(images[camera], self.image_size) for camera in self.cameras
            }
        return self._frames[demo]

    def action_chunk(self, demo: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``actions[step : step + C]`` (C, 7), padded with the last action, and its mask (C,)."""
        actions = self.actions[demo]
        index = torch.arange(step, step + self.chunk)
        valid = (index < len(actions)).float()
        return actions[index.clamp(max=len(actions) - 1)], valid

    def next_batch(self) -> TensorDict:
        """This rank's rows of the next step (see :meth:`rows_batch`)."""
        rows, sample_ids = self.sampler.current()
        key = f"{self.seed}/{self.sampler.epoch}/{self.sampler.step_in_epoch}/{self.dp_rank}"
        generator = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        self.sampler.advance()
        return self.rows_batch(rows, sample_ids, generator)

    def rows_batch(
        self, rows: Sequence[int], sample_ids: Sequence[int], generator: torch.Generator
    ) -> TensorDict:
        """One-step trajectories (T = 1) of the given rows.

        Returns:
            OBS_STATE (n, 1, 8), OBS_IMAGE (n, 1, S, S, 3) uint8 (with a camera; randomly
            shifted with ``shift``; OBS_WRIST_IMAGE likewise with the wrist), PROMPT_TEXT,
            ACTIONS (n, C, 7) env actions, RESPONSE_MASK (n, C * 7) (0 on padded actions),
            STEP_MASK (n, 1), SAMPLE_ID (n,), INIT_STATE_ID (n,) the demo's init state (-1:
            unknown).
        """
        demos, steps = self.row_demo[list(rows)], self.row_step[list(rows)]
        chunks = [self.action_chunk(int(d), int(t)) for d, t in zip(demos, steps)]
        n = len(rows)
        fields: dict[str, Any] = {
            K.OBS_STATE: torch.stack(
                [self.proprio[int(d)][int(t)] for d, t in zip(demos, steps)]
            ).view(n, 1, -1),
            K.PROMPT_TEXT: [self.infos[int(d)].instruction for d in demos],
            K.ACTIONS: torch.stack([c[0] for c in chunks]).float(),
            K.RESPONSE_MASK: torch.stack([c[1] for c in chunks]).repeat_interleave(ACTION_DIM, 1),
            K.STEP_MASK: torch.ones(n, 1),
            K.SAMPLE_ID: torch.as_tensor(list(sample_ids), dtype=torch.int64),
            K.INIT_STATE_ID: torch.as_tensor(
                [_init_id(self.infos[int(d)]) for d in demos], dtype=torch.int64
            ),
        }
        for camera in self.cameras:  # each camera shifted on its own draw
            images = torch.from_numpy(
                np.stack([self.frames(int(d))[camera][int(t)] for d, t in zip(demos, steps)])
            )
            shifted = random_shift(images, self.shift, generator)[:, None]
            fields[K.CAMERA_KEYS[camera]] = shifted
        return make_batch(fields)

    def state_dict(self) -> dict[str, Any]:
        sources = [info.source for info in self.infos]
        return {**self.sampler.state_dict(), "rows": len(self.row_demo), "demos": sources}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; refuses other demonstrations."""
        sources = [info.source for info in self.infos]
        if state["rows"] != len(self.row_demo) or state["demos"] != sources:
            raise ValueError(
                f"demo loader state was saved for {len(state['demos'])} demos "
                f"({state['rows']} steps), this run selects {len(sources)} ({len(self.row_demo)} "
                "steps); resume with the same data.paths and max_demos_per_task"
            )
        self.sampler.load_state_dict(state)


def _init_id(info: DemoInfo) -> int:
    return -1 if info.init_state_id is None else info.init_state_id
