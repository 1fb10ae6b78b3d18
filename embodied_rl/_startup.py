"""Ctrl-C or SIGTERM while the ``embodied-rl`` command is still importing: one line, not a
traceback of the import that was running.

``embodied_rl/__init__.py`` installs :func:`quiet_interrupts_while_starting` first thing when
the process is the console script (``sys.argv[0]`` is ``embodied-rl``; never when the package
is imported as a library, in tests or in Ray workers); the CLI's ``main`` calls
:func:`restore_default_interrupts` once its parser is built, from where Ctrl-C is its own to
handle (``KeyboardInterrupt`` -> exit 130) and SIGTERM still one line and 143 wherever a run
has not put its own handler in (``launch``).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

CONSOLE_SCRIPT = "embodied-rl"


# Set by the console script's process to its pid: the processes it spawns (multiprocessing
# restores the parent's sys.argv in them) are not the console script.
CLI_PID = "EMBODIED_RL_CLI_PID"


def is_console_script() -> bool:
    """Whether this process is the ``embodied-rl`` console script itself (not a process it
    spawned, e.g. a worker of ``demos --processes``)."""
    named = bool(sys.argv) and os.path.basename(sys.argv[0]) == CONSOLE_SCRIPT
    return named and os.environ.get(CLI_PID) in (None, str(os.getpid()))


def _exit_while_starting(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT:  # installed for SIGINT during the imports only
        line = "error: interrupted (Ctrl-C) while starting; nothing was run"
    else:  # before a run's workers start, or once they are gone: nothing of a step is lost
        line = "error: stopped by SIGTERM outside a run's steps"
    os.write(2, f"{line}\n".encode())
    os._exit(128 + signum)  # 130 / 143, as a shell reports a process ended by the signal


def quiet_interrupts_while_starting() -> None:
    """SIGINT / SIGTERM end the process at once with one line (nothing has started yet)."""
    os.environ[CLI_PID] = str(os.getpid())
    signal.signal(signal.SIGINT, _exit_while_starting)
    signal.signal(signal.SIGTERM, _exit_while_starting)


def restore_default_interrupts() -> None:
    """Ctrl-C raises KeyboardInterrupt again (the CLI and a run's driver handle it); SIGTERM
    keeps ending the process with one line, except where a run puts its own handler in
    (``launch/process_tree.py`` while Ray starts, ``runtime/preemption.py`` during the run)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
