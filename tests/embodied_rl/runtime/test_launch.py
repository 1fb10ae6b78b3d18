"""The real CLI path end to end on Ray: 2 workers, GRPO on the tiny LM, on CPU."""

from __future__ import annotations

import json
import pickle
import time

import pytest
import torch
from omegaconf import open_dict

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.runtime.config import compose

pytestmark = pytest.mark.ray

SMALL = [
    "data.batch_size=4",
    "rollout.n=4",
    "trainer.checkpoint_every=1",
    "ray.poll_interval_s=0.2",
    "trainer.log_to_console=false",
]
COMPARED = ("reward/mean", "loss/policy", "actor/grad_norm", "actor/entropy")


def _run(tmp_path, name, *overrides):
    cfg = compose("grpo_llm", [*SMALL, f"run_dir={tmp_path / name}", *overrides])
    return launch(cfg, show_progress=False)


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The uninterrupted 3-step run: checked for its run dir and the reference of resuming."""
    return _run(tmp_path_factory.mktemp("full"), "full", "trainer.total_steps=3")


def test_train_writes_run_dir_and_driver_gets_only_small_records(full_run):
    result = full_run
    run_dir = result.run_dir
    assert (run_dir / "config.yaml").exists()
    lines = _metrics(run_dir)
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in lines)
    assert all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in lines)
    png = (run_dir / "metrics.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000003",
    ]
    # The driver never receives batch data: every record is a small dict of scalars.
    assert result.records
    for record in result.records:
        assert isinstance(record, dict)
        assert len(pickle.dumps(record)) < 8192
        for value in record.values():
            assert not isinstance(value, torch.Tensor)
    assert result.final_metrics["reward/mean"] == pytest.approx(lines[-1]["reward/mean"])


def test_time_limit_ends_the_run_after_the_step_it_passed_with_a_checkpoint(tmp_path):
    # A limit of 0.6 ms has passed when the first step ends: the run stops there on every
    # rank, checkpoints that step, and logs the training wall time; resuming starts its
    # clock from the checkpoint's.
    limit = "trainer.time_limit_min=0.00001"
    result = _run(tmp_path, "a", "trainer.total_steps=5", "trainer.checkpoint_every=3", limit)
    lines = _metrics(result.run_dir)
    assert [m["step"] for m in lines] == [0]
    assert [p.name for p in (result.run_dir / "checkpoints").iterdir()] == ["step_000001"]
    first = lines[0]["time/elapsed_s"]
    assert first >= lines[0]["time/step"] > 0
    resumed = _run(tmp_path, "a", "trainer.total_steps=5", limit, "resume=true")
    again = _metrics(resumed.run_dir)
    assert [m["step"] for m in again] == [0, 1]
    assert again[1]["time/elapsed_s"] > first


def test_resume_reproduces_the_uninterrupted_next_steps(tmp_path, full_run):
    full = _metrics(full_run.run_dir)
    _run(tmp_path, "cut", "trainer.total_steps=1")
    resumed = _metrics(_run(tmp_path, "cut", "trainer.total_steps=3", "resume=true").run_dir)
    assert [m["step"] for m in resumed] == [0, 1, 2]
    for step in (1, 2):  # the step right after the resume point, and the one after it
        for key in COMPARED:
            want = full[step][key]
            assert resumed[step][key] == pytest.approx(want, rel=1e-5, abs=1e-6), (step, key)


@pytest.mark.parametrize(("mode", "what"), [("exit", "died"), ("raise", "failed")])
def test_failed_worker_stops_the_run_naming_rank_and_node(tmp_path, mode, what):
    # The fault ends the run in step 1: a second step is all the run needs.
    cfg = compose("grpo_llm", [*SMALL, f"run_dir={tmp_path}", "trainer.total_steps=2"])
    with open_dict(cfg):
        chaos = {"id": "chaos", "type": "fault.inject", "deps": ["advantage"]}
        chaos["config"] = {"rank": 1, "step": 1, "mode": mode}
        cfg.dag.nodes.append(chaos)
        cfg.dag.nodes[4].deps = ["chaos"]  # train now runs after the fault node
    started = time.monotonic()
    with pytest.raises(RunFailed) as info:
        launch(cfg, show_progress=False)
    message = str(info.value)
    assert f"worker rank 1 {what}" in message
    assert "during node 'chaos' at step 1" in message
    status = json.loads((tmp_path / ".status" / "rank_00001.json").read_text())
    assert f"(pid {status['pid']} on host {status['host']})" in message  # where to look
    assert time.monotonic() - started < 120  # stopped, not hung on rank 0's collectives


def test_cli_validate_and_plan(capsys):
    assert main(["validate", "--config-name", "grpo_llm"]) == 0
    assert "OK: grpo_llm: 5 nodes on 2 worker(s)" in capsys.readouterr().out
    assert main(["plan", "--config-name", "grpo_llm", "workers.num_workers=4"]) == 0
    out = capsys.readouterr().out
    assert "rank 3:" in out and "node train (actor.train): dp 3/4" in out
    assert main(["validate", "--config-name", "grpo_llm", "data.batch_size=3"]) == 2
    assert "not divisible by its data-parallel size 2" in capsys.readouterr().err
    assert main(["validate", "--config-name", "grpo_llm", "trainer.totl_steps=3"]) == 2
    assert "totl_steps" in capsys.readouterr().err


@pytest.fixture(scope="module")
def kl_layout_run(tmp_path_factory):
    """One run for two checks: GRPO with a reference model and KL, with the rollout on worker
    0 only and every other node on both (two transfers per step)."""
    overrides = ["dag=grpo_kl", "algorithm.actor.kl_coef=0.1", "trainer.total_steps=2"]
    overrides += ["+dag.nodes.1.parallel={workers: [0]}"]  # node 1 is the rollout
    return _run(tmp_path_factory.mktemp("kl_layout"), "kl_layout", *overrides)


def test_grpo_with_reference_model_and_kl(kl_layout_run):
    lines = _metrics(kl_layout_run.run_dir)
    # The reference starts identical to the actor: KL is exactly 0 before the first update.
    assert lines[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7)
    assert lines[1]["loss/kl"] > 0.0


def test_layout_change_between_nodes_moves_data_between_workers(kl_layout_run):
    """Rollout on worker 0 only, everything else on both: two transfers per step."""
    result = kl_layout_run
    assert compose("grpo_llm", ["dag=grpo_kl"]).dag.nodes[1].id == "rollout"  # the one moved
    lines = _metrics(result.run_dir)
    assert [m["step"] for m in lines] == [0, 1]
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in lines)
    # Both training ranks hold identical weights: the gradient all-reduce worked.
    from embodied_rl.checkpoint import latest_checkpoint, load_rank_shard

    ckpt = latest_checkpoint(result.run_dir / "checkpoints")
    weights = [load_rank_shard(ckpt, r, world_size=2)["models"]["model/actor"] for r in (0, 1)]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name
