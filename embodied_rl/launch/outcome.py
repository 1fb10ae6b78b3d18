"""What a launched run ends with: its result, or the error the CLI reports with an exit code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied_rl.runtime.preemption import (
    PREEMPTED_EXIT_CODE,
    Terminated,
    interrupted_message,
    terminated_message,
)


class RunFailed(RuntimeError):
    """A worker failed or died, or the cluster cannot run the job; the message names the
    rank, node and step, or what the cluster lacks, and the fix."""

    exit_code = 1  # of the CLI


class RunInterrupted(RunFailed):
    """The user stopped the run (Ctrl-C / SIGINT); the message says what was kept."""

    exit_code = 130  # the shell's code for SIGINT


class RunPreempted(RunInterrupted):
    """SIGTERM stopped the run (a preemption, ``runtime/preemption.py``); the message names
    the newest checkpoint and the resume command."""

    exit_code = PREEMPTED_EXIT_CODE


def stopped_error(stop: BaseException, run_dir: Path, mode: str) -> RunInterrupted:
    """What the user is told once the workers stopped after Ctrl-C or SIGTERM."""
    if isinstance(stop, Terminated):
        return RunPreempted(terminated_message(run_dir, mode, stop.reason))
    return RunInterrupted(interrupted_message(run_dir, mode))


def starting_stopped(stop: BaseException, run_dir: Path) -> RunInterrupted:
    """Ctrl-C or SIGTERM while Ray was starting: nothing ran, every process it had started
    was ended."""
    what, error = (
        ("SIGTERM", RunPreempted) if isinstance(stop, Terminated) else ("Ctrl-C", RunInterrupted)
    )
    return error(
        f"stopped by {what} while Ray was starting: no step ran and every process it had "
        f"started was ended; {run_dir} holds no new checkpoint. Run the same command again"
    )


@dataclass
class RunResult:
    """What a finished run returns: its folder (an evaluation's own), rank 0's final metrics,
    the newest status and result records the driver received, and the trackers' run ids."""

    run_dir: Path
    final_metrics: dict[str, float]
    records: list[Any] = field(default_factory=list)
    trackers: dict[str, Any] = field(default_factory=dict)  # trackers.json: their run ids
