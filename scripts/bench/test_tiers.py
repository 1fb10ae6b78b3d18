"""Run a pytest tier and write its dated summary: every test's outcome and minutes.

    .venv/bin/python scripts/bench/test_tiers.py slow      # the slow tier (learning runs)
    .venv/bin/python scripts/bench/test_tiers.py default   # the tier CI runs (plain pytest)
    .venv/bin/python scripts/bench/test_tiers.py default --junit run.xml --command "..."
                                                           # summarise a finished run

Writes ``docs/testing/<tier>_tier.json`` (machine, commit, date, command, totals, one row per
test) and ``docs/testing/<tier>_tier.md`` (the totals, the failures, the slowest tests and the
minutes per module), and prints the tables. The run's pytest exit status is recorded, so a
summary never says "passed" for a run that failed or collected nothing. pytest's own
``--junitxml`` report is the source: a testcase's ``time`` is its setup, call and teardown
together, so a module-scoped fixture's cost lands on the first test that uses it.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import common

OUT_DIR = common.REPO_ROOT / "docs" / "testing"
TIER_MARKERS = {"slow": "slow", "default": None}  # None: pyproject's addopts (-m 'not slow')
SLOWEST = 30


@dataclass(frozen=True)
class TestRow:
    """One testcase of a junit report: ``test`` is its pytest node id."""

    test: str
    outcome: str  # passed | failed | error | skipped
    seconds: float

    @property
    def module(self) -> str:
        return self.test.split("::", 1)[0]


def read_junit(path: Path) -> list[TestRow]:
    """The testcases of pytest's ``--junitxml`` report, as node ids with outcome and time."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        # classname is "tests.x.test_y" or "tests.x.test_y.TestClass": the file is the part
        # that exists as a .py file, the rest is the class.
        parts = module.split("/")
        for cut in range(len(parts), 0, -1):
            if (common.REPO_ROOT / ("/".join(parts[:cut]) + ".py")).is_file():
                node = "/".join(parts[:cut]) + ".py" + "".join(f"::{p}" for p in parts[cut:])
                break
        else:
            node = module
        rows.append(TestRow(f"{node}::{case.get('name')}", _outcome(case), _seconds(case)))
    return rows


def _outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return {"failure": "failed"}.get(tag, tag)
    return "passed"


def _seconds(case: ET.Element) -> float:
    return float(case.get("time") or 0.0)


def summarise(rows: Sequence[TestRow], exit_status: int, wall_s: float) -> dict:
    """Totals of a run: counts by outcome, minutes, and whether the tier passed."""
    counts: dict[str, int] = defaultdict(int)
    for row in rows:
        counts[row.outcome] += 1
    bad = counts.get("failed", 0) + counts.get("error", 0)
    ran = counts.get("passed", 0) + bad
    return {
        "passed": exit_status == 0 and ran > 0 and bad == 0,
        "pytest_exit_status": exit_status,
        "counts": dict(sorted(counts.items())),
        "wall_minutes": round(wall_s / 60, 2),
        "test_minutes": round(sum(r.seconds for r in rows) / 60, 2),
    }


def module_minutes(rows: Sequence[TestRow]) -> list[dict]:
    """Minutes per test module, largest first."""
    totals: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        totals[row.module].append(row.seconds)
    ordered = sorted(totals.items(), key=lambda item: -sum(item[1]))
    return [{"module": m, "tests": len(s), "minutes": round(sum(s) / 60, 2)} for m, s in ordered]


def markdown(tier: str, command: str, summary: dict, rows: Sequence[TestRow]) -> str:
    """The summary page: totals, failures, slowest tests, minutes per module."""
    machine = common.machine_info()
    status = "passed" if summary["passed"] else "FAILED"
    lines = [
        f"# The {tier} test tier: {status} ({summary['wall_minutes']:.1f} minutes)",
        "",
        f"Run on {machine['date']} at commit `{machine['commit']}` on {machine['cores']} cores "
        f"({machine['cpu']}), by `scripts/bench/test_tiers.py`:",
        "",
        f"    {command}",
        "",
        "Tests by outcome: "
        + ", ".join(f"{n} {k}" for k, n in summary["counts"].items())
        + f"; pytest exit status {summary['pytest_exit_status']}.",
        "",
    ]
    failed = [r for r in rows if r.outcome in ("failed", "error")]
    if failed:
        lines += ["## Failed", "", *(f"- `{r.test}` ({r.outcome})" for r in failed), ""]
    lines += ["## Slowest tests", "", _table(_slowest_rows(rows)), ""]
    lines += ["## Minutes per module", "", _table(module_minutes(rows)), ""]
    return "\n".join(lines)


def _slowest_rows(rows: Sequence[TestRow]) -> list[dict]:
    ordered = sorted(rows, key=lambda r: -r.seconds)[:SLOWEST]
    return [
        {"test": f"`{r.test}`", "outcome": r.outcome, "seconds": round(r.seconds, 1)}
        for r in ordered
    ]


def _table(rows: Sequence[dict]) -> str:
    if not rows:
        return "(none)"
    return common.print_table(rows)


def run_tier(tier: str, junit: Path) -> tuple[str, int, float]:
    """Run the tier's pytest (this interpreter's, from the repository root); returns the
    command as a user would type it, its exit status and wall seconds."""
    selection = [] if TIER_MARKERS[tier] is None else ["-m", TIER_MARKERS[tier]]
    argv = [sys.executable, "-m", "pytest", *selection]
    start = time.monotonic()
    status = subprocess.run([*argv, f"--junitxml={junit}"], cwd=common.REPO_ROOT).returncode
    shown = [".venv/bin/python", "-m", "pytest", *selection]
    return shlex.join(shown), status, time.monotonic() - start


def write_summary(tier: str, command: str, status: int, wall_s: float, junit: Path) -> Path:
    rows = read_junit(junit)
    summary = summarise(rows, status, wall_s)
    payload = {
        "tier": tier,
        "command": command,
        **summary,
        "tests": [asdict(r) for r in rows],
    }
    common.write_results(f"{tier}_tier", payload, OUT_DIR)
    page = OUT_DIR / f"{tier}_tier.md"
    page.write_text(markdown(tier, command, summary, rows))
    print(f"wrote {page}", flush=True)
    return page


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tier", choices=sorted(TIER_MARKERS))
    parser.add_argument("--junit", type=Path, help="summarise this finished run's junit XML")
    parser.add_argument("--command", help="with --junit: the command that ran it")
    parser.add_argument("--status", type=int, default=0, help="with --junit: its exit status")
    parser.add_argument("--wall-minutes", type=float, help="with --junit: its wall time")
    args = parser.parse_args(argv)
    if args.junit is not None:
        if not args.command or args.wall_minutes is None:
            parser.error("--junit needs --command and --wall-minutes (what the summary records)")
        write_summary(args.tier, args.command, args.status, args.wall_minutes * 60, args.junit)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command, status, wall_s = run_tier(args.tier, junit)
        if not junit.is_file():
            print(f"error: pytest wrote no report (exit status {status})", file=sys.stderr)
            return status or 1
        write_summary(args.tier, command, status, wall_s, junit)
    return status


if __name__ == "__main__":
    sys.exit(main())
