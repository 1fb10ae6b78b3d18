"""Write the text tasks' train/test JSONL files (fields ``prompt``, ``answer``).

Usage (from the repository root)::

    python scripts/make_arithmetic_data.py   # assets/data/{arithmetic,running_sum,echo}_{train,test}.jsonl

The output is deterministic in ``--seed``; test rows never appear in the train file. The
running-sum and echo rows are multi-turn episodes (``embodied_rl/tasks/``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    from embodied_rl.tasks.arithmetic import make_splits, write_jsonl
    from embodied_rl.tasks.echo import generate_echo_episodes
    from embodied_rl.tasks.running_sum import generate_episodes
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))
    from embodied_rl.tasks.arithmetic import make_splits, write_jsonl
    from embodied_rl.tasks.echo import generate_echo_episodes
    from embodied_rl.tasks.running_sum import generate_episodes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "assets" / "data")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    train, test = make_splits(args.n_train, args.n_test, args.seed)
    write_jsonl(args.out_dir / "arithmetic_train.jsonl", train)
    write_jsonl(args.out_dir / "arithmetic_test.jsonl", test)
    print(f"wrote {len(train)} train and {len(test)} test problems to {args.out_dir}")
    episodes = generate_episodes(args.n_train + args.n_test, args.seed)
    write_jsonl(args.out_dir / "running_sum_train.jsonl", episodes[: args.n_train])
    write_jsonl(args.out_dir / "running_sum_test.jsonl", episodes[args.n_train :])
    print(f"wrote {args.n_train} train and {args.n_test} test running-sum episodes")
    echo = generate_echo_episodes(args.n_train + args.n_test, args.seed)
    write_jsonl(args.out_dir / "echo_train.jsonl", echo[: args.n_train])
    write_jsonl(args.out_dir / "echo_test.jsonl", echo[args.n_train :])
    print(f"wrote {args.n_train} train and {args.n_test} test echo episodes")


if __name__ == "__main__":
    main()
