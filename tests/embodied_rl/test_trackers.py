"""W&B (offline) and MLflow (local file store) beside TensorBoard, read back from their files.

One real run (the CLI in a subprocess: PPO on the reach task, evaluated before and after
training, with a video) logs to both trackers; the tests read what W&B wrote into its
``.wandb`` transaction log and what MLflow's own client returns, and compare it with the
run's ``metrics.jsonl``, ``config.yaml`` and evaluation folder. The same run is exported and
reloaded. The failure cases drive the tracker feed directly, on a run folder the real
``RunLogger`` writes, without Ray.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from omegaconf import OmegaConf

from embodied_rl.cli import main
from embodied_rl.metrics import RunLogger, read_metrics
from embodied_rl.runtime.config import ConfigError, compose, validate_config
from embodied_rl.runtime.config_compose import REPO_ROOT
from embodied_rl.trackers.base import FINISHED, KILLED
from embodied_rl.trackers.feed import TRACKERS_FILE, open_trackers
from embodied_rl.trackers.mlflow_run import metric_key

HAVE_TRACKERS = all(importlib.util.find_spec(m) is not None for m in ("wandb", "mlflow"))
pytestmark = pytest.mark.skipif(
    not HAVE_TRACKERS,
    reason="wandb / mlflow-skinny are not installed: bash scripts/install.sh installs them "
    "(default extras), or .venv/bin/pip install -c constraints.txt -e '.[wandb,mlflow]'",
)

TRACKED = "trainer.loggers=[tensorboard,wandb,mlflow]"
SMALL = [
    "trainer.total_steps=2",
    "trainer.checkpoint_every=2",
    "data.batch_size=4",
    "rollout.group_size=4",
    "rollout.num_envs=8",
    "eval.every=0",
    "eval.at_start=true",  # reports step_000000 (row 0) and step_000002 (row 1)
    "eval.at_end=true",
    "eval.batch_size=4",
    "eval.max_videos=1",
    "eval.video_size=64",
    "workers.num_workers=1",
    "ray.poll_interval_s=0.2",
]


# ------------------------------------------------------------------------ W&B's own files
def wandb_records(run_folder: Path) -> list:
    """The protobuf records of a W&B run's ``run-<id>.wandb`` file.

    The file is a LevelDB log (github.com/google/leveldb doc/log_format.md) after a 7-byte
    header ``:W&B``, magic 0xBEE1, version 0: 32 KiB blocks of chunks ``crc32 (4), length
    (2), type (1: full, 2: first, 3: middle, 4: last), data``, each data a serialized
    ``wandb_internal_pb2.Record``.
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = run_folder.glob("run-*.wandb")
    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block trailer / zero padding
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_folder: Path) -> dict[int, dict]:
    """``{step: {key: value}}`` of every ``run.log`` the run holds (values parsed JSON)."""
    rows: dict[int, dict] = {}
    for record in wandb_records(run_folder):
        if record.WhichOneof("record_type") == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.setdefault(int(items["_step"]), {}).update(items)
    return rows


def wandb_config(run_folder: Path) -> dict:
    """The run's config as ``wandb.init(config=...)`` recorded it."""
    (run,) = [r.run for r in wandb_records(run_folder) if r.WhichOneof("record_type") == "run"]
    return {item.key: json.loads(item.value_json) for item in run.config.update}


