"""Env rollout node: policy x vector env -> fixed-shape trajectories, G per (task, init state).

The policy is used through ``embodied_rl.interfaces.EmbodiedPolicy`` (``act``), the vector env
through the simulators' registry: nothing here imports ``policies`` or ``simulators``.

Shapes: ``N`` episodes (input rows x ``group_size``), ``T`` policy steps (``max_steps``;
a policy step executes a chunk of ``C`` env actions, sent to the env as one
``step_chunk``, so a simulator that renders draws one observation per policy step, not
``C``), ``K`` action tokens per policy step.
A step is valid (``STEP_MASK`` 1) when the episode had not ended before it; the trainer's
``RESPONSE_MASK``/``OLD_LOGPROBS`` are these flattened to ``(N, T*K)`` step-major.

Besides the rollout metrics, each call logs where its wall time went, in seconds, max over
ranks like the executor's ``time/<node id>`` for the whole call: ``time/<node id>/simulate``
(``env.reset``, ``env.step_chunk`` and ``env.render``), of which ``time/<node id>/reset`` in
``env.reset``, and ``time/<node id>/policy`` (``policy.act``); the rest of the call is
bookkeeping (copies, assembly).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, make_batch, repeat_interleave
from embodied_rl.interfaces import policy_cameras, stack_cameras
from embodied_rl.registry import SIMULATORS
from embodied_rl.runtime.context import simulating
from embodied_rl.runtime.fsdp import gathered_for_inference

ENV_STATE = "vector_env"


@dataclass
class EnvRolloutConfig:
    """Options of ``rollout.env``.

    Attributes:
        model: the policy in ``ctx.models``.
        simulator: registered simulator name (e.g. ``reach``, ``libero``).
        simulator_options: options of that simulator.
        group_size: G rollouts per (task, init state): the GRPO/SRPO group.
        num_envs: environments stepped together on this worker; episodes run in waves.
        processes: 0 runs the envs in this process; > 0 in that many simulator processes.
        max_steps: policy steps per episode (``None``: the simulator's limit / chunk).
        temperature / do_sample: sampling of the policy's actions.
        keep_frames: store FRAMES (B, T', H, W, 3) for the SRPO video encoder: the
            observation images when the env returns them, else ``render()`` frames.
        frame_stride: keep the frame of every ``frame_stride``-th policy step, 0, k, 2k...
            (``T' = ceil(T / stride)``; FRAME_COUNT holds each episode's valid frames);
            rendered frames are only rendered at those steps.
        keep_actions: store ENV_ACTIONS (B, T, C, A), the actions the env got, so that
            ``rollout.videos`` can replay an episode step by step for its video.
    """

    model: str = "actor"
    simulator: str = "reach"
    simulator_options: dict[str, Any] = field(default_factory=dict)
    group_size: int = 4
    num_envs: int = 8
    processes: int = 0
    max_steps: int | None = None
    temperature: float = 1.0
    do_sample: bool = True
    keep_frames: bool = True
    frame_stride: int = 1
    keep_actions: bool = False

    def __post_init__(self) -> None:
        check_fields(self, ("group_size", "num_envs", "frame_stride"), 1)
        check_range("processes", self.processes, 0)
        check_range("temperature", self.temperature, 0, low_open=True)
        # 0 would read as "no limit" (``max_steps or the simulator's``): refuse it.
        check_range("max_steps", self.max_steps, 1, note=" or null (the simulator's limit)")
        if self.simulator not in SIMULATORS:
            raise ValueError(SIMULATORS.unknown_message(self.simulator))
        try:  # the simulator's own range checks, here at validation, without an env
            SIMULATORS.get(self.simulator).check_options(self.simulator_options)
        except ValueError as err:
            raise ValueError(f"simulator_options: {err}") from None

    def simulator_cameras(self) -> tuple[str, ...] | None:
        """The cameras the simulator's options name (LIBERO's ``cameras``); ``None`` when they
        name none (the simulator's default)."""
        cameras = self.simulator_options.get("cameras")
        return None if cameras is None else tuple(cameras)

    def simulator_suite(self) -> str | None:
        """The suite the simulator's options name (LIBERO's ``suite``), if any."""
        suite = self.simulator_options.get("suite")
        return None if suite is None else str(suite)

    def pretraining_suite(self) -> str | None:
        """The suite when the simulator marks it a pretraining corpus only (LIBERO-90)."""
        return SIMULATORS.get(self.simulator).pretraining_suite(self.simulator_options)

    def simulator_state_dim(self) -> int | None:
        """Size of the simulator's proprio state (``Obs.state``), if known without an env."""
        return SIMULATORS.get(self.simulator).limits(self.simulator_options).get("state_dim")

    def ids_accepted(self) -> dict[str, tuple[int, str]]:
        """Batch key -> (exclusive bound of the ids the simulator accepts, who says so), for
        the check of the ids the data node draws (``validate_config``); no env is built."""
        limits = SIMULATORS.get(self.simulator).limits(self.simulator_options)
        who = f"simulator {self.simulator!r}"
        if "suite" in self.simulator_options:
            who += f" (suite {self.simulator_options['suite']})"
        keys = {"num_tasks": K.TASK_ID, "num_init_states": K.INIT_STATE_ID}
        return {keys[name]: (bound, who) for name, bound in limits.items() if name in keys}


ROLLOUT_WRITES = (
    K.PROMPT_TEXT, K.GROUP_ID, K.SAMPLE_ID, K.OBS_STATE, K.OBS_IMAGE, K.OBS_WRIST_IMAGE,
    K.ACTION_TOKENS,
    K.RAW_ACTIONS, K.OLD_LOGPROBS, K.RESPONSE_MASK, K.STEP_MASK, K.FINISH_STEP, K.SUCCESS,
    K.PRIVILEGED_PROGRESS,
)  # fmt: skip


def build_env(cfg: Any) -> Any:
    """The vector env of this worker, through the simulators' registry: in this process
    (``processes`` 0) or in ``processes`` simulator processes."""
    simulator = SIMULATORS.get(cfg.simulator)
    return simulator(dict(cfg.simulator_options), cfg.num_envs, processes=cfg.processes)


def setup_env(ctx: Any) -> None:
    """Build this worker's vector env, or take the one a node of another DAG built with the
    same simulator, options, env count and processes (the training and the evaluation
    rollout share one, and ``rollout.videos`` replays on it: a LIBERO env's scenes and renderer
    are large). ``ctx.node_config`` has the fields of :func:`build_env`."""
    cfg = ctx.node_config
    options = json.dumps(dict(cfg.simulator_options), sort_keys=True, default=str)
    key = f"{ENV_STATE}/{cfg.simulator}/{options}/{cfg.num_envs}/{cfg.processes}"
    if key not in ctx.shared:
        ctx.shared[key] = build_env(cfg)
    ctx.state[ENV_STATE] = ctx.shared[key]


def _rollout_writes(cfg: EnvRolloutConfig) -> tuple[str, ...]:
    frames = (K.FRAMES, K.FRAME_COUNT) if cfg.keep_frames else ()
    return ROLLOUT_WRITES + frames + ((K.ENV_ACTIONS,) if cfg.keep_actions else ())


@register_node(
    "rollout.env",
    reads=(K.TASK_ID, K.INIT_STATE_ID, K.SAMPLE_ID),
    writes=_rollout_writes,
    config=EnvRolloutConfig,
    batch_factor=lambda c: c.group_size,
    setup=setup_env,
)
def env_rollout(ctx: Any, batch: TensorDict) -> TensorDict:
    """Run G episodes per input row and return them as one trajectory batch."""
    cfg: EnvRolloutConfig = ctx.node_config
    env, policy = ctx.state[ENV_STATE], ctx.models[cfg.model]
    rows = repeat_interleave(batch, cfg.group_size)
    n = batch_len(rows)
    g = torch.arange(cfg.group_size).repeat(batch_len(batch))
    rows[K.GROUP_ID] = rows[K.SAMPLE_ID].clone()
    rows[K.SAMPLE_ID] = rows[K.SAMPLE_ID] * cfg.group_size + g
    started = time.perf_counter()
    phases = {"reset": 0.0, "step": 0.0, "policy": 0.0}  # wall seconds, summed over waves
    # A sharded (FSDP) policy is gathered once, so the ranks' episodes may end at different
    # steps (and ranks may run different numbers of waves) without unmatched collectives.
    with torch.random.fork_rng(devices=[]), gathered_for_inference(policy):
        torch.manual_seed(ctx.seed("act"))  # reproducible sampling, also after resume
        waves = [
            _run_wave(env, policy, rows[i : i + cfg.num_envs], cfg, phases, ctx.shared)
            for i in range(0, n, cfg.num_envs)
        ]
    out = _assemble(rows, waves, cfg)
    _log_metrics(ctx, out, time.perf_counter() - started)
    _log_phases(ctx, phases)
    _log_simulator_faults(ctx, env)
    return out


@contextmanager
def _timed(phases: dict[str, float], phase: str) -> Iterator[None]:
    """Add the wall seconds of the ``with`` block to ``phases[phase]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[phase] += time.perf_counter() - started


def _run_wave(
    env: Any,
    policy: Any,
    rows: TensorDict,
    cfg: EnvRolloutConfig,
    phases: dict[str, float],
    shared: dict[str, Any],
) -> dict[str, Any]:
    """Roll out up to ``num_envs`` episodes together; the envs beyond them are left out of
    the reset (``active``), so a short wave (an evaluation's last) simulates only its own.

    Adds the seconds spent in ``env.reset``, in ``env.step_chunk``/``env.render`` and in
    ``policy.act`` to ``phases["reset"]``, ``["step"]`` and ``["policy"]``. The reset and
    every env step run inside the worker's ``simulating`` (``shared``): a stopping run closes
    the simulators only between two steps, and the wave then stops (``RunStopped``).
    """
    tasks, inits = rows[K.TASK_ID], rows[K.INIT_STATE_ID]
    count = len(tasks)
    pad = env.num_envs - count
    task_ids = tasks.tolist() + [tasks[0].item()] * pad  # spare envs: valid ids, left out
    init_ids = inits.tolist() + [inits[0].item()] * pad
    active = np.arange(env.num_envs) < count
    with simulating(shared, "a rollout's reset"), _timed(phases, "reset"):
        obs = env.reset(task_ids, init_ids, active)
    descriptions = list(env.task_descriptions)[:count]
    horizon = cfg.max_steps or env.spec.max_steps
    keys = ("state", "image", "wrist", "tokens", "raw", "logprobs", "alive", "frames", "actions")
    record: dict[str, list[Any]] = {key: [] for key in keys}
    cameras = policy_cameras(policy)
    render = cfg.keep_frames and obs.image is None  # frames from render(), every k-th step
    done = np.zeros(env.num_envs, dtype=bool)
    success = np.zeros(env.num_envs, dtype=bool)
    for t in range(horizon):
        if render and t % cfg.frame_stride == 0:
            with simulating(shared, "a rollout"), _timed(phases, "step"):
                frames = env.render(envs=range(count))
            record["frames"].append(frames)
        record["alive"].append(~done[:count])
        record["state"].append(obs.state[:count].copy())
        views = camera_images(obs, cameras)
        record["image"].append(None if obs.image is None else obs.image[:count].copy())
        record["wrist"].append(views["wrist"][:count].copy() if "wrist" in views else None)
        with _timed(phases, "policy"):
            act = policy.act(
                stack_cameras([views[c] for c in cameras], axis=1) if views else None,
                descriptions + [""] * pad,
                obs.state,
                temperature=cfg.temperature,
                do_sample=cfg.do_sample,
            )
        record["tokens"].append(None if act.tokens is None else act.tokens[:count])
        record["raw"].append(None if act.raw_actions is None else act.raw_actions[:count])
        record["logprobs"].append(act.logprobs[:count])
        if cfg.keep_actions:  # as sent: a replay must give the env the very same numbers
            record["actions"].append(np.array(act.actions[:count]))
        with simulating(shared, "a rollout"), _timed(phases, "step"):
            result = env.step_chunk(act.actions)  # (num_envs, C, A): C env steps
            obs, done, success = result.obs, done | result.done, success | result.success
        if done[:count].all():
            break
    record["success"] = success[:count]
    record["progress"] = _final_progress(env, count)
    record["descriptions"] = descriptions
    return record


OBS_FIELDS = {"agentview": "image", "wrist": "wrist_image"}  # camera -> observation field


def camera_images(obs: Any, cameras: tuple[str, ...]) -> dict[str, np.ndarray]:
    """(num_envs, H, W, 3) uint8 of each camera the policy reads, from an observation; empty
    for a policy that reads state only on a simulator without images.

    Raises:
        ValueError: the simulator gives one of the images but not another the policy reads.
    """
    views = {c: getattr(obs, OBS_FIELDS[c], None) for c in cameras}
    missing = [c for c, image in views.items() if image is None]
    if len(missing) == len(views):
        return {}
    if missing:
        raise ValueError(
            f"the policy reads the cameras {list(cameras)}, but the simulator gives no "
            f"{missing} image: set simulator.options.cameras={list(cameras)} (LIBERO renders "
            "the wrist camera)"
        )
    return views


def _final_progress(env: Any, count: int) -> np.ndarray:
    """``(count,)`` float32 privileged progress of the wave's episodes at their end (a done env
    keeps its final state, so one read after the loop serves every episode); NaN when the
    simulator has no privileged progress."""
    progress = env.privileged_progress()
    if progress is None:
        return np.full(count, np.nan, dtype=np.float32)
    return np.asarray(progress[:count], dtype=np.float32)


def _stack(steps: list[Any], horizon: int) -> torch.Tensor | None:
    """(n, T, ...) from per-step arrays, zero-padded to ``horizon`` steps."""
    if steps[0] is None:
        return None
    data = torch.stack([torch.as_tensor(np.asarray(s)) for s in steps], dim=1)
    missing = horizon - data.shape[1]
    if missing:
        data = torch.cat([data, data.new_zeros(data.shape[0], missing, *data.shape[2:])], dim=1)
    return data


def _assemble(rows: TensorDict, waves: list[dict[str, Any]], cfg: EnvRolloutConfig) -> TensorDict:
    """One (N, T, ...) trajectory batch from the waves (each padded to the longest wave)."""
    horizon = max(len(w["alive"]) for w in waves)
    cat = lambda key: torch.cat([_stack(w[key], horizon) for w in waves])  # noqa: E731
    step_mask = cat("alive").float()
    logprobs = cat("logprobs").float()
    k = logprobs.shape[-1]
    fields: dict[str, Any] = {
        K.PROMPT_TEXT: [d for w in waves for d in w["descriptions"]],
        K.OBS_STATE: cat("state").float(),
        K.STEP_MASK: step_mask,
        K.OLD_LOGPROBS: (logprobs * step_mask[..., None]).reshape(len(step_mask), -1),
        K.RESPONSE_MASK: step_mask.repeat_interleave(k, dim=1),
        K.FINISH_STEP: (step_mask.sum(1) - 1).clamp(min=0).long(),
        K.SUCCESS: torch.as_tensor(np.concatenate([w["success"] for w in waves])),
        K.PRIVILEGED_PROGRESS: torch.as_tensor(np.concatenate([w["progress"] for w in waves])),
    }
    if waves[0]["image"][0] is not None:
        fields[K.OBS_IMAGE] = cat("image")
    if waves[0]["wrist"][0] is not None:
        fields[K.OBS_WRIST_IMAGE] = cat("wrist")
    if cfg.keep_frames:  # the frames of steps 0, stride, 2 * stride, ...
        stride = cfg.frame_stride
        if K.OBS_IMAGE in fields:  # stride 1: the same tensor, no copy
            frames = fields[K.OBS_IMAGE]
            fields[K.FRAMES] = frames if stride == 1 else frames[:, ::stride].contiguous()
        else:  # rendered at those steps only
            width = -(-horizon // stride)
            fields[K.FRAMES] = torch.cat([_stack(w["frames"], width) for w in waves])
        # Frame j shows step j*stride: the valid ones are those taken at or before FINISH_STEP.
        fields[K.FRAME_COUNT] = fields[K.FINISH_STEP] // stride + 1
    if waves[0]["tokens"][0] is not None:
        fields[K.ACTION_TOKENS] = cat("tokens").long()
    if waves[0]["raw"][0] is not None:
        fields[K.RAW_ACTIONS] = cat("raw").float()
    if cfg.keep_actions:  # zero after each episode's last step, in the policy's dtype
        fields[K.ENV_ACTIONS] = cat("actions")
    out = make_batch(fields)
    for key in (K.TASK_ID, K.INIT_STATE_ID, K.GROUP_ID, K.SAMPLE_ID, K.PADDED):
        if key in rows.keys():  # PADDED: evaluations' rows only
            out[key] = rows[key]
    return out


def _log_metrics(ctx: Any, out: TensorDict, seconds: float) -> None:
    n = batch_len(out)
    if n == 0:
        return
    steps = out[K.STEP_MASK].sum().item()
    ctx.metrics.log("rollout/success_rate", out[K.SUCCESS].float().mean().item(), weight=n)
    progress = out[K.PRIVILEGED_PROGRESS]
    measured = ~progress.isnan()
    if measured.any():  # privileged: how far the episodes got, for reading, not for training
        count = int(measured.sum())
        mean = progress[measured].mean().item()
        ctx.metrics.log("rollout/privileged_progress", mean, weight=count)
    ctx.metrics.log("rollout/episode_steps", steps / n, weight=n)
    ctx.metrics.log("rollout/env_steps_per_s", steps / max(seconds, 1e-9), reduce="sum")


def _log_phases(ctx: Any, phases: dict[str, float]) -> None:
    """Seconds in the simulator (of which in resets) and in the policy, max over ranks."""
    node = ctx.node_id
    ctx.metrics.log(f"time/{node}/simulate", phases["reset"] + phases["step"], reduce="max")
    ctx.metrics.log(f"time/{node}/reset", phases["reset"], reduce="max")
    ctx.metrics.log(f"time/{node}/policy", phases["policy"], reduce="max")


def _log_simulator_faults(ctx: Any, env: Any) -> None:
    """Simulator processes restarted this step (crashes, hangs, exceptions), summed over ranks.

    Only process-pool envs recover from faults (their episodes are replayed, so the batch is
    complete); the counters are cumulative, so the step's events are the difference.
    """
    counts = getattr(env, "fault_counts", None)
    if counts is None:
        return
    now = counts()
    before = ctx.state.get("fault_counts", dict.fromkeys(now, 0))
    for name, value in now.items():
        ctx.metrics.log(f"sim/{name}", value - before.get(name, 0), reduce="sum")
    ctx.state["fault_counts"] = now
