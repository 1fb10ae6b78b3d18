"""SIGTERM or Ctrl-C to ``embodied-rl demos --processes 2`` while its workers run: one line,
exit 143 / 130, and no process it started left running (the driver used to end alone, its
pool workers and the resource tracker going on to write demo files). At a random moment
(``slow``), ``--resume`` afterwards writes exactly the files of an uninterrupted run."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.embodied_rl.runtime.run_helpers import CLI_SCRIPT
from tests.simulators.libero_common import requires_libero

TWO_TASKS = ["demos", "--suite", "libero_object", "--tasks", "0", "1", "--init-states", "0",
             "--image-size", "32", "--processes", "2", "--no-progress"]  # fmt: skip


def _digests(out: Path) -> dict[int, str | None]:
    """``{task id: content digest of its demo file}`` as ``demos.json`` records them."""
    report = json.loads((out / "demos.json").read_text())
    return {task["task_id"]: task["digest"] for task in report["tasks"]}


@pytest.mark.libero
@requires_libero
@pytest.mark.skipif(not CLI_SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_driver_and_every_child(tmp_path, signum, code):
    args = [*TWO_TASKS, "--out", str(tmp_path)]
    driver = subprocess.Popen([str(CLI_SCRIPT), *args], stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    while len(psutil.Process(driver.pid).children(recursive=True)) < 3:  # 2 workers, tracker
        assert driver.poll() is None and time.monotonic() - started < 60, "no pool started"
        time.sleep(0.1)
    time.sleep(2.0)  # the workers are building their LIBERO envs
    children = psutil.Process(driver.pid).children(recursive=True)
    driver.send_signal(signum)
    err = driver.communicate(timeout=60)[1]
    assert driver.returncode == code, err
    # After Ctrl-C, multiprocessing's resource tracker (which outlives the pool by design and
    # ends with the driver) may add its note on the semaphores it frees: its lines are its own.
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("[robosuite")]
    lines = [x for x in lines if "resource_tracker" not in x]
    assert len(lines) == 1 and lines[0].startswith("error: stopped by SIG"), err
    assert "--resume goes on from there" in lines[0]
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not list(tmp_path.glob("*.hdf5"))  # nothing written after the signal


@pytest.mark.slow
@pytest.mark.libero
@requires_libero
@pytest.mark.skipif(not CLI_SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_signal_at_a_random_moment_then_resume_writes_the_uninterrupted_files(tmp_path, seed):
    draw = random.Random(seed)
    signum = draw.choice([signal.SIGTERM, signal.SIGINT])
    delay_s = draw.uniform(0.0, 15.0)  # from start-up to the last episode (about 20 s)
    whole = subprocess.run(
        [str(CLI_SCRIPT), *TWO_TASKS, "--out", str(tmp_path / "whole")], timeout=300
    )
    assert whole.returncode == 0
    out = tmp_path / "cut"
    driver = subprocess.Popen(
        [str(CLI_SCRIPT), *TWO_TASKS, "--out", str(out)], stderr=subprocess.PIPE, text=True
    )
    seen: dict[int, psutil.Process] = {}
    due = time.monotonic() + delay_s
    while time.monotonic() < due and driver.poll() is None:
        seen.update({p.pid: p for p in psutil.Process(driver.pid).children(recursive=True)})
        time.sleep(0.05)
    if driver.poll() is None:
        driver.send_signal(signum)
    err = driver.communicate(timeout=60)[1]
    assert driver.returncode in (0, 143 if signum == signal.SIGTERM else 130), err
    assert "Traceback" not in err, err
    _, alive = psutil.wait_procs(list(seen.values()), timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    resumed = subprocess.run(
        [str(CLI_SCRIPT), *TWO_TASKS, "--resume", "--out", str(out)], timeout=300
    )
    assert resumed.returncode == 0
    assert _digests(out) == _digests(tmp_path / "whole")
    assert None not in _digests(out).values()
