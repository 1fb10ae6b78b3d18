"""Orphaned shared-memory segments (creator killed) are removed; live ones are kept."""

from __future__ import annotations

import os
import subprocess
import sys

from embodied_rl.shm import pid_alive, remove_orphans, shm_dir


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_segments_of_dead_processes_are_removed_and_live_ones_kept():
    gone, me = dead_pid(), os.getpid()
    assert not pid_alive(gone) and pid_alive(me)
    root = shm_dir()
    orphan = root / f"erl_test_{gone}_0_abcd"
    live = root / f"erl_test_{me}_0_abcd"
    unrelated = root / "erl_test_notapid"
    for path in (orphan, live, unrelated):
        path.write_bytes(b"x")
    try:
        removed = remove_orphans("erl_test_")
        assert removed == [orphan]
        assert not orphan.exists() and live.exists() and unrelated.exists()
    finally:
        for path in (orphan, live, unrelated):
            path.unlink(missing_ok=True)
