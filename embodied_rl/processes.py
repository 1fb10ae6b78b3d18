"""Ending the processes a command started: one way for the run driver's Ray tree
(``launch/process_tree.py``) and the demo pool of ``embodied-rl demos``
(``simulators/libero/demos_cli.py``). Imports psutil only, so simulator and worker code may use it
(they must not import ``embodied_rl.launch``)."""

from __future__ import annotations

import psutil


def descendants() -> list[psutil.Process]:
    """Every process this one started, directly or not, still running."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def end_processes(processes: list[psutil.Process], timeout_s: float = 5.0) -> None:
    """SIGTERM each process still alive, SIGKILL those left after ``timeout_s``."""
    alive = [p for p in processes if running(p)]
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            continue
    _, left = psutil.wait_procs(alive, timeout=timeout_s)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=timeout_s)


def running(process: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie has exited and waits only to be reaped)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
