"""Goals of LIBERO tasks, read from the BDDL problem text, as pick-and-place steps.

A LIBERO task file (BDDL, a PDDL dialect) states its goal as a conjunction of predicates::

    (:goal
        (And (In alphabet_soup_1 basket_1_contain_region))
    )

:func:`parse_goal` reads that block into :class:`GoalAtom` s with a small s-expression reader
(no LIBERO import), and :func:`pick_place_steps` turns ``In`` / ``On`` atoms into the
:class:`PickPlace` steps the scripted planner executes, in the order the file lists them.
Other predicates (``Open``, ``Close``, ``Turnon``, ...) need articulated-object skills the
planner does not have: they are refused with :class:`UnsupportedGoalError`.

Goal semantics (LIBERO's ``predicates/base_predicates.py``):

- ``(In obj region)``: the region (a site, e.g. ``basket_1_contain_region``) contains the
  object's body position, an axis-aligned box test, and they touch (always true for sites);
- ``(On obj target)``: the object rests on ``target``: for a site region it is above the
  site's top face within its extent; for an object (``plate_1``) the object is higher, in
  contact, and its centre within 3 cm (xy) of the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

PICK_PLACE_RELATIONS = ("in", "on")

Sexp = str | list["Sexp"]


class UnsupportedGoalError(ValueError):
    """The task's goal is not a sequence of pick-and-place predicates the planner handles."""


@dataclass(frozen=True)
class GoalAtom:
    """One goal predicate, e.g. ``GoalAtom("in", ("alphabet_soup_1", "basket_1_contain_region"))``.

    Attributes:
        predicate: lower-case predicate name (BDDL is case-insensitive: ``On`` = ``on``).
        args: the object / region names it applies to.
    """

    predicate: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class PickPlace:
    """Put ``obj`` ``relation`` ``target`` (``in`` a region, or ``on`` an object / region)."""

    obj: str
    relation: str
    target: str


def _tokens(text: str) -> list[str]:
    """Parenthesis and word tokens of BDDL text, ``;`` comments dropped."""
    lines = [line.split(";", 1)[0] for line in text.splitlines()]
    return " ".join(lines).replace("(", " ( ").replace(")", " ) ").split()


def read_sexp(text: str) -> list[Sexp]:
    """Parse s-expression text into nested lists of strings (the top-level forms).

    Raises:
        ValueError: unbalanced parentheses.
    """
    stack: list[list[Sexp]] = [[]]
    for token in _tokens(text):
        if token == "(":
            stack.append([])
        elif token == ")":
            if len(stack) == 1:
                raise ValueError("BDDL text has a ')' without a matching '('")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(token)
    if len(stack) != 1:
        raise ValueError(f"BDDL text has {len(stack) - 1} unclosed '('")
    return stack[0]


def _find_section(forms: list[Sexp], key: str) -> list[Sexp] | None:
    """The first list (searched depth-first) whose head is ``key`` (e.g. ``:goal``)."""
    for form in forms:
        if isinstance(form, list):
            if form and isinstance(form[0], str) and form[0].lower() == key:
                return form
            found = _find_section(form, key)
            if found is not None:
                return found
    return None


def _atoms(expr: Sexp) -> list[GoalAtom]:
    """Flatten ``(And a b ...)`` into atoms; anything else must be ``(pred arg ...)``."""
    if not isinstance(expr, list) or not expr or not isinstance(expr[0], str):
        raise UnsupportedGoalError(f"goal expression {expr!r} is not a predicate")
    head = expr[0].lower()
    if head == "and":
        return [atom for sub in expr[1:] for atom in _atoms(sub)]
    if head in ("or", "not"):
        raise UnsupportedGoalError(f"goal connective {expr[0]!r} is not supported (only And)")
    if not all(isinstance(arg, str) for arg in expr[1:]):
        raise UnsupportedGoalError(f"goal predicate {expr!r} has nested arguments")
    return [GoalAtom(head, tuple(expr[1:]))]


def parse_goal(bddl_text: str) -> tuple[GoalAtom, ...]:
    """The goal predicates of a BDDL problem, in file order.

    Raises:
        ValueError: the text has no ``(:goal ...)`` section or unbalanced parentheses.
        UnsupportedGoalError: the goal uses ``Or`` / ``Not`` or nested arguments.
    """
    goal = _find_section(read_sexp(bddl_text), ":goal")
    if goal is None or len(goal) != 2:
        raise ValueError("BDDL text has no '(:goal <expression>)' section")
    return tuple(_atoms(goal[1]))


def pick_place_steps(atoms: tuple[GoalAtom, ...]) -> tuple[PickPlace, ...]:
    """The pick-and-place steps that achieve ``atoms``, in order.

    Raises:
        UnsupportedGoalError: an atom is not a binary ``In`` / ``On`` (e.g. ``Open``,
            ``Turnon``), naming it.
    """
    steps = []
    for atom in atoms:
        if atom.predicate not in PICK_PLACE_RELATIONS or len(atom.args) != 2:
            raise UnsupportedGoalError(
                f"goal ({atom.predicate} {' '.join(atom.args)}) is not a pick-and-place "
                f"predicate; the scripted planner handles (In obj region) and (On obj target) "
                "only (e.g. the libero_object and libero_spatial suites)"
            )
        steps.append(PickPlace(atom.args[0], atom.predicate, atom.args[1]))
    return tuple(steps)