# ------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """``embodied-rl train`` with both trackers, as a process of its own (its exit is part of
    what is tested): the run folder, the seconds from its last step's line to its exit, the
    W&B service processes started meanwhile that are still alive, and its output."""
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    args = ["train", "--config-name", "ppo_reach", "--no-progress", *SMALL, TRACKED]
    command = [sys.executable, "-m", "embodied_rl.cli", *args, f"run_dir={run_dir}"]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.time()
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output, last_step = [], None
    for line in process.stdout:
        output.append(line)
        if line.startswith("step 2/2"):
            last_step = time.monotonic()
    code = process.wait(timeout=300)
    assert code == 0 and last_step is not None, "".join(output)
    left = [
        p
        for p in psutil.process_iter(["name", "create_time"])
        if "wandb-core" in (p.info["name"] or "") and p.info["create_time"] >= started - 1
    ]
    return run_dir, time.monotonic() - last_step, left, "".join(output)


def _trackers(run_dir: Path) -> dict:
    return json.loads((run_dir / TRACKERS_FILE).read_text())


def _values(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "step"}


@pytest.mark.ray  # the tracked run
def test_wandb_offline_run_holds_every_metric_the_config_and_the_eval_media(tracked_run):
    run_dir, _, _, _ = tracked_run
    folder = Path(_trackers(run_dir)["wandb"]["folder"])
    assert folder.parent == run_dir / "wandb" and folder.name.startswith("offline-run-")
    history = wandb_history(folder)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and sorted(history) == [0, 1]
    for row in rows:
        logged = history[row["step"]]
        for key, value in _values(row).items():
            assert logged[key] == pytest.approx(value, rel=1e-12, abs=0), (row["step"], key)
    config = wandb_config(folder)
    saved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    assert config["trainer"] == saved["trainer"] and config["models"] == saved["models"]
    assert config["run_dir"] == str(run_dir)  # the run folder, linked (also in the notes)
    # The evaluation after the last step: its table and video at row 1, the files copied.
    logged = history[1]
    table = json.loads((folder / "files" / logged["eval/report/success_table/path"]).read_text())
    results = [r for r in read_metrics(run_dir / "eval" / "results.jsonl") if r["step"] == 2]
    assert [row[:3] for row in table["data"]] == [
        [r["task"], r["instruction"], r["episodes"]] for r in results
    ]
    (video,) = sorted((run_dir / "eval" / "step_000002").glob("*.mp4"))
    (logged_video,) = logged["eval/report/videos/videos"]
    assert logged_video["caption"] == video.stem
    assert logged_video["sha256"] == hashlib.sha256(video.read_bytes()).hexdigest()
    assert (folder / "files" / logged_video["path"]).read_bytes() == video.read_bytes()
    assert "eval/report/success_table/path" in history[0]  # eval.at_start: the report of step 0


@pytest.mark.ray  # the tracked run
def test_mlflow_run_holds_every_metric_the_config_and_the_eval_artifacts(tracked_run, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 opens file stores only so

    run_dir, _, _, _ = tracked_run
    record = _trackers(run_dir)["mlflow"]
    assert record["tracking_uri"] == (run_dir / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    run = client.get_run(record["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["embodied_rl.run_dir"] == str(run_dir)
    assert run.data.params["trainer.total_steps"] == "2"
    rows = read_metrics(run_dir / "metrics.jsonl")
    for key in _values(rows[0]):
        history = {
            m.step: m.value
            for m in client.get_metric_history(run.info.run_id, metric_key(key, True))
        }
        expected = {r["step"]: r[key] for r in rows if key in r}
        assert history == pytest.approx(expected, rel=1e-12, abs=0), key
    config = client.download_artifacts(run.info.run_id, "config.yaml", str(run_dir.parent))
    assert Path(config).read_text() == (run_dir / "config.yaml").read_text()
    listed = [a.path for a in client.list_artifacts(run.info.run_id, "eval/step_000002")]
    (video,) = sorted((run_dir / "eval" / "step_000002").glob("*.mp4"))
    assert f"eval/step_000002/{video.name}" in listed
    assert "eval/step_000002/success_table.json" in listed
    stored = Path(
        client.download_artifacts(
            run.info.run_id, f"eval/step_000002/{video.name}", str(run_dir.parent)
        )
    )
    assert stored.read_bytes() == video.read_bytes()


@pytest.mark.ray  # the tracked run
def test_the_run_exits_promptly_and_leaves_no_tracker_process(tracked_run):
    run_dir, seconds_to_exit, left, output = tracked_run
    # From the last step's line: checkpoint, workers and Ray down, trackers finished, exit.
    assert seconds_to_exit < 30.0, output
    assert left == [], output  # wandb-core is stopped with the run, not left behind
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # beside the trackers
    # The console names where the tracker runs are.
    assert f"wandb: folder {_trackers(run_dir)['wandb']['folder']}, id " in output
    assert f"run_id {_trackers(run_dir)['mlflow']['run_id']}, tracking_uri file://" in output


@pytest.mark.ray  # the tracked run
def test_the_tracked_run_exports_and_reloads_without_its_run_folder(tracked_run, capsys):
    """``embodied-rl export --critic``: the MLP actor and critic load with
    ``MLPPolicy.from_pretrained`` and act / value exactly as the checkpoint's models."""
    from embodied_rl import checkpoint
    from embodied_rl.registry import model_builder
    from embodied_rl.runtime.init_from import load_init_state
    from policies.mlp import MLPPolicy

    run_dir, _, _, _ = tracked_run
    out = run_dir.parent / "exported"
    assert main(["export", str(run_dir), "--out", str(out), "--critic"]) == 0
    assert f"exported critic (models.critic, mlp) to {out / 'critic'}" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert "ppo_reach: mlp policy after 2 steps" in card
    assert "embodied-rl train --config-name ppo_reach" in card  # the recorded command
    assert "| 2 | 4 |" in card  # the evaluation at step 2: 4 episodes
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    ckpt = checkpoint.latest_checkpoint(run_dir / "checkpoints")
    states = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    for role, folder in (("actor", out), ("critic", out / "critic")):
        trained = model_builder("mlp")(config["models"][role]["options"], torch.device("cpu"))
        fresh = {k: v.clone() for k, v in trained.state_dict().items()}
        trained.load_state_dict(load_init_state(str(ckpt), role))
        assert any(not torch.equal(fresh[k], v) for k, v in trained.state_dict().items())
        loaded = MLPPolicy.from_pretrained(folder)
        for key, value in trained.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (role, key)
        a = trained.act(None, [""] * 5, states, do_sample=False)
        b = loaded.act(None, [""] * 5, states, do_sample=False)
        np.testing.assert_array_equal(a.actions, b.actions)
        if role == "critic":
            assert torch.equal(a.values, b.values)


