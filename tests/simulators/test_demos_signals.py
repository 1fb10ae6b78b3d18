"""SIGTERM or Ctrl-C to ``embodied-rl demos --processes 2`` while its workers run: one line,
exit 143 / 130, and no process it started left running (the driver used to end alone, its
pool workers and the resource tracker going on to write demo files)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.simulators.libero_common import requires_libero

SCRIPT = Path(sys.executable).with_name("embodied-rl")


@pytest.mark.libero
@requires_libero
@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_ends_the_driver_and_every_child(tmp_path, signum, code):
    args = ["demos", "--suite", "libero_object", "--tasks", "0", "1", "--init-states", "0",
            "--image-size", "32", "--processes", "2", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    driver = subprocess.Popen([str(SCRIPT), *args], stderr=subprocess.PIPE, text=True)
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
