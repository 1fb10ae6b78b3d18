"""launch/process_tree.StartedProcesses: what a run ends after ``ray.shutdown`` is what it
started, and never a process tree that was running before it (a second command the same
process had started, with an embedded Ray cluster of its own)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from embodied_rl.launch.process_tree import StartedProcesses

# A python that starts a grandchild `sleep` after `delay` seconds and then waits on it.
SPAWNS_LATER = (
    "import subprocess, sys, time; time.sleep(float(sys.argv[1])); "
    "subprocess.Popen(['sleep', '60']).wait()"
)
# A python that starts a grandchild `sleep` and exits at once, orphaning it.
ORPHANS_ONE = "import subprocess; subprocess.Popen(['sleep', '60'])"


def _children_of(pid: int, timeout_s: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return children
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child in {timeout_s} s")


def _sleeps_adopted_since(before: set[int], timeout_s: float = 10.0) -> list[psutil.Process]:
    """`sleep` processes re-parented to this one that were not its children before."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        adopted = [
            p for p in psutil.Process().children() if p.pid not in before and p.name() == "sleep"
        ]
        if adopted:
            return adopted
        time.sleep(0.05)
    raise AssertionError("the orphaned sleep was not re-parented to this process")


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_tree_running_before_is_left_alone_even_its_children_started_since():
    earlier = subprocess.Popen([sys.executable, "-c", SPAWNS_LATER, "0.5"])
    try:
        started = StartedProcesses()
        ours = subprocess.Popen([sys.executable, "-c", SPAWNS_LATER, "0"])
        earlier_child = _children_of(earlier.pid)[0]
        our_child = _children_of(ours.pid)[0]

        now = {p.pid for p in started.now()}
        assert now == {ours.pid, our_child.pid}, "the earlier tree's new child is not ours"

        started.end()
        ours.wait(timeout=10)
        assert _gone(our_child)
        assert earlier.poll() is None and earlier_child.is_running()
    finally:
        for process in (earlier, *psutil.Process(earlier.pid).children(recursive=True)):
            process.kill()
        earlier.wait(timeout=10)


def test_an_orphan_of_a_started_process_is_adopted_and_ended():
    children_before = {p.pid for p in psutil.Process().children()}
    started = StartedProcesses()
    subprocess.run([sys.executable, "-c", ORPHANS_ONE], check=True)
    orphan = _sleeps_adopted_since(children_before)[0]
    assert orphan.pid in {p.pid for p in started.now()}

    started.end()
    orphan.wait(timeout=10)  # reaped: this process is its parent now
    assert not psutil.pid_exists(orphan.pid)