# ------------------------------------------------------------------------------ bad input
def test_an_unknown_logger_or_a_missing_tracker_package_is_refused_at_start_up(monkeypatch):
    with pytest.raises(ConfigError) as info:
        validate_config(compose("ppo_reach", ["trainer.loggers=[tensorboard,wandbb]"]))
    assert "unknown logger 'wandbb' (did you mean 'wandb'?)" in str(info.value)
    assert "Fix: use names from ['tensorboard', 'wandb', 'mlflow']" in str(info.value)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if mlflow-skinny were not installed
    with pytest.raises(ConfigError) as info:
        validate_config(compose("ppo_reach", [TRACKED]))
    message = str(info.value)
    assert "names mlflow, but the mlflow-skinny package is not installed" in message
    assert (
        "Fix: install it with `.venv/bin/pip install -c constraints.txt -e '.[mlflow]'`" in message
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.wandb.dir", "trainer.wandb.dir"),
        ("trainer.mlflow.tracking_uri", "trainer.mlflow.tracking_uri"),
    ],
)
@pytest.mark.own_ray_cluster  # "before Ray": this process must not be connected to start with
def test_a_tracker_that_cannot_write_stops_the_command_before_ray_and_leaves_no_trace(
    tmp_path, capsys, override, key
):
    import ray

    blocker = tmp_path / "a_file"  # a file where the tracker needs a folder: never writable
    blocker.write_text("")
    run_dir = tmp_path / "run"
    args = ["train", "--config-name", "ppo_reach", *SMALL, f"run_dir={run_dir}", TRACKED]
    assert main([*args, f"{override}={blocker / 'sub'}"]) == 2
    err = capsys.readouterr().err
    assert f"error: {key}: cannot write to {blocker / 'sub'}" in err
    assert f"Fix: set {key} to a writable directory" in err
    assert not ray.is_initialized()
    assert list(run_dir.iterdir()) == []  # a retry with the same run_dir starts clean


