"""``rollout.videos``: the evaluation's videos replay the episodes one env step at a time, at their
own size, with the instruction, a step counter and the outcome drawn on; training rollouts
stay as they were.

The reach task with slow fingertips (``max_speed`` 0.05) and a wide success radius: whether an
episode succeeds depends on its start only (pairs chosen by their start distance), so the
untrained policy gives two successes in the first env step (mid-chunk) and two failures at
the env's limit of 7 steps. The policy acts in chunks of 3 env steps.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import embodied_rl.nodes  # noqa: F401
import policies  # noqa: F401
import rollout  # noqa: F401
import simulators  # noqa: F401
from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.registry import NODE_TYPES, POLICIES
from embodied_rl.runtime.context import MetricSink, NodeContext
from embodied_rl.video import BACKGROUND, OUTCOME_COLORS, frame_layout, read_video
from rollout.videos import RolloutVideosConfig
from simulators.reach import ReachConfig, ReachVectorEnv, init_positions, target_positions
from tests.simulators.libero_common import INIT as LIBERO_INIT
from tests.simulators.libero_common import OPTIONS as LIBERO_OPTIONS
from tests.simulators.libero_common import SIZE as LIBERO_SIZE
from tests.simulators.libero_common import TASK as LIBERO_TASK
from tests.simulators.libero_common import requires_libero

CHUNK, ENV_LIMIT, IMAGE = 3, 7, 16
REACH = {
    "num_tasks": 2,
    "num_init_states": 20,
    "image_size": IMAGE,
    "render_size": IMAGE,
    "max_steps": ENV_LIMIT,
    "max_speed": 0.05,
    "success_radius": 0.14,
}
SIM = {"simulator": "reach", "simulator_options": REACH, "num_envs": 4}
PAIRS = [(0, 14), (1, 10), (0, 0), (1, 1)]  # (task, init state): 2 successes, 2 failures
SUCCESS = [True, True, False, False]


def test_the_pairs_start_inside_or_far_outside_the_success_radius():
    """The premise of the module: travel over an episode (< 0.015 m) cannot change outcomes."""
    config = ReachConfig(**REACH)
    distance = np.linalg.norm(
        init_positions(config) - target_positions(config.num_tasks)[:, None], axis=-1
    )
    starts = np.array([distance[task, init] for task, init in PAIRS])
    assert (starts[:2] < config.success_radius - 0.005).all()
    assert (starts[2:] > config.success_radius + 0.02).all()


def _context(node: str, options: dict, shared: dict, run_dir) -> NodeContext:
    node_type = NODE_TYPES.get(node)
    ctx = NodeContext.single_process(
        node,
        node_type.build_config(options),
        cfg=OmegaConf.create({"seed": 0}),
        metrics=MetricSink(),
        seed_fn=lambda _: 5,
        shared=shared,
        run_dir=run_dir,
    )
    if node_type.setup is not None:
        node_type.setup(ctx)
    return ctx


def _policy(image_size: int = IMAGE):
    options = {"state_dim": 8, "action_dim": 2, "image_size": image_size, "chunk": CHUNK}
    return POLICIES.get("mlp")(options, torch.device("cpu"))


def _rows(pairs=PAIRS):
    return make_batch(
        {
            K.TASK_ID: torch.tensor([task for task, _ in pairs]),
            K.INIT_STATE_ID: torch.tensor([init for _, init in pairs]),
            K.SAMPLE_ID: torch.arange(len(pairs)),
        }
    )


def _evaluate(run_dir, video_size=48, max_steps=None, tamper=None, max_videos=8):
    """The evaluation DAG's three nodes on one shared env: (rollout batch, output, videos ctx)."""
    shared: dict = {}
    options = {**SIM, "group_size": 1, "do_sample": False, "keep_frames": True}
    rollout_ctx = _context(
        "rollout.env", {**options, "keep_actions": True, "max_steps": max_steps}, shared, run_dir
    )
    rollout_ctx.models = {"actor": _policy()}
    videos = {**SIM, "max_videos": max_videos, "video_size": video_size, "fps": 4}
    videos_ctx = _context("rollout.videos", videos, shared, run_dir)
    report_ctx = _context("eval.report", {"suite_name": "reach"}, shared, run_dir)
    try:
        rolled = NODE_TYPES.get("rollout.env").fn(rollout_ctx, _rows())
        batch = rolled.clone()
        if tamper is not None:
            batch[K.ENV_ACTIONS][tamper, 0] = 1.0  # another first chunk than the one evaluated
        out = NODE_TYPES.get("rollout.videos").fn(videos_ctx, batch)
        out = NODE_TYPES.get("eval.report").fn(report_ctx, out)
    finally:
        rollout_ctx.state["vector_env"].close()
    return rolled, out, videos_ctx


