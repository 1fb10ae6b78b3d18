"""Every number of the Results tables of README.md and BENCHMARKS.md is in a committed JSON.

Each row's ``data`` cell links the JSON file(s) under docs/benchmarks/ that a ``scripts/bench``
script wrote, and every number of its ``number (spread)`` cell must be found in them: a rerun
whose JSON changed fails here until the row is updated. Columns are found by header name.

Reading a cell (:func:`shown_numbers`). Bold is dropped; digits inside a word (``libero_10``,
``Qwen2``, ``last-10``) are no numbers. Left out, as no measurement of the row:

1. code spans (a config or module name);
2. targets and their verdicts: from ``target``, ``>=``, ``>`` or ``<`` to the end of the clause
   (``;``, ``)`` or the cell's end), as in ``(target 1.5x: met)`` and ``(>= 2x: 8 of 8 rows)``;
3. former values, from ``was`` to the end of the clause: ``(was about +76 MB/step)``;
4. counts of rows or runs, ``k of n``: ``5 of 5 rows``;
5. the run's set-up: a number before a set-up noun (``8 obs``, ``2000 steps``, ``4 groups``, also
   with a pair in front: ``1 -> 2 processes``, ``1 / 2 simulators``, ``4 on 2 cores``), or an
   integer after ``task``, ``step`` or ``at``, a number after ``lr`` or ``temperature``, and
   ``from 4 to 16``.

A range ``2.1-4.6x`` gives two numbers, both with the suffix; in ``3 -> 8/10`` and
``5.3 -> 13.4 ms`` the first number shares the second's denominator or unit. A number stands
for the values that round to it (``0.139``: 0.1385 to 0.1395; ``2.32e+03``: 2315 to 2325);
trailing zeros of an integer with a thousands separator are not significant (``3,190``: +- 5),
and the ends of a range may also be rounded outward (``55-60%`` holds 0.557 and 0.591).

Matching (:func:`is_backed`): a number is in a JSON file when one of these holds, and each
number of a row must be in one of the files its data cell links.

1. A numeric leaf equals it; for a number in ``ms`` the leaf may be in seconds, for one in
   ``B`` a count (``0.059B``: 59,037,068).
2. A percentage: a leaf equals it / 100 (the JSONs keep fractions; read as percentages,
   leaves would let ``0%`` and ``1%`` match most fractions); ``points``: a leaf equals it, or
   it / 100.
3. A fraction ``k/n``: a leaf equals k/n, a string leaf reads ``"k/n"``, or one object holds
   both k and n (``{"successes": 45, "episodes": 50}``).
4. A difference (a signed plain number: ``+0.18``), ``points``, a ratio (``2.91x``) or a
   percentage is ``a - b``, ``100 (a - b)``, ``a / b`` or ``100 a / b`` of two numeric fields
   ``a`` and ``b`` of one object (``-38%``: ``change_mb / before_mb``). A series (a list of
   numbers) takes no part.

A list of objects counts as one more object too: its totals, each key summed over the list
(the planner's 457/500 and 91.4% are ``successes`` and ``episodes`` summed over its tasks).

A row whose result has no committed JSON (a run read from its logs, a command timed by hand)
states it in words, with no number, and its study page keeps the numbers: its data cell is
``-`` and its number cell must hold no number that :func:`shown_numbers` reads.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE_PAGES = ("README.md", "BENCHMARKS.md")
RESULT, NUMBER, DATA = "result", "number (spread)", "data"

# --- the tables ----------------------------------------------------------------------------


def results_table(markdown: str) -> list[dict[str, str]]:
    """The rows of the first table under ``## Results``, each a dict keyed by header name."""
    lines = markdown.splitlines()
    table: list[list[str]] = []
    for line in lines[lines.index("## Results") + 1 :]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table or line.startswith("## "):
            break
    header, _rule, *rows = table
    return [dict(zip(header, row)) for row in rows]


_JSON_LINK = re.compile(r"\]\(([^)\s]+\.json)\)")


def data_links(cell: str) -> list[str]:
    """The JSON paths a ``data`` cell links, relative to its page."""
    return _JSON_LINK.findall(cell)


