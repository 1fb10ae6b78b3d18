"""GRPO across a real 3-node Ray cluster on this machine (``ray start --head`` + 2 workers).

Four workers spread over the nodes, the rollout on workers 0 and 1 only, so every step moves
data between layouts: across nodes through the collective, within a node through shared
memory. Checked against the same run on the embedded one-node cluster: the same metrics, the
same bytes moved (split differently between the two paths), and a lost node stops the run
naming the node and its ranks; ``resume=true`` on the remaining nodes finishes it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.local_cluster import LocalRayCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.own_ray_cluster]

STEPS = 3
OVERRIDES = [
    "data.batch_size=4",
    "rollout.n=4",
    "workers.num_workers=4",
    "+dag.nodes.1.parallel={workers: [0, 1]}",  # rollout on 2 of the 4 workers
    "trainer.checkpoint_every=1",
    "ray.poll_interval_s=0.2",
    "ray.placement_strategy=SPREAD",
]
COMPARED = ("reward/mean", "loss/policy", "actor/grad_norm", "actor/entropy")


def _run(run_dir: Path, *overrides: str):
    cfg = compose("grpo_llm", [*OVERRIDES, f"run_dir={run_dir}", *overrides])
    return launch(cfg, show_progress=False)


def _metrics(run_dir: Path) -> dict[int, dict]:
    """The newest line of each step (a resumed run logs the re-run steps again)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {m["step"]: m for m in map(json.loads, lines)}


def _rank_nodes(run_dir: Path) -> list[str]:
    return json.loads((run_dir / "placement.json").read_text())["rank_nodes"]


@pytest.fixture(scope="module")
def single_node(tmp_path_factory) -> dict[int, dict]:
    run_dir = tmp_path_factory.mktemp("single") / "run"
    _run(run_dir, f"trainer.total_steps={STEPS}")
    return _metrics(run_dir)


def test_three_nodes_match_one_node_and_cross_nodes_through_the_collective(
    tmp_path, single_node, capsys
):
    with LocalRayCluster(head_cpus=2, worker_cpus=[1, 1]) as cluster:
        plan = ["plan", "-c", "grpo_llm", *OVERRIDES, f"ray.address={cluster.address}"]
        assert main(plan) == 0
        assert "placement: 4 worker(s) on 3 Ray node(s)" in capsys.readouterr().out
        _run(tmp_path, f"ray.address={cluster.address}", f"trainer.total_steps={STEPS}")
        assert set(_rank_nodes(tmp_path)) <= set(cluster.node_ids)
    assert len(set(_rank_nodes(tmp_path))) == 3  # SPREAD: every node runs a worker
    multi = _metrics(tmp_path)
    assert sorted(multi) == sorted(single_node) == list(range(STEPS))
    for step, one in single_node.items():
        for key in COMPARED:
            assert multi[step][key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (step, key)
        # One node: everything through shared memory. Three nodes: the same bytes, part of
        # them between nodes (ranks 2 and 3 always send to 0 or 1, and at most one node
        # holds two ranks, so some pair crosses nodes).
        assert one["databuffer/bytes_network"] == 0 and one["databuffer/bytes_shm"] > 0
        assert multi[step]["databuffer/bytes_network"] > 0
        moved = multi[step]["databuffer/bytes_network"] + multi[step]["databuffer/bytes_shm"]
        assert moved == one["databuffer/bytes_shm"]
        assert multi[step]["databuffer/bytes_local"] == one["databuffer/bytes_local"]


def _kill_when_step_reached(cluster, run_dir: Path, step: int, killed: dict) -> None:
    """Background: once a rank works on ``step``, kill a worker node that holds ranks."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            rank_nodes = _rank_nodes(run_dir)
            steps = [
                json.loads(p.read_text()).get("step", -1)
                for p in (run_dir / ".status").glob("rank_*.json")
            ]
        except (OSError, ValueError):
            steps = []
        if steps and max(steps) >= step:
            victim = next(n for n in rank_nodes if n != cluster.node_ids[0])
            killed["node"] = victim
            killed["ranks"] = [r for r, n in enumerate(rank_nodes) if n == victim]
            cluster.kill_node(victim)
            return
        time.sleep(0.2)


def test_lost_node_stops_the_run_naming_it_and_resume_finishes_on_the_rest(tmp_path):
    # The head holds 4 CPUs: after a 1-CPU worker node is lost, the job still fits.
    with LocalRayCluster(head_cpus=4, worker_cpus=[1, 1]) as cluster:
        address = f"ray.address={cluster.address}"
        killed: dict = {}
        killer = threading.Thread(
            target=_kill_when_step_reached, args=(cluster, tmp_path, 2, killed), daemon=True
        )
        killer.start()
        started = time.monotonic()
        with pytest.raises(RunFailed) as info:
            _run(tmp_path, address, "trainer.total_steps=5")
        killer.join(timeout=10)
        assert killed, "the node was never killed"
        message = str(info.value)
        ranks = ", ".join(map(str, killed["ranks"]))
        assert f"Ray node {killed['node'][:8]} (" in message
        assert f"was lost with ranks {ranks}." in message
        assert "resume=true" in message
        assert time.monotonic() - started < 240  # stopped, not hung in a collective
        before = _metrics(tmp_path)
        assert 2 <= len(before) < 5

        _run(tmp_path, address, "trainer.total_steps=5", "resume=true")
        assert killed["node"] not in _rank_nodes(tmp_path)
    after = _metrics(tmp_path)
    assert sorted(after) == list(range(5))
    for step in range(len(before) - 1):  # steps before the checkpoint kept their values
        assert after[step]["reward/mean"] == before[step]["reward/mean"]


def test_node_lost_at_start_up_is_refused_naming_what_is_missing(tmp_path):
    """A worker node dies just before the launch: whether the cluster has noticed yet (the
    capacity check) or not (the placement wait), one message says what is missing."""
    with LocalRayCluster(head_cpus=1, worker_cpus=[1]) as cluster:
        cluster.kill_node(cluster.node_ids[1])
        started = time.monotonic()
        with pytest.raises(RunFailed) as info:
            _run(
                tmp_path,
                f"ray.address={cluster.address}",
                "workers.num_workers=2",
                "ray.placement_timeout_s=15",
                "trainer.total_steps=1",
            )
        assert time.monotonic() - started < 60  # no hang past the configured timeout
    message = str(info.value)
    assert "2 workers of {'CPU': 1}" in message
    assert "lower workers.num_workers" in message
