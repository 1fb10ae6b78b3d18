"""``embodied-rl``: train, validate and plan runs from hydra-composed configs.

Examples:
    embodied-rl train --config-name grpo_llm trainer.total_steps=5
    embodied-rl validate --config-name grpo_llm workers.num_workers=4
    embodied-rl plan --config-name grpo_llm
    embodied-rl eval --config-name srpo_reach run_dir=outputs/srpo_reach/<run>
    embodied-rl demos --suite libero_object --tasks 0 1 --init-states 0 --out demos/libero_object
    embodied-rl export outputs/srpo_reach/<run> --out exported/srpo_reach
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from embodied_rl._startup import is_console_script, restore_default_interrupts
from embodied_rl.dag.node_type import NodeConfigError
from embodied_rl.dag.spec import DagValidationError
from embodied_rl.registry import COMMAND_PLUGINS, COMMANDS, UnknownNameError, load_plugins
from embodied_rl.runtime.config import CONFIG_DIR, ConfigError, compose, validate_config
from embodied_rl.runtime.config_compose import one_line

# What workers print reaches this console through Ray: rank 0's step lines, warnings, errors.
# Ray reads these when it is imported (a value the user set wins): no "(DAGWorker pid=...)"
# prefix in colour on every line, and no deduplication, which holds back a line that several
# workers print for seconds, then appends "[repeated Nx across cluster]" and a tip.
RAY_CONSOLE_ENV = {"RAY_DISABLE_WORKER_LOG_PREFIX": "1", "RAY_DEDUP_LOGS": "0"}

USER_ERRORS = (
    ConfigError,
    DagValidationError,
    NodeConfigError,
    UnknownNameError,
    FileNotFoundError,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embodied-rl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {
        "train": "run (or with resume=true continue) a training job",
        "validate": "check the config and DAG without building models or starting Ray",
        "plan": "print each worker's ordered steps, data-parallel ranks and process groups, "
        "and on which Ray node each rank runs",
        "eval": "run the evaluation DAG once on a run's newest checkpoint (videos, report)",
    }
    for name, text in helps.items():
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--config-name", "-c", required=True, help="a YAML file in configs/")
        cmd.add_argument("--config-dir", default=None, help=f"default: {CONFIG_DIR}")
        cmd.add_argument("overrides", nargs="*", help="hydra overrides, e.g. trainer.total_steps=5")
        if name in ("train", "eval"):
            cmd.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_plugin_parsers(sub)
    _add_export_parser(sub)
    return parser


def _add_plugin_parsers(sub: argparse._SubParsersAction) -> None:
    """A subparser for every command a plugin package registers (``COMMANDS``), which adds
    its own options; the plugins are imported by name, as for node types."""
    load_plugins(COMMAND_PLUGINS)
    for name in COMMANDS.names():
        command = COMMANDS.get(name)
        cmd = sub.add_parser(name, help=command.help, description=command.help)
        command.add_arguments(cmd)


def _run_plugin(name: str, args: argparse.Namespace) -> int:
    """Run the registered command ``name``; a package it needs but cannot import (LIBERO for
    ``demos``) is a one-line error that says to install it."""
    try:
        return COMMANDS.get(name).run(args)
    except ImportError as err:  # its message names the missing package
        raise ConfigError(
            f"embodied-rl {name} cannot run: {one_line(err)}",
            "install the package the message names",
        ) from None


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    text = (
        "write a run's policy in the Hugging Face layout (config.json, model.safetensors, "
        "normalisation statistics, tokenizer) with a model card, loadable without the run"
    )
    cmd = sub.add_parser("export", help=text, description=text)
    cmd.add_argument("run", help="the run folder (outputs/<config>/<run>)")
    cmd.add_argument("--out", required=True, help="the export folder (new or empty)")
    cmd.add_argument(
        "--step", type=int, default=None, help="the checkpoint's step (default: the newest)"
    )
    cmd.add_argument(
        "--critic", action="store_true", help="also export models.critic into <out>/critic"
    )
    cmd.add_argument("--force", action="store_true", help="replace --out when it is not empty")


def _run_export(args: argparse.Namespace) -> int:
    """``embodied-rl export``: print what was written and how it loads."""
    from embodied_rl.export.run import export_run

    result = export_run(args.run, args.out, step=args.step, critic=args.critic, force=args.force)
    for model in result.models:
        print(f"exported {model.role} (models.{model.model}, {model.policy}) to {model.folder}")
    print(
        f"checkpoint: {result.checkpoint} (step {result.step}); model card: {result.out}/README.md"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside a run (a run's own Ctrl-C is RunFailed, exit 130)
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if is_console_script():
        restore_default_interrupts()  # from here: KeyboardInterrupt, caught in main
    for name, value in RAY_CONSOLE_ENV.items():
        os.environ.setdefault(name, value)
    try:
        if args.command in COMMANDS:
            return _run_plugin(args.command, args)
        if args.command == "export":
            return _run_export(args)
        cfg = compose(args.config_name, args.overrides, args.config_dir)
        if args.command == "validate":
            dag = validate_config(cfg)
            print(f"OK: {args.config_name}: {len(dag.nodes)} nodes on {dag.num_workers} worker(s)")
            return 0
        from embodied_rl.launch.launcher import launch
        from embodied_rl.launch.outcome import RunFailed
        from embodied_rl.launch.ray_setup import preview_placement

        if args.command == "plan":
            from embodied_rl.dag.planner import format_plan, plan_dag

            dag = validate_config(cfg)
            print(format_plan(dag, plan_dag(dag)))
            try:
                print(preview_placement(cfg))
            except RunFailed as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
            return 0

        mode = "eval" if args.command == "eval" else "train"
        if mode == "eval" and not cfg.get("eval_dag"):
            raise ConfigError(
                f"{args.config_name} has no eval_dag", "add 'eval_dag: env' to its defaults"
            )
        try:  # launch validates the config first (once: its warnings print once)
            command = shlex.join(["embodied-rl", *(sys.argv[1:] if argv is None else argv)])
            result = launch(cfg, show_progress=not args.no_progress, mode=mode, command=command)
        except RunFailed as err:
            print(f"error: {err}", file=sys.stderr)
            return err.exit_code  # 130 after Ctrl-C, 143 after SIGTERM (as a shell reports)
        done = "evaluation written to" if mode == "eval" else "run finished"
        print(f"{done}: {result.run_dir}")
        shown = {
            k: round(v, 4)
            for k, v in sorted(result.final_metrics.items())
            if "/" in k and not k.startswith("time/")
        }
        print("final metrics: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        for name, record in sorted(result.trackers.items()):
            print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(record.items())))
        return 0
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # hydra's override errors carry the useful message
        if type(err).__module__.startswith(("hydra", "omegaconf")):
            print(f"error: {err}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
