"""One live writer per run folder: ``<run_dir>/.lock``, held by the driver of a ``train`` or
``eval`` for as long as it runs.

Two trainings could share one folder (a second ``resume=true`` of a live run truncated its
``metrics.jsonl`` to the checkpoint, then both wrote the same steps and checkpoints). Now the
driver takes the lock before anything in the folder is written or removed: the file is created
exclusively (``O_CREAT | O_EXCL``: of two drivers starting at once, one gets it) and holds the
holder's pid, host, process start time and command. A lock whose holder is gone is stale and
taken over, with a line that says so: on this host when no process has that pid and start
time (a crashed or killed run); a lock of another host cannot be checked from here and is
refused, naming the host and the file to remove if that run is over.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from embodied_rl.runtime.config_errors import ConfigError

LOCK_FILE = ".lock"


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder's lock."""

    pid: int
    host: str
    started: float  # the holder process's start time (psutil's create_time), seconds
    command: str

    def is_this_process(self) -> bool:
        return self.pid == os.getpid() and self.host == socket.gethostname()

    def alive(self) -> bool | None:
        """Whether the holder still runs: ``None`` when it is on another host."""
        if self.host != socket.gethostname():
            return None
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < 1.0
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return False


def _this_process(command: str) -> Holder:
    pid = os.getpid()
    return Holder(pid, socket.gethostname(), psutil.Process(pid).create_time(), command)


def read_holder(run_dir: Path) -> Holder | None:
    """The holder recorded in ``run_dir/.lock`` (``None``: no lock, or an unreadable one,
    which a writer that died while writing it leaves: stale)."""
    try:
        record: dict[str, Any] = json.loads((run_dir / LOCK_FILE).read_text())
        return Holder(
            int(record["pid"]), str(record["host"]), float(record["started"]), record["command"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_not_held(run_dir: Path) -> None:
    """Refuse a run folder that a live ``train`` / ``eval`` holds (before it is touched).

    Raises:
        ConfigError: naming the holder's pid, host and command, and the fix.
    """
    holder = read_holder(run_dir)
    if holder is None or holder.is_this_process():
        return
    alive = holder.alive()
    if alive is False:
        return  # stale: taken over by acquire()
    where = f"pid {holder.pid} on {holder.host}"
    if alive is None:
        raise ConfigError(
            f"run_dir {run_dir} is held by {where} ({holder.command}), which cannot be checked "
            "from this host",
            f"wait for that run to end, or remove {run_dir / LOCK_FILE} if it is over",
        )
    raise ConfigError(
        f"run_dir {run_dir} is in use by a live run: {where} ({holder.command}); two writers "
        "would mix their steps and checkpoints",
        "wait for it to end (or stop it), or choose another run_dir",
    )


class RunLock:
    """The lock of one run folder, held by this process until :meth:`release`."""

    def __init__(self, run_dir: Path, command: str | None = None) -> None:
        self.path = run_dir / LOCK_FILE
        self.holder = _this_process(command or " ".join(sys.argv) or "python")

    def acquire(self) -> RunLock:
        """Take the lock (``check_not_held`` first); a stale one is replaced, and said so.

        Raises:
            ConfigError: a live holder (see :func:`check_not_held`), or one that took the lock
                between that check and this call.
        """
        check_not_held(self.path.parent)
        stale = read_holder(self.path.parent)
        if stale is not None and not stale.is_this_process():
            print(
                f"note: {self.path} was left by pid {stale.pid} on {stale.host}, which is no "
                "longer running; taking it over",
                file=sys.stderr,
            )
        self.path.unlink(missing_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_not_held(self.path.parent)  # the one that won names itself
            raise
        with os.fdopen(fd, "w") as handle:
            json.dump(vars(self.holder), handle)
        return self

    def release(self) -> None:
        """Remove the lock if this process still holds it."""
        holder = read_holder(self.path.parent)
        if holder is not None and holder.is_this_process():
            self.path.unlink(missing_ok=True)