def _video_name(i: int, success: bool) -> str:
    task, init = PAIRS[i]
    return f"task{task}_init{init}_{'success' if success else 'failure'}_r0.mp4"


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("eval_videos")
    rolled, out, ctx = _evaluate(run_dir)
    return rolled, out, ctx, run_dir / "eval" / "step_000000"


def test_one_frame_per_env_step_plus_the_reset(evaluation):
    rolled, out, ctx, folder = evaluation
    assert rolled[K.SUCCESS].tolist() == SUCCESS
    # Successes end in the first env step (policy step 0, mid-chunk); failures at the env's
    # limit, 7 env steps = policy steps 0..2 (the last chunk cut after one step).
    assert rolled[K.FINISH_STEP].tolist() == [0, 0, 2, 2]
    assert out[K.HAS_VIDEO].tolist() == [True] * 4
    assert ctx.metrics.pop()["eval/videos"] == (4.0, 1.0, "sum")
    expected = {_video_name(i, ok): 1 + (1 if ok else ENV_LIMIT) for i, ok in enumerate(SUCCESS)}
    assert sorted(p.name for p in folder.glob("*.mp4")) == sorted(expected)
    for name, frames in expected.items():
        assert read_video(folder / name).shape[0] == frames, name


def test_frames_are_drawn_at_the_video_size_with_instruction_steps_and_outcome(evaluation):
    _, _, _, folder = evaluation
    caption = "reach the red target"
    lay = frame_layout(48, 48, caption, "FAILURE", scale=1, labels=True)
    assert (lay.image_height, lay.image_width, lay.width) == (48, 48, 48)  # not upscaled
    video = read_video(folder / _video_name(2, False)).astype(int)
    assert video.shape[1:] == (lay.height, lay.width, 3)
    # The caption band: white text on the dark background, the same on every frame.
    top = video[:, : lay.top]
    assert (top[0].max(axis=-1) > 180).sum() > 20
    assert np.abs(top - top[0]).mean() < 3
    # The bottom band: "step k" changes from frame to frame; dark before the last second
    # (fps 4: frames 4..7 are the last second), red on it.
    band = video[:, lay.bottom :]
    assert np.abs(band[1] - band[0]).max() > 100  # "step 0" vs "step 1"
    dark = np.abs(band[:4] - np.array(BACKGROUND)).max(axis=-1) < 40
    assert dark.mean() > 0.7
    red = band[4:].reshape(-1, 3).mean(axis=0)
    assert np.abs(red - np.array(OUTCOME_COLORS["FAILURE"])).max() < 60
    # A success is green on its last second (its two frames).
    success = read_video(folder / _video_name(0, True)).astype(int)[:, lay.bottom :]
    green = success.reshape(-1, 3).mean(axis=0)
    assert np.abs(green - np.array(OUTCOME_COLORS["SUCCESS"])).max() < 60


def test_the_video_shows_the_evaluated_episode(tmp_path, monkeypatch):
    """Raw frames (before the overlay, captured from the writer) at the policy's image size:
    frame ``t * C`` is the observation the policy saw at policy step ``t``."""
    captured: dict[str, list] = {}

    class Capture:
        def __init__(self, path, *args, **kwargs):
            self.name, self.frames = path.name, 0
            captured[self.name] = []

        def append(self, frame, label=None):
            captured[self.name].append((np.array(frame), label))
            self.frames += 1

        def close(self):
            return None

        def abort(self):
            captured.pop(self.name, None)

    monkeypatch.setattr("rollout.videos.VideoWriter", Capture)
    rolled, out, _ = _evaluate(tmp_path, video_size=IMAGE)
    for i, ok in enumerate(SUCCESS):
        frames = captured[_video_name(i, ok)]
        assert [label for _, label in frames] == [f"step {k}" for k in range(len(frames))]
        images = rolled[K.OBS_IMAGE][i].numpy()
        for t in range(int(rolled[K.FINISH_STEP][i]) + 1):
            np.testing.assert_array_equal(frames[t * CHUNK][0], images[t], err_msg=f"{i}, {t}")
    firsts = [captured[_video_name(i, ok)][0][0] for i, ok in enumerate(SUCCESS)]
    for i in range(len(firsts)):  # the episodes start elsewhere: the check tells them apart
        assert all(not np.array_equal(firsts[i], firsts[j]) for j in range(i))