# --- the numbers of a cell -----------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """A number as a table shows it.

    Attributes:
        text: the term it was read from (``2.91x``, ``45/50``, ``+34 points``, ``2.1-4.6x``,
            ``13.4 ms``).
        value: its value; for a fraction ``k/n`` the k.
        low: the smallest value that reads as it (``0.139``: 0.1385).
        high: the largest (``0.139``: 0.1395).
        kind: ``plain``, ``percent``, ``points``, ``ratio`` or ``fraction``.
        signed: written with ``+`` or ``-``: a difference, or a negative value.
        denominator: the n of a fraction ``k/n``.
        unit: ``ms`` or ``B`` (billions) after it, or "".
    """

    text: str
    value: float
    low: float
    high: float
    kind: str = "plain"
    signed: bool = False
    denominator: int | None = None
    unit: str = ""


_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[+-]?\d+)?"
_TERM = re.compile(
    rf"(?<![\w.-])(?P<sign>[+-])?(?P<a>{_NUM})(?:-(?P<b>{_NUM}))?(?:/(?P<den>\d+))?"
    r"(?P<suffix>%|x(?![A-Za-z])|\s+points\b)?(?:\s?(?P<unit>ms|B)\b)?"
)
_SETUP_NOUNS = r"obs|steps|groups|demos|simulators|processes|videos|cores|workers"
_NOT_MEASURED = (
    re.compile(r"`[^`]*`"),
    re.compile(r"(?:\btarget\b|>=|(?<!-)>|<)[^;)]*"),
    re.compile(r"\bwas\b[^;)]*"),
    re.compile(r"\b\d+ of \d+\b"),
    re.compile(rf"(?:\b\d+\s*(?:->|/|on)\s*)?\b\d+\s+(?:{_SETUP_NOUNS})\b"),
    re.compile(r"\b(?:task|step|at)\s+\d+\b(?![.,]\d)"),
    re.compile(rf"\b(?:lr|temperature)\s+(?:{_NUM})(?:-(?:{_NUM}))?"),
    re.compile(r"\bfrom \d+ to \d+\b"),
)
_SHARED_SUFFIX = re.compile(r"(?<![/\d.])(\d+(?:\.\d+)?) -> (\d+(?:\.\d+)?)(/\d+| ms\b)")


def measured_text(cell: str) -> str:
    """The cell without bold and without the parts that are no measurements of the row."""
    text = cell.replace("**", "")
    for pattern in _NOT_MEASURED:
        text = pattern.sub(" ", text)
    return _SHARED_SUFFIX.sub(r"\1\3 -> \2\3", text)


def _half_unit(number: str) -> float:
    """Half a unit of the last significant digit of ``number`` (``2.32e+03``: 5)."""
    mantissa, _, exponent = number.partition("e")
    whole, _, decimals = mantissa.partition(".")
    zeros = len(whole) - len(whole.rstrip("0")) if "," in whole and not decimals else 0
    return 0.5 * 10.0 ** (int(exponent or 0) - len(decimals) + zeros)


def _shown(term: re.Match[str], number: str, end: str) -> Shown:
    """One number of a term; ``end`` is ``low`` or ``high`` for the ends of a range, else ""."""
    sign = "" if end == "high" else term["sign"] or ""
    suffix = (term["suffix"] or "").strip()
    kind = {"%": "percent", "points": "points", "x": "ratio"}.get(suffix, "plain")
    kind = "fraction" if term["den"] else kind
    value = float(number.replace(",", "")) * (-1.0 if sign == "-" else 1.0)
    half = _half_unit(number)
    low = value - (2 * half if end == "high" else half)  # a high end may be rounded up
    high = value + (2 * half if end == "low" else half)  # a low end may be rounded down
    text = term.group(0).strip()
    den = int(term["den"]) if term["den"] else None
    return Shown(text, value, low, high, kind, bool(sign), den, term["unit"] or "")


def shown_numbers(cell: str) -> list[Shown]:
    """Every measured number of a ``number (spread)`` cell, in order; a range gives two."""
    numbers = []
    for term in _TERM.finditer(measured_text(cell)):
        if term["b"]:
            numbers += [_shown(term, term["a"], "low"), _shown(term, term["b"], "high")]
        else:
            numbers.append(_shown(term, term["a"], ""))
    return numbers


# --- the JSON ------------------------------------------------------------------------------


@dataclass
class Leaves:
    """The leaves of a JSON document, grouped for the matching rules.

    Attributes:
        values: every numeric leaf, sorted (booleans and NaN are no numbers).
        strings: every string leaf.
        objects: the numeric fields of each object, and the totals of each list of objects.
    """

    values: list[float] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)
    objects: list[list[float]] = field(default_factory=list)


def _is_number(value: object) -> bool:
    """A JSON number: not a boolean, not NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _totals(items: list[object]) -> list[float]:
    """Each numeric key summed over the objects of a list."""
    sums: dict[str, float] = {}
    for item in items:
        for key, value in item.items() if isinstance(item, dict) else ():
            if _is_number(value):
                sums[key] = sums.get(key, 0.0) + value
    return list(sums.values())


