"""DAG validation problems: one :class:`DagIssue` per problem, all raised together.

Every check of the DAG appends to one list of issues instead of raising, so
``validate_dag`` (``embodied_rl.dag.spec``) can report every problem in one
:class:`DagValidationError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DagIssue:
    """One validation problem: ``node`` is ``None`` for problems of the whole DAG; ``kind``
    says what ``node`` names (a ``node`` or a ``branch``)."""

    node: str | None
    problem: str
    fix: str
    kind: str = "node"

    def __str__(self) -> str:
        where = f"{self.kind} {self.node!r}: " if self.node is not None else "dag: "
        return f"{where}{self.problem}. Fix: {self.fix}"


class DagValidationError(ValueError):
    """The DAG cannot run; ``issues`` lists every problem found."""

    def __init__(self, issues: Sequence[DagIssue]) -> None:
        self.issues = list(issues)
        if len(self.issues) == 1:  # one problem: one line, like every other input error
            super().__init__(f"invalid DAG: {self.issues[0]}")
            return
        lines = "\n".join(f"  - {issue}" for issue in self.issues)
        super().__init__(f"invalid DAG ({len(self.issues)} problem(s)):\n{lines}")


def suggest(name: str, options: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def is_int(value: Any) -> bool:
    """An int that is not a bool (YAML ``true`` must not pass as a worker count)."""
    return isinstance(value, int) and not isinstance(value, bool)