def _feed_run(tmp_path: Path, *overrides: str):
    """A run folder with its config, as the launcher writes it, and the trackers' feed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    cfg = compose("ppo_reach", [TRACKED, f"run_dir={run_dir}", *overrides])
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir, cfg, open_trackers(cfg, run_dir, "train", run_dir / "config.yaml")


def test_the_feed_sends_nothing_before_the_workers_are_set_up(tmp_path):
    """A resumed run's log may still hold rows past its checkpoint until rank 0 drops them."""
    from mlflow.tracking import MlflowClient

    run_dir, _, feed = _feed_run(tmp_path)
    record = feed.records["mlflow"]
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    with RunLogger(run_dir, total_steps=2, tensorboard=False, console=False) as log:
        log.log(0, {"reward/mean": 0.5})
        feed.poll()
        assert client.get_metric_history(record["run_id"], "reward.mean") == []
        feed.start(0)
        log.log(1, {"reward/mean": 0.75})
    feed.close(FINISHED)
    history = client.get_metric_history(record["run_id"], "reward.mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (1, 0.75)]


def test_a_tracker_failing_mid_run_is_reported_once_and_the_others_go_on(tmp_path, caplog):
    from mlflow.tracking import MlflowClient

    run_dir, _, feed = _feed_run(tmp_path)
    feed.start(0)
    record = feed.records["mlflow"]
    with RunLogger(run_dir, total_steps=4, tensorboard=False, console=False) as log:
        log.log(0, {"reward/mean": 0.25})
        feed.poll()
        # MLflow's store breaks under the run: the file of reward.mean becomes a folder.
        (values,) = (run_dir / "mlruns").glob(f"*/{record['run_id']}/metrics/reward.mean")
        values.unlink()
        values.mkdir()
        with caplog.at_level(logging.WARNING, logger="embodied_rl.trackers.feed"):
            for step in (1, 2, 3):
                log.log(step, {"reward/mean": 0.25 * (step + 1)})
                feed.poll()
    feed.close(FINISHED)
    warnings = [r.getMessage() for r in caplog.records if r.name == "embodied_rl.trackers.feed"]
    assert len(warnings) == 1 and "the mlflow tracker failed in log_metrics" in warnings[0]
    assert [t.name for t in feed.trackers] == ["wandb"]
    history = wandb_history(Path(feed.records["wandb"]["folder"]))
    assert {s: row["reward/mean"] for s, row in history.items()} == {
        0: 0.25,
        1: 0.5,
        2: 0.75,
        3: 1.0,
    }
    status = MlflowClient(tracking_uri=record["tracking_uri"]).get_run(record["run_id"]).info.status
    assert status == "FAILED"


def test_a_resumed_run_continues_its_tracker_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir, _, first = _feed_run(tmp_path)
    first.start(0)
    with RunLogger(run_dir, total_steps=3, tensorboard=False, console=False) as log:
        for step in (0, 1):  # step 1 is past the checkpoint the run resumes from
            log.log(step, {"reward/mean": float(step)})
        first.poll()
    first.close(KILLED)
    _, _, again = _feed_run(tmp_path, "resume=true")
    assert again.records["mlflow"] == first.records["mlflow"]
    assert again.records["wandb"]["id"] == first.records["wandb"]["id"]
    with RunLogger(run_dir, total_steps=3, start_step=1, tensorboard=False, console=False) as log:
        again.start(1)
        for step in (1, 2):
            log.log(step, {"reward/mean": 10.0 + step})
        again.poll()
    again.close(FINISHED)
    client = MlflowClient(tracking_uri=again.records["mlflow"]["tracking_uri"])
    run_id = again.records["mlflow"]["run_id"]
    history = [(m.step, m.value) for m in client.get_metric_history(run_id, "reward.mean")]
    assert sorted(history) == [(0, 0.0), (1, 1.0), (1, 11.0), (2, 12.0)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert json.loads((run_dir / TRACKERS_FILE).read_text()) == again.records