def _collect(node: object, leaves: Leaves) -> None:
    """Add the leaves below ``node`` to ``leaves``."""
    if isinstance(node, dict):
        leaves.objects.append([float(v) for v in node.values() if _is_number(v)])
        for child in node.values():
            _collect(child, leaves)
    elif isinstance(node, list):
        leaves.objects.append(_totals(node))
        for child in node:
            _collect(child, leaves)
    elif isinstance(node, str):
        leaves.strings.add(node)
    elif _is_number(node):
        leaves.values.append(float(node))


def json_leaves(document: object) -> Leaves:
    """The leaves of a parsed JSON document."""
    leaves = Leaves()
    _collect(document, leaves)
    leaves.values.sort()
    return leaves


@functools.cache
def load_leaves(path: Path) -> Leaves:
    """:func:`json_leaves` of a JSON file, read once."""
    return json_leaves(json.loads(path.read_text()))


# --- matching ------------------------------------------------------------------------------


def _any_within(sorted_values: list[float], low: float, high: float) -> bool:
    """Whether some value of a sorted list lies in [low, high]."""
    i = bisect.bisect_left(sorted_values, low)
    return i < len(sorted_values) and sorted_values[i] <= high


def _field_pairs(leaves: Leaves) -> Iterator[tuple[float, float]]:
    """Every ordered pair of two numeric fields of one object (list totals included)."""
    for fields in leaves.objects:
        for i, a in enumerate(fields):
            for j, b in enumerate(fields):
                if i != j:
                    yield a, b


def _quotient(a: float, b: float) -> float:
    """a / b; NaN (inside no interval) for b = 0."""
    return a / b if b else float("nan")


_UNIT_SCALE = {"ms": 1e-3, "B": 1e9}


_KIND_SCALES = {"percent": [0.01], "points": [1.0, 0.01]}


def _leaf_rule(shown: Shown, leaves: Leaves) -> bool:
    """Rules 1 and 2: a leaf equals the number, scaled by its unit or as a fraction."""
    scales = _KIND_SCALES.get(shown.kind, [1.0, _UNIT_SCALE.get(shown.unit, 1.0)])
    return any(_any_within(leaves.values, shown.low * s, shown.high * s) for s in scales)


def _fraction_rule(shown: Shown, leaves: Leaves) -> bool:
    """Rule 3: k/n as a value, as the string "k/n", or as k and n in one object."""
    k, n = shown.value, shown.denominator
    if n is None:
        return False
    if _any_within(leaves.values, k / n - 1e-9, k / n + 1e-9):
        return True
    if f"{k:g}/{n}" in leaves.strings:
        return True
    return any((a, b) == (k, n) for a, b in _field_pairs(leaves))


_FIELD_OPS: dict[str, Callable[[float, float], float]] = {
    "difference": lambda a, b: a - b,
    "points": lambda a, b: 100 * (a - b),
    "ratio": _quotient,
    "percent": lambda a, b: 100 * _quotient(a, b),
}


def _field_rule(shown: Shown, leaves: Leaves) -> bool:
    """Rule 4: a difference, points, a ratio or a percentage of two fields of one object."""
    kind = "difference" if shown.kind == "plain" and shown.signed else shown.kind
    op = _FIELD_OPS.get(kind)
    return op is not None and any(
        shown.low <= op(a, b) <= shown.high for a, b in _field_pairs(leaves)
    )


def is_backed(shown: Shown, leaves: Leaves) -> bool:
    """Whether a JSON file's leaves hold ``shown`` by one of the module's matching rules."""
    rules = (_leaf_rule, _fraction_rule, _field_rule)
    return any(rule(shown, leaves) for rule in rules)


# --- findings ------------------------------------------------------------------------------


