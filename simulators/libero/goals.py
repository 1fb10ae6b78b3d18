"""Goals of LIBERO tasks, read from the BDDL problem text, as the planner's skill steps.

A LIBERO task file (BDDL, a PDDL dialect) states its goal as a conjunction of predicates::

    (:goal
        (And (In alphabet_soup_1 basket_1_contain_region))
    )

:func:`parse_goal` reads that block into :class:`GoalAtom` s with a small s-expression reader
(no LIBERO import), and :func:`goal_steps` turns the atoms into the skill steps the scripted
planner executes, in the order the file lists them:

- ``(In obj region)`` / ``(On obj target)``: :class:`PickPlace`; but an ``On`` of a plate to a
  table region is a :class:`Push` (a plate is wider than the open gripper and flat), and an
  ``In`` into a cabinet drawer's region first gets :class:`ClearOf` (the object out of the
  drawer's sweep) and :class:`OpenDrawer` of that region (the drawers of LIBERO's cabinets
  start closed: libero_goal's "open the top drawer and put the bowl inside" states only the
  ``In``);
- two ``On`` of objects to one region: a ``slot`` each (k of n), spread over the region;
- ``(Open <cabinet>_<top|middle|bottom>_region)``: :class:`OpenDrawer`;
- ``(Close <cabinet>_<top|middle|bottom>_region)``: :class:`CloseDrawer`, after every step
  that puts something in that drawer (a goal is a conjunction, not a sequence: libero_10's
  "put the black bowl in the bottom drawer of the cabinet and close it" lists the ``Close``
  first);
- ``(Turnon obj)``: :class:`TurnOn` (a stove's knob);
- ``(In obj <microwave>_heating_region)``: :class:`PutInside` (a roofed cavity behind a door:
  the object goes in sideways, held by its handle);
- ``(Close <microwave>)``: :class:`CloseDoor`, after every step that puts something in it.

Other predicates (``Turnoff``, ``Open`` of a microwave, ...) are refused with
:class:`UnsupportedGoalError`.

Goal semantics (LIBERO's ``predicates/base_predicates.py``):

- ``(In obj region)``: the region (a site, e.g. ``basket_1_contain_region``) contains the
  object's body position, an axis-aligned box test, and they touch (always true for sites);
- ``(On obj target)``: the object rests on ``target``: for a site region it is above the
  site's top face within its extent; for an object (``plate_1``) the object is higher, in
  contact, and its centre within 3 cm (xy) of the target's;
- ``(Open region)``: the region's joint (a drawer's slide) is past the fixture's open
  threshold (a wooden cabinet's drawer: ``qpos < -0.14`` m, joint range -0.16 .. 0.01);
- ``(Close region)``: the joint is past the close threshold (a cabinet's drawer:
  ``qpos > 0.0`` m, fully in; a microwave's door: ``qpos > -0.005`` rad, range -2.094 .. 0);
- ``(Turnon obj)``: the fixture's knob joint is past its on threshold (a flat stove's
  knob: ``qpos >= 0.5`` rad, range -0.005 .. 2.1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

PICK_PLACE_RELATIONS = ("in", "on")
PUSHED_KINDS = ("plate",)  # 13.8 cm wide, 2 cm high: pushed along the table, never grasped
DRAWER_LEVELS = ("top", "middle", "bottom")
DOOR_KINDS = ("microwave",)  # fixtures with a hinged door in front of a roofed cavity
HANDLED = (
    "(In obj region), (On obj target), (Open <cabinet>_<top|middle|bottom>_region), "
    "(Close <cabinet>_<top|middle|bottom>_region), (Close <microwave>) and (Turnon obj)"
)

Sexp = str | list["Sexp"]


class UnsupportedGoalError(ValueError):
    """The task's goal is not a sequence of predicates the planner has skills for."""


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
    """Put ``obj`` ``relation`` ``target`` (``in`` a region, or ``on`` an object / region);
    ``slot`` = (k, n): the k-th of n objects put ``on`` the same region, which the planner
    spreads over it (libero_10's "put both moka pots on the stove")."""

    obj: str
    relation: str
    target: str
    slot: tuple[int, int] = (0, 1)


@dataclass(frozen=True)
class Push:
    """Push ``obj`` (a dish) along the table until it is ``On`` the table region ``target``."""

    obj: str
    target: str


@dataclass(frozen=True)
class ClearOf:
    """Move ``obj`` along the table out of the space the drawer of ``region`` sweeps when it
    opens (a step before :class:`OpenDrawer`; the planner skips it when ``obj`` is clear)."""

    obj: str
    region: str


@dataclass(frozen=True)
class OpenDrawer:
    """Pull the drawer of cabinet region ``region`` (e.g. ``wooden_cabinet_1_top_region``) open."""

    region: str


@dataclass(frozen=True)
class CloseDrawer:
    """Push the drawer of cabinet region ``region`` shut (by its front panel, beside the
    handle)."""

    region: str


@dataclass(frozen=True)
class PutInside:
    """Put ``obj`` (a mug, by its handle) ``in`` the region ``target`` of a roofed cavity
    behind a hinged door (``microwave_1_heating_region``): the hand, tilted, enters through
    the door's opening (a top-down hand does not fit under the roof)."""

    obj: str
    target: str


@dataclass(frozen=True)
class CloseDoor:
    """Swing the hinged door of fixture ``obj`` (``microwave_1``) shut."""

    obj: str


@dataclass(frozen=True)
class TurnOn:
    """Turn the knob of fixture ``obj`` (e.g. ``flat_stove_1``) to on."""

    obj: str


