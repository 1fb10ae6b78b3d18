"""Cluster problems are refused at start-up with one message naming what is missing and the fix.

Fast cases on the embedded cluster and on addresses nobody listens on; the multi-node runs are
in ``test_multi_node.py``.
"""

from __future__ import annotations

import socket
import time

import pytest

from embodied_rl.cli import main
from embodied_rl.launch.launcher import launch

# ray.address of other clusters, and the embedded cluster's own size (ray.num_cpus)
from embodied_rl.launch.outcome import RunFailed
from embodied_rl.runtime.cluster import bundles_that_fit
from embodied_rl.runtime.config import compose

pytestmark = pytest.mark.own_ray_cluster

SMALL = ["data.batch_size=4", "rollout.n=4", "trainer.total_steps=1"]


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_bundles_that_fit_counts_the_scarcest_resource():
    assert bundles_that_fit({"CPU": 8.0, "GPU": 2.0}, {"GPU": 1, "CPU": 1.5}) == 2
    assert bundles_that_fit({"CPU": 8.0}, {"GPU": 1, "CPU": 1}) == 0  # no GPU on the node
    assert bundles_that_fit({"CPU": 3.0}, {"CPU": 0.5}) == 6
    assert bundles_that_fit({"CPU": 0.9999999999}, {"CPU": 1}) == 1  # float noise of Ray


def test_unreachable_address_is_refused_quickly_with_the_fix(tmp_path):
    address = f"127.0.0.1:{_closed_port()}"
    cfg = compose("grpo_llm", [*SMALL, f"run_dir={tmp_path}", f"ray.address={address}"])
    started = time.monotonic()
    with pytest.raises(RunFailed) as info:
        launch(cfg, show_progress=False)
    message = str(info.value)
    assert f"cannot reach the Ray cluster at ray.address={address}" in message
    assert "ray start --head" in message and "ray.address=null" in message
    assert time.monotonic() - started < 10


def test_malformed_address_names_the_expected_form(tmp_path, capsys):
    code = main(["train", "-c", "grpo_llm", *SMALL, f"run_dir={tmp_path}", "ray.address=headnode"])
    assert code == 1
    err = capsys.readouterr().err
    assert "ray.address='headnode' is not host:port" in err and "10.0.0.1:6379" in err


def test_bad_placement_strategy_is_a_config_error(capsys):
    assert main(["validate", "-c", "grpo_llm", "ray.placement_strategy=FILL"]) == 2
    assert "placement_strategy must be one of" in capsys.readouterr().err


@pytest.mark.ray
def test_cluster_smaller_than_the_dag_is_refused_naming_the_shortfall(tmp_path):
    cfg = compose(
        "grpo_llm",
        [*SMALL, f"run_dir={tmp_path}", "ray.num_cpus=1", "workers.num_workers=2"],
    )
    started = time.monotonic()
    with pytest.raises(RunFailed) as info:
        launch(cfg, show_progress=False)
    message = str(info.value)
    assert "the DAG needs 2 workers of {'CPU': 1}" in message
    assert "1 alive node(s) hold 1" in message
    assert "lower workers.num_workers" in message
    assert time.monotonic() - started < 60  # refused before any placement wait


@pytest.mark.ray
def test_embedded_run_records_its_placement_and_databuffer_bytes(tmp_path):
    """One node: every rank on it, transfers through shared memory, none over the network."""
    import json

    result = launch(
        compose(
            "grpo_llm",
            [*SMALL, f"run_dir={tmp_path}", "+dag.nodes.1.parallel={workers: [0]}"],
        ),
        show_progress=False,
    )
    placement = json.loads((result.run_dir / "placement.json").read_text())
    assert len(placement["rank_nodes"]) == 2 and len(set(placement["rank_nodes"])) == 1
    metrics = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["databuffer/bytes_shm"] > 0
    assert metrics["databuffer/bytes_network"] == 0
    assert any(k.startswith("time/transfer/") for k in metrics)