def row_findings(page: str, row: dict[str, str], root: Path = ROOT) -> list[str]:
    """What is wrong with one row of ``page``'s Results table: one message per problem."""
    where = f"{page}, Results row '{row[RESULT]}'"
    links = data_links(row.get(DATA, ""))
    if not links:
        shown = ", ".join(repr(number.text) for number in shown_numbers(row[NUMBER]))
        return (
            [
                f"{where}: its data cell links no JSON but it shows {shown}; its numbers need a "
                "committed JSON written by a scripts/bench script, linked from the row's data "
                "cell, or the row states its result in words and its study page keeps the numbers"
            ]
            if shown
            else []
        )
    paths = [(root / page).parent / link for link in links]
    missing = [link for link, path in zip(links, paths) if not path.is_file()]
    if missing:
        return [f"{where}: its data cell links {', '.join(missing)}, which does not exist"]
    files = [load_leaves(path.resolve()) for path in paths]
    return [
        f"{where}: {shown.text!r} is in none of {', '.join(links)}; update the row from the "
        "JSON, or rerun the JSON's benchmark (its scripts/bench script) and commit the JSON"
        for shown in shown_numbers(row[NUMBER])
        if not any(is_backed(shown, leaves) for leaves in files)
    ]


def table_findings(page: str, markdown: str, root: Path = ROOT) -> list[str]:
    """:func:`row_findings` of every row of a page's Results table."""
    return [finding for row in results_table(markdown) for finding in row_findings(page, row, root)]


def _all_rows() -> list[tuple[str, dict[str, str]]]:
    """(page, row) for every row of both Results tables."""
    return [(page, row) for page in TABLE_PAGES for row in results_table((ROOT / page).read_text())]


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("page", TABLE_PAGES)
def test_the_results_table_has_the_columns_read_here(page: str) -> None:
    """Both tables keep the columns this module reads, found by name."""
    rows = results_table((ROOT / page).read_text())
    assert rows and all({RESULT, NUMBER, DATA} <= set(row) for row in rows), page


@pytest.mark.parametrize(
    ("page", "row"),
    _all_rows(),
    ids=[f"{page}:{row[RESULT][:48]}" for page, row in _all_rows()],
)
def test_every_number_of_a_row_is_in_its_json(page: str, row: dict[str, str]) -> None:
    """A row's numbers are all in the JSON(s) of its data cell; a row without one shows none."""
    findings = row_findings(page, row)
    assert not findings, "\n".join(findings)


@pytest.mark.parametrize(
    ("page", "old", "new", "number"),
    [
        ("README.md", "**2.91x faster**", "**2.95x faster**", "2.95x"),
        ("BENCHMARKS.md", "**2.91x faster**", "**2.95x faster**", "2.95x"),
        ("BENCHMARKS.md", "at step 1 (-38%)**", "at step 1 (-40%)**", "-40%"),
        ("README.md", "libero_spatial **457/500**", "libero_spatial **458/500**", "458/500"),
    ],
)
def test_a_changed_number_is_the_one_finding(page: str, old: str, new: str, number: str) -> None:
    """One number changed in a copy of a table is reported, with its table and row, and nothing
    else is."""
    markdown = (ROOT / page).read_text()
    assert markdown.count(old) == 1, old
    findings = table_findings(page, markdown.replace(old, new))
    assert len(findings) == 1, findings
    assert f"{page}, Results row '" in findings[0] and f"'{number}'" in findings[0], findings
    assert "update the row from the JSON, or rerun the JSON's benchmark" in findings[0]


def test_a_row_without_data_asks_for_a_committed_json() -> None:
    """A row whose data cell links nothing fails when it shows a number, saying where its
    numbers must come from; stated in words (``2 seeds`` is no number of the result), it
    passes."""
    head = "## Results\n\n| result | number (spread) | data |\n|---|---|---|\n"
    (finding,) = table_findings("PAGE.md", head + "| r | **7.4 min** | - |\n")
    assert "PAGE.md, Results row 'r'" in finding and "shows '7.4'" in finding
    assert "committed JSON written by a scripts/bench script" in finding
    words = "| r | **no held-out gain**, on the study page from the run's logs | - |\n"
    assert table_findings("PAGE.md", head + words) == []