def test_episodes_cut_by_the_rollouts_max_steps_end_there(tmp_path):
    """rollout max_steps=2 policy steps: failures stop after 6 env steps, before the env's 7."""
    rolled, out, _ = _evaluate(tmp_path, max_steps=2)
    assert rolled[K.FINISH_STEP].tolist() == [0, 0, 1, 1]
    folder = tmp_path / "eval" / "step_000000"
    assert read_video(folder / _video_name(2, False)).shape[0] == 1 + 2 * CHUNK
    assert read_video(folder / _video_name(0, True)).shape[0] == 2


def test_a_replay_that_diverges_writes_no_video_and_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rollout.videos"):
        _, out, _ = _evaluate(tmp_path, tamper=2)
    assert out[K.HAS_VIDEO].tolist() == [True, True, False, True]
    folder = tmp_path / "eval" / "step_000000"
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".mp4") == sorted(
        _video_name(i, ok) for i, ok in enumerate(SUCCESS) if i != 2
    )  # no partial file left either
    assert "task 0, init state 0 (failure) is not the evaluated episode" in caplog.text
    assert "before policy step 1 differs" in caplog.text
    page = (folder / "report.html").read_text()
    assert _video_name(2, False) not in page and len(re.findall(r"<video ", page)) == 3


def test_a_video_that_cannot_be_written_is_skipped_with_a_warning(tmp_path, caplog):
    """An OSError of the encoder or the file system (here: a folder where the video goes)
    costs that video only, never the evaluation or the training run."""
    folder = tmp_path / "eval" / "step_000000"
    (folder / _video_name(2, False)).mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="rollout.videos"):
        _, out, _ = _evaluate(tmp_path)
    assert out[K.HAS_VIDEO].tolist() == [True, True, False, True]
    assert "task 0, init state 0 (failure) could not be written (IsADirectoryError" in caplog.text
    assert not list(folder.glob(".*partial*"))  # no partial file left
    assert len(re.findall(r"<video ", (folder / "report.html").read_text())) == 3


def test_report_shows_each_video_inline_and_links_it(evaluation):
    _, _, _, folder = evaluation
    page = (folder / "report.html").read_text()
    sources = re.findall(r'<video controls[^>]* src="([^"]+)"', page)
    assert sorted(sources) == sorted(p.name for p in folder.glob("*.mp4"))
    markdown = (folder / "report.md").read_text()
    links = re.findall(r"\]\(([^)]+\.mp4)\)", markdown)
    assert sorted(links) == sorted(sources)
    assert "- [task 0, init 0: FAILURE](task0_init0_failure_r0.mp4)" in markdown


def test_max_videos_zero_replays_nothing(tmp_path, monkeypatch):
    def no_render(self, size=None):
        raise AssertionError("rendered without a video to write")

    monkeypatch.setattr(ReachVectorEnv, "render", no_render)  # the rollout uses its images
    _, out, _ = _evaluate(tmp_path, max_videos=0)
    assert out[K.HAS_VIDEO].tolist() == [False] * 4
    assert not list(tmp_path.rglob("*.mp4"))


def _spy(env, sizes: list, sent: list) -> None:
    """Record the sizes ``env.render`` is asked for and the actions ``env.step_chunk`` gets."""
    render, step_chunk = env.render, env.step_chunk

    def spy_render(size=None, envs=None):
        sizes.append(size)
        return render(size, envs)

    def spy_step_chunk(actions):
        sent.append(np.array(actions))
        return step_chunk(actions)

    env.render, env.step_chunk = spy_render, spy_step_chunk


