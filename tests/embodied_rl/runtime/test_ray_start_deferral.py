"""A Ctrl-C or SIGTERM while ``ray.init`` builds its core worker is acted on once Ray has
started (``launch/ray_setup.start_ray``); a second one stops it at once.

Cut short there, the interrupted ``ray.init`` left the core worker's C++ threads running
without the Python object that shuts them down, and the process crashed with SIGSEGV at exit,
after its error line (CI, ``test_signal_fuzz`` seed 0: exit -11 instead of 130). Each case
runs ``start_ray`` in a process of its own, whose ``ray._raylet.CoreWorker`` sends the signals
to the process itself right before the real one is built: the moment of the crash, every time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from embodied_rl.launch.ray_setup import STOP_DEFERRED

SCRIPT = """
import json, os, signal, sys
import embodied_rl  # isort: split
import ray._raylet
from embodied_rl.launch.ray_setup import start_ray
from embodied_rl.processes import descendants, running
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.preemption import Terminated

signals = [int(s) for s in sys.argv[1].split(",")]
built = []
build_core_worker = ray._raylet.CoreWorker

def signalled_core_worker(*args, **kwargs):
    for signum in signals:
        os.kill(os.getpid(), signum)
    built.append(build_core_worker(*args, **kwargs))
    return built[-1]

ray._raylet.CoreWorker = signalled_core_worker
cfg = compose("srpo_reach", ["workers.num_workers=1"])
outcome = {"raised": None}
try:
    start_ray(cfg, 1, 1.0)
except (KeyboardInterrupt, Terminated) as stop:
    outcome["raised"] = type(stop).__name__
outcome["core_workers_built"] = len(built)
outcome["left_running"] = [" ".join(p.cmdline())[:80] for p in descendants() if running(p)]
print(json.dumps(outcome), flush=True)
sys.exit({"KeyboardInterrupt": 130, "Terminated": 143}.get(outcome["raised"], 0))
"""


def _start_signalled(tmp_path: Path, signals: list[signal.Signals]) -> tuple[int, dict, str]:
    """Runs the script: (exit code, its outcome, stderr)."""
    script = tmp_path / "start_signalled.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    argument = ",".join(str(int(s)) for s in signals)
    done = subprocess.run(
        [sys.executable, str(script), argument], capture_output=True, text=True, env=env
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    return done.returncode, json.loads(lines[-1]), done.stderr


@pytest.mark.parametrize(
    "signum, raised, code",
    [(signal.SIGINT, "KeyboardInterrupt", 130), (signal.SIGTERM, "Terminated", 143)],
)
def test_a_signal_while_the_core_worker_is_built_waits_for_ray_to_start(
    tmp_path, signum, raised, code
):
    exit_code, outcome, err = _start_signalled(tmp_path, [signum])
    assert exit_code == code, err  # -11 (SIGSEGV at exit) before the deferral
    assert outcome["raised"] == raised, err
    assert outcome["core_workers_built"] == 1, err  # the start ran to its end first
    assert not outcome["left_running"]
    assert err.count(STOP_DEFERRED) == 1, err


def test_a_second_ctrl_c_stops_the_start_at_once(tmp_path):
    exit_code, outcome, err = _start_signalled(tmp_path, [signal.SIGINT, signal.SIGINT])
    assert exit_code == 130, err
    assert outcome == {"raised": "KeyboardInterrupt", "core_workers_built": 0, "left_running": []}