def test_shown_numbers_reads_each_form() -> None:
    """Every number form of the tables, and the set-up, targets and counts left out."""
    cell = (
        "**56% -> 90% (45/50), +34 points** (target +20 in 2 h: met); 2.1-4.6x (>= 2x: 8 of 8 "
        "rows); -0.0108 to +0.00927 MB/step; peak 71,969 MB; 2.32e+03 tokens/s; "
        "0.70 +- 0.10; `mlp_image` 3 -> 8/10; task 4: 16/50; libero_10 0%; 3,190; 0.059B "
        "per 8 obs; 5.3 -> 13.4 ms; lr 1e-3; (was about +76 MB/step); 2 simulators 1.92x"
    )
    got = [(s.text, s.value, s.kind, s.signed) for s in shown_numbers(cell)]
    assert got == [
        ("56%", 56, "percent", False),
        ("90%", 90, "percent", False),
        ("45/50", 45, "fraction", False),
        ("+34 points", 34, "points", True),
        ("2.1-4.6x", 2.1, "ratio", False),
        ("2.1-4.6x", 4.6, "ratio", False),
        ("-0.0108", -0.0108, "plain", True),
        ("+0.00927", 0.00927, "plain", True),
        ("71,969", 71969, "plain", False),
        ("2.32e+03", 2320, "plain", False),
        ("0.70", 0.7, "plain", False),
        ("0.10", 0.1, "plain", False),
        ("3/10", 3, "fraction", False),
        ("8/10", 8, "fraction", False),
        ("16/50", 16, "fraction", False),
        ("0%", 0, "percent", False),
        ("3,190", 3190, "plain", False),
        ("0.059B", 0.059, "plain", False),
        ("5.3 ms", 5.3, "plain", False),
        ("13.4 ms", 13.4, "plain", False),
        ("1.92x", 1.92, "ratio", False),
    ]


def test_shown_numbers_keeps_the_precision_shown() -> None:
    """The interval a number stands for: its last digit, or the outward rounding of a range."""
    plain, percent, separated = (shown_numbers(cell)[0] for cell in ("0.139", "56%", "3,190"))
    low, high = shown_numbers("55-60%")
    assert (plain.low, plain.high) == pytest.approx((0.1385, 0.1395))
    assert (percent.low, percent.high) == pytest.approx((55.5, 56.5))
    assert (separated.low, separated.high) == pytest.approx((3185, 3195))
    assert (low.low, low.high, high.low, high.high) == pytest.approx((54.5, 56, 59, 60.5))


_DOC = {
    "summary": {"ours": {"s_per_step": 4.0174}, "speedup": 2.9058},
    "tasks": [{"successes": 50, "episodes": 50}, {"successes": 41, "episodes": 50}],
    "total": {"before_mb": 3336, "change_mb": -1252},
    "scaling": {"n2_s": 0.0053158, "n16_s": 0.01341},
    "rollouts": {"first": 0.31, "last": 0.49},
    "rows": [{"episodes": "45/50"}],
    "params": 59037068,
    "curve": [0.2, 0.7],
}
_CASES = {
    "4.02": True,  # rule 1: a leaf, at the precision shown
    "4.03": False,
    "2.91x": True,
    "2.95x": False,
    "5.3 ms": True,  # rule 1: a leaf in seconds
    "5.3": False,
    "0.059B": True,  # rule 1: a count
    "3,340": True,
    "3,350": False,
    "20%": True,  # rule 2: a fraction
    "21%": False,
    "3%": False,  # not the leaf 2.9058 read as a percentage
    "45/50": True,  # rule 3: a string
    "41/50": True,  # rule 3: one object
    "91/100": True,  # rule 3: a list's totals
    "40/50": False,
    "-38%": True,  # rule 4: change_mb / before_mb
    "-37%": False,
    "2.5x": True,  # rule 4: n16_s / n2_s
    "+0.18": True,  # rule 4: last - first
    "+18 points": True,  # rule 4: 100 (last - first)
    "+19 points": False,
    "+0.50": False,  # a series takes no part: 0.7 - 0.2
    "3.5x": False,
}


@pytest.mark.parametrize(("cell", "backed"), list(_CASES.items()))
def test_each_matching_rule_accepts_its_case_and_no_other(cell: str, backed: bool) -> None:
    """The rules on a small JSON: each number is backed exactly when one rule says so."""
    (shown,) = shown_numbers(cell)
    assert is_backed(shown, json_leaves(_DOC)) is backed, cell