def test_training_rollouts_unchanged_and_never_draw_video_frames(tmp_path):
    """keep_actions only adds ENV_ACTIONS (what the env got); everything else, FRAMES
    included, is the same, and the rollout renders nothing but its own frames."""
    outputs, sizes, sent = {}, [], []
    for keep in (False, True):
        shared: dict = {}
        options = {**SIM, "group_size": 2, "keep_actions": keep, "max_steps": 3}
        options["simulator_options"] = {**REACH, "image_size": 0}  # FRAMES from render()
        ctx = _context("rollout.env", options, shared, tmp_path)
        ctx.models = {"actor": _policy(image_size=0)}
        env = ctx.state["vector_env"]
        _spy(env, sizes, sent)
        try:
            outputs[keep] = NODE_TYPES.get("rollout.env").fn(ctx, _rows(PAIRS[2:]))
        finally:
            env.close()
    off, on = outputs[False], outputs[True]
    assert K.ENV_ACTIONS not in off.keys() and set(on.keys()) - set(off.keys()) == {K.ENV_ACTIONS}
    for key in off.keys():
        if key != K.PROMPT_TEXT:
            torch.testing.assert_close(on[key], off[key], rtol=0, atol=0, msg=key)
    assert off[K.FRAMES].shape[2:] == (IMAGE, IMAGE, 3)  # render_size, not a video size
    assert set(sizes) == {None}
    actions = on[K.ENV_ACTIONS]  # (4 episodes, 3 policy steps, C, 2): what step_chunk got
    assert actions.shape == (4, 3, CHUNK, 2)
    recorded = np.stack(sent[len(sent) // 2 :], axis=1)  # the second run's calls
    np.testing.assert_array_equal(actions.numpy(), recorded)


def test_bad_options_name_the_fix():
    with pytest.raises(ValueError, match=r"video_size must be >= 1 \(pixels\), got 0; set eval"):
        RolloutVideosConfig(video_size=0)
    libero = {"simulator": "libero", "simulator_options": {"suite": "libero_goal"}}
    with pytest.raises(ValueError, match=r"video_size must be in \[1, 480\]"):
        RolloutVideosConfig(**libero, video_size=512)
    with pytest.raises(ValueError, match="plain folder name"):
        RolloutVideosConfig(name="a/b")
    # Bad simulator options are the evaluation rollout's to report (once per DAG, not twice:
    # tests/embodied_rl/test_bad_input_files.py); the node then checks only video_size >= 1.
    assert RolloutVideosConfig(simulator_options={"imagesize": 3}).video_size == 256
    node = NODE_TYPES.get("rollout.videos")
    cfg = node.build_config({"max_videos": 2})
    assert (cfg.video_size, cfg.fps, cfg.max_videos) == (256, 20, 2)
    assert K.ENV_ACTIONS in node.read_keys(cfg) and node.write_keys(cfg) == (K.HAS_VIDEO,)
    rollout_node = NODE_TYPES.get("rollout.env")
    assert K.ENV_ACTIONS not in rollout_node.write_keys(rollout_node.build_config({}))


@pytest.mark.libero
@requires_libero
def test_libero_episode_replays_into_a_video_of_every_env_step(tmp_path):
    """LIBERO (libero_goal task 0, 64 px observations, an episode limit of 4 env steps),
    chunks of 3: the replay is the episode (its states match) and the video has 4 + 1
    frames of 128 px, not the 2 policy steps' 64 px observations."""
    shared: dict = {}
    sim = {"simulator": "libero", "simulator_options": LIBERO_OPTIONS, "num_envs": 1}
    options = {**sim, "group_size": 1, "do_sample": False, "keep_frames": False}
    rollout_ctx = _context("rollout.env", {**options, "keep_actions": True}, shared, tmp_path)
    policy = {"state_dim": 8, "action_dim": 7, "image_size": LIBERO_SIZE, "chunk": CHUNK}
    rollout_ctx.models = {"actor": POLICIES.get("mlp")(policy, torch.device("cpu"))}
    videos = {**sim, "max_videos": 1, "video_size": 128, "fps": 4}
    videos_ctx = _context("rollout.videos", videos, shared, tmp_path)
    try:
        rows = make_batch(
            {
                K.TASK_ID: torch.tensor([LIBERO_TASK]),
                K.INIT_STATE_ID: torch.tensor([LIBERO_INIT]),
                K.SAMPLE_ID: torch.tensor([0]),
            }
        )
        rolled = NODE_TYPES.get("rollout.env").fn(rollout_ctx, rows)
        out = NODE_TYPES.get("rollout.videos").fn(videos_ctx, rolled)
    finally:
        rollout_ctx.state["vector_env"].close()
    assert rolled[K.FINISH_STEP].tolist() == [1] and not rolled[K.SUCCESS][0]
    assert out[K.HAS_VIDEO].tolist() == [True]
    (path,) = (tmp_path / "eval" / "step_000000").glob("*.mp4")
    assert path.name == f"task{LIBERO_TASK}_init{LIBERO_INIT}_failure_r0.mp4"
    video = read_video(path)
    lay = frame_layout(128, 128, "open the middle drawer of the cabinet", "FAILURE", 1, True)
    assert video.shape == (4 + 1, lay.height, 128, 3)
