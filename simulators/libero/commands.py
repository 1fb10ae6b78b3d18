"""The commands the ``libero`` package adds to ``embodied-rl``: ``demos``, its help and options.

The core CLI imports the plugin packages on every call to build its parser
(``embodied_rl.registry.COMMAND_PLUGINS``), so this module stays light: the command itself,
:mod:`simulators.libero.demos_cli` (the planner, the demo writer; LIBERO once it runs), is
imported only when ``embodied-rl demos`` runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from embodied_rl.registry import register_command

DEMOS_HELP = (
    "write scripted LIBERO demonstrations (pick and place, drawers, knobs, pushes; LIBERO's "
    "HDF5 layout) and, with --report, the planner's success on every official init state"
)


def _ids(text: str) -> int | None:
    """An id argument: a non-negative integer, or ``all`` (returned as ``None``)."""
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer id or 'all', got {text!r}") from None


def _add_demos_arguments(cmd: argparse.ArgumentParser) -> None:
    """``embodied-rl demos``'s options (the task and init-state ids, the output, the report)."""
    cmd.add_argument("--suite", default="libero_object", help="LIBERO suite (default: %(default)s)")
    cmd.add_argument(
        "--tasks", nargs="+", type=_ids, default=["all"], help="task ids or 'all' (default: all)"
    )
    cmd.add_argument(
        "--init-states",
        nargs="*",
        type=_ids,
        default=[0],
        help="official init-state ids to record, or 'all' (default: 0); none given: no demo "
        "files (e.g. with --report)",
    )
    cmd.add_argument("--out", required=True, help="output directory (created if missing)")
    cmd.add_argument(
        "--image-size", type=int, default=128, help="camera frame side in pixels (default: 128)"
    )
    cmd.add_argument(
        "--report",
        action="store_true",
        help="also run every init state of each task without cameras; write report.json/.md",
    )
    cmd.add_argument(
        "--resume",
        action="store_true",
        help="keep the tasks whose demos --out's demos.json records (same init states, file "
        "unchanged) and, with --report, the tasks report.json holds; run only the others (a "
        "stopped run goes on where it stopped)",
    )
    cmd.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    cmd.add_argument(
        "--overwrite",
        action="store_true",
        help="replace demo files that --out already holds (refused otherwise)",
    )
    cmd.add_argument(
        "--videos",
        action="store_true",
        help="also write an MP4 of every demo (agent camera, instruction, step) to --out/videos",
    )
    cmd.add_argument(
        "--processes",
        type=int,
        default=1,
        help="run this many tasks at once, each in its own process (default: 1; the same files)",
    )


def _all_or_ids(values: Sequence[int | None]) -> list[int] | None:
    """``None`` when ``all`` is among ``values``, else the ids (the string ``"all"`` too: a
    default of ``--tasks`` never goes through :func:`_ids`)."""
    return None if any(v is None or v == "all" for v in values) else [int(v) for v in values]


@register_command("demos", help=DEMOS_HELP, add_arguments=_add_demos_arguments)
def _run_demos(args: argparse.Namespace) -> int:
    """``embodied-rl demos``: the parsed options, passed on to the command's implementation."""
    from simulators.libero.demos_cli import demos_command  # here: see the module docstring

    return demos_command(
        suite=args.suite,
        tasks=_all_or_ids(args.tasks),
        init_states=_all_or_ids(args.init_states),
        out=args.out,
        image_size=args.image_size,
        report=args.report,
        resume=args.resume,
        progress=not args.no_progress,
        overwrite=args.overwrite,
        videos=args.videos,
        processes=args.processes,
    )
