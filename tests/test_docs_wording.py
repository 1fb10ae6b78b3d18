"""The documentation reads as a reference, not as a notebook of the people who wrote it.

README.md, BENCHMARKS.md, RELIABILITY.md and every docs/**/*.md may not use, in prose:

- the first person: the whole words *we*, *our*, *ours*, *ourselves*, *us* (not the unit after
  a number, ``40 us``) and *let's*, in any case; *I* as a pronoun (a capital I standing alone:
  ``I/O`` and ``i`` in a formula are no pronouns);
- the writers' working time: the words of ``_WORKING_TIME`` below, in any case.

Fenced code blocks, inline code and link targets are not prose and are not read. Each finding
names ``file:line``, the phrase and the line. The checker is a pure function of a text, tested
on one whose findings are known.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONT_PAGES = ("README.md", "BENCHMARKS.md", "RELIABILITY.md")

_FIRST_PERSON = r"\b(?:we|our|ours|ourselves|let['’]s)\b|(?<![\d.])(?<![\d.] )\bus\b"
_WORKING_TIME = r"\b(?:sessions?|sittings?|this\s+turn)\b"
PHRASES = re.compile(f"{_FIRST_PERSON}|{_WORKING_TIME}", re.IGNORECASE)
PRONOUN_I = re.compile(r"(?<![\w/-])I(?=['’]|\s|[,;:!?)]|$)")

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")


def documentation_files(root: Path) -> list[Path]:
    """The front pages that exist and every Markdown file below docs/."""
    pages = [root / name for name in FRONT_PAGES if (root / name).is_file()]
    return pages + sorted((root / "docs").rglob("*.md"))


def prose_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, prose)`` of a Markdown text: fenced blocks dropped, code spans and link
    targets blanked out (so a phrase cannot be joined across them)."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            prose = _LINK_TARGET.sub("] ", _CODE_SPAN.sub(" ", line))
            lines.append((number, prose))
    return lines


def wording_findings(text: str) -> list[tuple[int, str]]:
    """``(line number, phrase)`` of every notebook phrase in the prose of ``text``."""
    found = []
    for number, prose in prose_lines(text):
        hits = [(m.start(), m[0]) for m in PHRASES.finditer(prose)]
        hits += [(m.start(), m[0]) for m in PRONOUN_I.finditer(prose)]
        found += [(number, " ".join(phrase.split())) for _, phrase in sorted(hits)]
    return found


def repository_findings(root: Path) -> list[str]:
    """``file:line: 'phrase': the line`` for every finding in the documentation files."""
    report = []
    for path in documentation_files(root):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for number, phrase in wording_findings(text):
            where = f"{path.relative_to(root).as_posix()}:{number}"
            report.append(f"{where}: {phrase!r}: {lines[number - 1].strip()[:160]}")
    return report


# --- the rule on the repository -------------------------------------------------------------


def test_the_documentation_has_no_notebook_wording():
    files = documentation_files(ROOT)
    assert len(files) >= 6 and ROOT / "README.md" in files, "too few files found: broken walk"
    findings = repository_findings(ROOT)
    assert not findings, (
        f"{len(findings)} notebook phrases in the documentation (write for a reader of the "
        "project: no first person, no mention of sessions or sittings):\n" + "\n".join(findings)
    )


# --- the checker on a text whose findings are known -----------------------------------------


def test_the_checker_finds_each_phrase_and_nothing_in_code_or_link_targets():
    text = textwrap.dedent(
        """\
        We measured it; our table shows Ours.
        Let's see: the speed is 40 us, which costs us time.
        I think so, and I'm sure; I/O and x_i and i are fine, as is Iris.
        This session, two Sittings ago, and This  Turn.
        (a line without any)
        `we` and ``our session`` in code, [a link](../sessions/we.md) target.

        ```
        we our us session I
        ```
        ~~~python
        # let's
        ~~~
        Weather, user, ourselves, sessional, westward.
        """
    )
    assert wording_findings(text) == [
        (1, "We"),
        (1, "our"),
        (1, "Ours"),
        (2, "Let's"),
        (2, "us"),
        (3, "I"),
        (3, "I"),
        (4, "session"),
        (4, "Sittings"),
        (4, "This Turn"),
        (14, "ourselves"),
    ]
