"""The run-folder lock: one live writer; a dead holder's lock is taken over; another host's
is refused. Holders are real processes (``sleep`` children), not mocks."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import psutil
import pytest

from embodied_rl.runtime.config_errors import ConfigError
from embodied_rl.runtime.run_lock import LOCK_FILE, RunLock, check_not_held, read_holder


def _hold(run_dir, process: psutil.Process | None = None, host: str | None = None) -> None:
    """Write ``run_dir/.lock`` as held by ``process`` (as RunLock writes it)."""
    process = process or psutil.Process()
    record = {"pid": process.pid, "host": host or socket.gethostname(),
              "started": process.create_time(), "command": "embodied-rl train -c x"}  # fmt: skip
    (run_dir / LOCK_FILE).write_text(json.dumps(record))


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    yield psutil.Process(child.pid)
    child.kill()
    child.wait()


def test_acquire_writes_the_holder_and_release_removes_it(tmp_path):
    lock = RunLock(tmp_path, "embodied-rl train -c srpo_reach").acquire()
    holder = read_holder(tmp_path)
    assert (holder.pid, holder.host) == (os.getpid(), socket.gethostname())
    assert holder.command == "embodied-rl train -c srpo_reach" and holder.alive()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_live_holder_is_refused_naming_it(tmp_path, sleeper):
    _hold(tmp_path, sleeper)
    with pytest.raises(ConfigError, match=rf"in use by a live run: pid {sleeper.pid} on "):
        RunLock(tmp_path).acquire()
    assert read_holder(tmp_path).pid == sleeper.pid  # untouched


def test_a_dead_holders_lock_is_taken_over_and_said_so(tmp_path, sleeper, capsys):
    _hold(tmp_path, sleeper)
    sleeper.kill()
    sleeper.wait()
    check_not_held(tmp_path)  # stale: no refusal
    RunLock(tmp_path).acquire()
    assert f"left by pid {sleeper.pid}" in capsys.readouterr().err
    assert read_holder(tmp_path).pid == os.getpid()


def test_a_reused_pid_is_not_the_holder(tmp_path, sleeper):
    """Same pid, another start time: the holder is gone (its pid was given to another)."""
    record = {"pid": sleeper.pid, "host": socket.gethostname(), "started": 1.0, "command": "x"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    assert read_holder(tmp_path).alive() is False


def test_another_hosts_lock_is_refused_with_the_file_to_remove(tmp_path):
    _hold(tmp_path, host="node-7")
    with pytest.raises(ConfigError, match=rf"cannot be checked from this host.*remove {tmp_path}"):
        check_not_held(tmp_path)
