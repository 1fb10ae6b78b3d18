"""The command the ``policies`` package adds to ``embodied-rl``: ``inspect``.

Registered when the CLI imports its command plugins (``embodied_rl.registry.COMMAND_PLUGINS``);
the implementation, :mod:`policies.inspect_folder`, is imported only when the command runs.
"""

from __future__ import annotations

import argparse

from embodied_rl.registry import register_command

INSPECT_HELP = (
    "say what a checkpoint or run folder holds (policy, head, proprio, images, statistics, "
    "parameters) and print the overrides that train or evaluate it"
)


def _add_inspect_arguments(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("folder", help="a checkpoint folder (Hugging Face layout) or a run folder")


@register_command("inspect", help=INSPECT_HELP, add_arguments=_add_inspect_arguments)
def _run_inspect(args: argparse.Namespace) -> int:
    """``embodied-rl inspect``: the description of ``args.folder`` on stdout."""
    from policies.inspect_folder import describe

    print(describe(args.folder).text())
    return 0
