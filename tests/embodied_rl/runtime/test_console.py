"""What ``embodied-rl train`` prints: our step lines and results, and real warnings and errors.

Issue 24, item 5: the console of a run showed Ray's start-up line and its coloured
``(DAGWorker pid=...)`` prefix on every worker line, robosuite's macro-file notice, LIBERO-PRO's
task-order line and a transformers FutureWarning (once per worker), and a config warning about
a key the shipped config sets. Each run here is a real CLI process on the reach task; the
LIBERO/OpenVLA sources are checked where they arise (tests/simulators/test_libero.py,
tests/policies/test_openvla.py) and in the LIBERO run of
tests/embodied_rl/runtime/test_srpo_libero.py, which runs through the CLI for it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from embodied_rl.runtime.config import CONFIG_DIR
from tests.embodied_rl.runtime.run_helpers import assert_only_run_lines, run_cli_train

pytestmark = pytest.mark.ray

TINY = [  # srpo_reach, 2 steps of 1 worker
    "workers.num_workers=1",
    "trainer.total_steps=2",
    "trainer.checkpoint_every=100",
    "eval.every=0",
    "eval.at_end=false",
    "data.batch_size=2",
    "rollout.group_size=4",
    "rollout.num_envs=4",
    "ray.poll_interval_s=0.2",
]


def test_a_run_prints_only_its_step_lines_and_results(tmp_path):
    code, out, err = run_cli_train("srpo_reach", *TINY, f"run_dir={tmp_path / 'run'}")
    assert code == 0, err
    assert_only_run_lines(out, err, steps=2)
    assert out.splitlines()[-2] == f"run finished: {tmp_path / 'run'}"


def _config_dir_with_faults(tmp_path: Path, faults: list[dict]) -> Path:
    """A copy of configs/ whose ``dag/srpo_faults.yaml`` is the SRPO DAG with ``faults``
    (``fault.inject`` configs, rank 0) between ``advantage`` and ``train``."""
    config_dir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, config_dir)
    dag = yaml.safe_load((CONFIG_DIR / "dag" / "srpo.yaml").read_text())
    train = dag["nodes"].pop()
    assert (train["id"], train["deps"]) == ("train", ["advantage"])
    for i, fault in enumerate(faults):
        deps = [dag["nodes"][-1]["id"]]
        dag["nodes"].append(
            {"id": f"fault{i}", "type": "fault.inject", "deps": deps, "config": fault}
        )
    dag["nodes"].append({**train, "deps": [dag["nodes"][-1]["id"]]})
    (config_dir / "dag" / "srpo_faults.yaml").write_text(yaml.safe_dump(dag))
    return config_dir


def test_warnings_and_a_worker_error_still_reach_the_console(tmp_path):
    """A warning of the driver (an unused config key, once), a worker's ``warnings.warn`` and
    logged WARNING, and a worker's exception with its traceback are all printed."""
    faults = [{"step": 0, "mode": "warn"}, {"step": 1, "mode": "raise"}]
    config_dir = _config_dir_with_faults(tmp_path, faults)
    overrides = [
        *TINY,
        "dag=srpo_faults",
        "+algorithm.micro_batch_size=4",
        f"run_dir={tmp_path / 'run'}",
    ]
    code, out, err = run_cli_train("srpo_reach", *overrides, config_dir=config_dir)

    assert code == 1, err
    assert [line.split()[:2] for line in out.splitlines()] == [["step", "1/2"]]
    assert err.count("config keys not used by this run's DAG(s): algorithm.micro_batch_size") == 1
    assert "InjectedWarning: injected warning at rank 0, step 0" in err
    assert "injected log warning at rank 0, step 0" in err
    error = err[err.index("error: ") :]
    assert error.startswith("error: worker rank 0 failed during node 'fault1' at step 1")
    assert 'embodied_rl/nodes/fault.py", line' in error and "in fault_node" in error  # traceback
    assert error.rstrip().endswith("InjectedFault: injected fault at rank 0, step 1")
    assert "\x1b" not in out + err and "pid=" not in err[: err.index("error: ")]