Step = PickPlace | Push | ClearOf | OpenDrawer | CloseDrawer | TurnOn | PutInside | CloseDoor


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


def object_kind(name: str) -> str:
    """An instance's category: ``plate_1`` -> ``plate`` (BDDL numbers instances ``_1``, ``_2``)."""
    head, _, tail = name.rpartition("_")
    return head if head and tail.isdigit() else name


def is_drawer_region(name: str) -> bool:
    """Whether region ``name`` is a cabinet drawer's (``<...>cabinet_<n>_<level>_region``)."""
    return "cabinet" in name and any(name.endswith(f"_{lv}_region") for lv in DRAWER_LEVELS)


def is_door_fixture(name: str) -> bool:
    """Whether ``name`` is a fixture with a hinged door (``microwave_1``)."""
    return object_kind(name) in DOOR_KINDS


def cavity_fixture(region: str) -> str:
    """The fixture whose cavity ``region`` is: ``microwave_1_heating_region`` -> ``microwave_1``."""
    return region.partition("_heating_")[0]


def is_cavity_region(name: str) -> bool:
    """Whether region ``name`` is inside a door fixture (``microwave_1_heating_region``)."""
    return name.endswith("_heating_region") and is_door_fixture(cavity_fixture(name))


def is_table_region(name: str) -> bool:
    """Whether ``name`` is a region of a table (``main_table_stove_front_region``)."""
    return name.endswith("_region") and "table_" in name


def _unsupported(atom: GoalAtom) -> UnsupportedGoalError:
    return UnsupportedGoalError(
        f"goal ({atom.predicate} {' '.join(atom.args)}) is not supported; the scripted planner "
        f"handles {HANDLED} only"
    )


def _atom_steps(atom: GoalAtom, opened: set[str]) -> list[Step]:
    """The steps of one atom; ``opened`` (drawer regions opened so far) is updated."""
    args = atom.args
    if atom.predicate == "open" and len(args) == 1 and is_drawer_region(args[0]):
        opened.add(args[0])
        return [OpenDrawer(args[0])]
    if atom.predicate == "close" and len(args) == 1 and is_drawer_region(args[0]):
        return [CloseDrawer(args[0])]
    if atom.predicate == "close" and len(args) == 1 and is_door_fixture(args[0]):
        return [CloseDoor(args[0])]
    if atom.predicate == "turnon" and len(args) == 1:
        return [TurnOn(args[0])]
    if atom.predicate not in PICK_PLACE_RELATIONS or len(args) != 2:
        raise _unsupported(atom)
    obj, target = args
    if atom.predicate == "in" and is_cavity_region(target):
        return [PutInside(obj, target)]
    if atom.predicate == "on" and object_kind(obj) in PUSHED_KINDS and is_table_region(target):
        return [Push(obj, target)]
    steps: list[Step] = []
    if atom.predicate == "in" and is_drawer_region(target) and target not in opened:
        opened.add(target)  # an In a closed drawer needs it open first (a no-op if it is)
        # and the object out of the drawer's way: an open top drawer overhangs the bowl in
        # front of libero_goal's cabinet, so the bowl could not be lifted any more
        steps += [ClearOf(obj, target), OpenDrawer(target)]
    return [*steps, PickPlace(obj, atom.predicate, target)]


def goal_steps(atoms: tuple[GoalAtom, ...]) -> tuple[Step, ...]:
    """The skill steps that achieve ``atoms``, in order (preconditions first).

    Raises:
        UnsupportedGoalError: an atom has no skill (e.g. ``Turnoff``, ``Open`` of a
            microwave), naming it and what the planner handles.
    """
    opened: set[str] = set()
    steps = [step for atom in atoms for step in _atom_steps(atom, opened)]
    return tuple(_with_slots(_closes_last(steps)))


def _closes_last(steps: list[Step]) -> list[Step]:
    """Each :class:`CloseDrawer` / :class:`CloseDoor` moved after the last step that uses its
    drawer / fixture (puts something in it, clears for it or opens it) when one comes after
    it; the others keep their order."""
    out = list(steps)
    for close in [step for step in steps if isinstance(step, CloseDrawer | CloseDoor)]:
        here = out.index(close)
        uses = [i for i, s in enumerate(out) if i != here and _uses(s, close)]
        if uses and uses[-1] > here:
            out.insert(uses[-1], out.pop(here))  # the last use is one place earlier now
    return out


def _uses(step: Step, close: CloseDrawer | CloseDoor) -> bool:
    """Whether ``step`` uses the drawer / door fixture that ``close`` shuts."""
    if isinstance(close, CloseDoor):
        return (_target(step) or "").startswith(f"{close.obj}_")
    return close.region in (_target(step), _region(step))


def _target(step: Step) -> str | None:
    return step.target if isinstance(step, PickPlace | Push | PutInside) else None


def _region(step: Step) -> str | None:
    return step.region if isinstance(step, ClearOf | OpenDrawer | CloseDrawer) else None


def _with_slots(steps: list[Step]) -> list[Step]:
    """Number the pick-and-places ``on`` one region (``_region``) k of n. An ``In`` keeps one
    aim: libero_10's two cans into one basket succeed 50/50 with it."""

    def shared(step: Step) -> str | None:
        on_region = isinstance(step, PickPlace) and step.relation == "on"
        return step.target if on_region and step.target.endswith("_region") else None

    totals = Counter(shared(step) for step in steps)
    seen: Counter = Counter()
    out = []
    for step in steps:
        target = shared(step)
        if target is not None and totals[target] > 1:
            step = replace(step, slot=(seen[target], totals[target]))
            seen[target] += 1
        out.append(step)
    return out
