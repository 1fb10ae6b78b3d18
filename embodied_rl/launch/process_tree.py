"""The driver's signal policy for the processes a run starts: SIGINT / SIGTERM at any moment,
once or twice, end every one of them, and the command ends with one line and 130 / 143.

Ray's embedded cluster is a tree of processes (the GCS server, the raylet, and under it the
dashboard and runtime-env agents, which ignore SIGTERM); once the raylet exits its agents would
be re-parented to init and no longer ours to find. So the driver makes itself their
subreaper on Linux (:func:`adopt_orphans`: an orphaned descendant is re-parented to it, not
to init), notes what ran before Ray started and, after ``ray.shutdown``, ends every
descendant started since (:class:`StartedProcesses`), an agent the raylet spawned after the
list was taken included. While it takes everything
down, further signals are held back (:func:`signals_held`), so that a second Ctrl-C cannot
leave the tree half shut; a signal while a step must not be cut in two (Ray's start) is deferred
to its end (:func:`signals_deferred`). SIGTERM before the workers run raises :class:`Terminated`
(:func:`sigterm_raises`), as Ctrl-C raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

from embodied_rl.processes import descendants, end_processes, running
from embodied_rl.runtime.preemption import Terminated

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def adopt_orphans() -> None:
    """Linux: descendants orphaned from now on are re-parented to this process, not init."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: orphans go to init, as before
        return


class StartedProcesses:
    """The processes started since this object was made (an embedded Ray cluster's)."""

    ROUNDS = 3  # of ending what is still running after the first

    def __init__(self) -> None:
        adopt_orphans()
        self.before = {p.pid for p in descendants()}
        self.listed: list[psutil.Process] = []

    def take_list(self) -> None:
        """Lists what was started so far (while the raylet lives, its agents are ours)."""
        self.listed = self.now()

    def now(self) -> list[psutil.Process]:
        """Descendants started since, without those of processes that ran before: a command
        this process had started earlier (a second run with its own Ray cluster) is not ours
        to end, nor is anything under it."""
        return _descendants_outside(psutil.Process(), self.before)

    def end(self) -> None:
        """Ends the listed ones and every descendant started since, orphans adopted too."""
        listed = {p.pid for p in self.listed}
        end_processes(self.listed + [p for p in self.now() if p.pid not in listed])
        # A raylet can spawn an agent between the list above and its own SIGTERM (the window
        # widens on a loaded machine): the agent is adopted here and ended in the next round.
        for _ in range(self.ROUNDS):
            left = [p for p in self.now() if running(p)]
            if not left:
                return
            end_processes(left)


def _descendants_outside(root: psutil.Process, excluded: set[int]) -> list[psutil.Process]:
    """``root``'s descendants, depth first, not entering the subtree of an ``excluded`` pid."""
    found: list[psutil.Process] = []
    try:
        children = root.children()
    except psutil.Error:
        return found
    for child in children:
        if child.pid in excluded:
            continue
        found.append(child)
        found.extend(_descendants_outside(child, excluded))
    return found


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _stop_signals_to(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside (from the main thread only: elsewhere
    handlers cannot be set, and the signals keep theirs)."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextmanager
def signals_held() -> Iterator[list[int]]:
    """Ignore SIGINT / SIGTERM inside (recording them): the clean-up runs to its end."""
    held: list[int] = []
    with _stop_signals_to(lambda signum, frame: held.append(signum)):
        yield held


@contextmanager
def signals_deferred(notice: str) -> Iterator[list[int]]:
    """Inside, the first SIGINT / SIGTERM is recorded (``notice`` goes to stderr) for the caller
    to act on once the block has run to its end (:func:`raise_deferred`); a second one raises
    at once, ``KeyboardInterrupt`` or :class:`Terminated`: a user who insists is not kept
    waiting."""
    held: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
        if len(held) == 1:
            os.write(2, f"{notice}\n".encode())  # a handler: no buffered stream
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated("a second SIGTERM came")

    with _stop_signals_to(defer):
        yield held


def raise_deferred(held: list[int], reason: str) -> None:
    """Raises what the first signal ``held`` would have: KeyboardInterrupt or Terminated."""
    if not held:
        return
    if held[0] == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(reason)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM came while the run was starting")


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside, SIGTERM raises :class:`Terminated` (Ray's start-up is Python code that waits
    on processes and sockets; the run's own handler, ``Preemption``, takes over later)."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
