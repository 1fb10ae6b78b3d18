"""SIGTERM to the driver: a preemption (Slurm, Kubernetes), stopped like Ctrl-C, checkpointed.

Slurm and Kubernetes send SIGTERM, then SIGKILL a grace period later. The driver's handler
(:class:`Preemption`) asks every worker to stop (``DAGWorker.preempt``) and waits up to
``trainer.preempt_grace_s`` seconds for them; the CLI then names the newest checkpoint and the
resume command and exits 143 (128 + 15, the shell's code for SIGTERM).

Where the stop lands: at the end of the step in progress, after everything an uninterrupted
run does in that step (its training walk, its evaluation when one is due, its metrics row),
where the workers agree on stopping (an all-reduce, so every rank stops after the same step)
and save a checkpoint of it. That checkpoint holds exactly what a regular checkpoint of the
same step would hold, so ``resume=true`` continues as if the run had never stopped: the same
loader positions, RNG states, optimizer states and evaluation positions, and the resumed run
logs the same numbers. The alternative, abandoning the step in progress and saving the step
before it, would need a copy of every model, optimizer and loader taken before each step (the
walk changes them in place), and cutting an evaluation short would leave its loader and RNG
part-way; both are avoided by finishing the step. The cost: a step with an evaluation takes
that evaluation's time too before the stop.

When the step does not end within the grace period, or ``preempt_grace_s`` is 0, or SIGTERM
comes before the steps began or a second time, the driver stops the workers at once, as
Ctrl-C does: the step in progress is discarded and the checkpoints saved before remain.
Either way the workers' status files end up saying where they stopped, not that a node runs.
Set the grace period below the scheduler's warning time, leaving the driver time to stop the
workers: the Slurm recipe asks for SIGTERM 120 s ahead, the default grace period is 60 s.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143, what a shell reports for SIGTERM


class Terminated(BaseException):
    """Raised in the driver's poll loop to stop the workers now (see :class:`Preemption`).

    A ``BaseException``, like ``KeyboardInterrupt``, so that no ``except Exception`` on its
    way to the launcher takes it for a failure.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Preemption:
    """The driver's SIGTERM handler for the duration of a run (a context manager).

    The handler only records the signal; the driver's poll loop acts on it (:meth:`tick`).
    An exception raised by the handler itself would surface inside Ray's C code, wherever
    the main thread waits (``ray.wait`` turns it into a ``SystemError``).

    Args:
        grace_s: how long the workers may take to finish the step in progress and checkpoint
            it (``trainer.preempt_grace_s``); 0 stops them at once.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = float(grace_s)
        self.running = False  # set by the driver once the workers' step loops started
        self.requested_at: float | None = None
        self.signals = 0
        self._forwarded = False
        self._previous: Any = None

    def __enter__(self) -> Preemption:
        # Signal handlers can only be set from the main thread (a launch from another thread,
        # e.g. in a test, keeps the process's own SIGTERM behaviour).
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.requested_at is None:
            self.requested_at = time.monotonic()

    def tick(self, actors: list[Any]) -> None:
        """From the driver's poll loop: after SIGTERM, pass the request on to the workers
        (once), or raise :class:`Terminated` where they are to stop at once."""
        if self.requested_at is None:
            return
        if self.signals > 1:
            raise Terminated("a second SIGTERM came before the step in progress finished")
        if not self.running:
            raise Terminated("SIGTERM came before the training steps began")
        if self.grace_s <= 0:
            raise Terminated("trainer.preempt_grace_s is 0")
        if not self._forwarded:
            self._forwarded = True
            for actor in actors:
                try:
                    actor.preempt.remote()
                except Exception:  # noqa: BLE001 - a dead actor: the run fails on its own
                    continue
        if time.monotonic() - self.requested_at > self.grace_s:
            raise Terminated(
                f"the step in progress did not finish within trainer.preempt_grace_s="
                f"{self.grace_s:g} s"
            )


def _newest(run_dir: Path) -> str:
    from embodied_rl.checkpoint import latest_checkpoint

    newest = latest_checkpoint(run_dir / "checkpoints", checksums=False)
    return f"the newest checkpoint is {newest}" if newest else "no checkpoint was saved yet"


def _resume_hint(run_dir: Path) -> str:
    return f"Continue with the same command plus resume=true run_dir={run_dir}"


def interrupted_message(run_dir: Path, mode: str) -> str:
    """Ctrl-C: the workers were stopped at once; nothing from the step in progress was kept."""
    if mode == "eval":
        return (
            f"interrupted: the evaluation stopped before it finished; its folder {run_dir} is "
            "incomplete (the training run was not touched)"
        )
    return (
        "interrupted: the workers stopped and the step in progress was discarded (no metrics, "
        f"report or checkpoint from it); {_newest(run_dir)}. {_resume_hint(run_dir)}"
    )


def preempted_message(run_dir: Path, steps_done: int) -> str:
    """The workers finished the step in progress and (unless checkpoints are off) saved it."""
    return (
        f"preempted (SIGTERM): the workers finished the step in progress and stopped after "
        f"{steps_done} step(s); {_newest(run_dir)}. {_resume_hint(run_dir)}"
    )


def terminated_message(run_dir: Path, mode: str, reason: str) -> str:
    """The workers were stopped at once; nothing from the step in progress was kept."""
    if mode == "eval":
        return "preempted (SIGTERM): the evaluation stopped before it finished; nothing was written"
    return (
        f"preempted (SIGTERM): {reason}, so the workers were stopped and the step in progress "
        f"was discarded (no metrics, report or checkpoint from it); {_newest(run_dir)}. "
        f"{_resume_hint(run_dir)}"
    )


def mark_stopped(run_dir: Path) -> None:
    """Rewrite the status files of workers that were stopped mid-walk: ``phase: stopped``, no
    node (called once the workers are gone, so none of them writes its file any more)."""
    for path in (run_dir / ".status").glob("rank_*.json"):
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if status.get("phase") in ("done", "preempted"):
            continue  # the worker itself recorded where it ended
        status.update(phase="stopped", node=None)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)
