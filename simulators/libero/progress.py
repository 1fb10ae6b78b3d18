"""Privileged task progress of a LIBERO episode: a number in ``[0, 1]`` that follows the goal.

The value is read from simulator state a policy cannot see (object poses, contacts, fixture
joints, through :class:`~simulators.libero.privileged.PrivilegedScene`): it serves logging
and oracle rewards, never a policy's input. It is exactly 1.0 when the task succeeds
(LIBERO's own test) and at most :data:`TASK_CAP` otherwise, and it is the mean over the goal's
predicates (:func:`~simulators.libero.goals.parse_goal`; their semantics are in the
docstring of :mod:`simulators.libero.goals`) of each predicate's progress:

- a predicate that holds (LIBERO's own test of it) counts 1; one that does not, at most
  :data:`ATOM_CAP` (0.9): the last tenth is the predicate itself;
- ``(In obj region)`` / ``(On obj target)``, staged (:func:`staged_progress`)::

      0.2 * max(reach, hold, place) + 0.2 * max(hold, place) + 0.5 * place

  ``reach``: the share of the hand's start distance to the object's surface covered (less
  ``REACH_RADIUS``); ``hold``: 1 while the fingers grasp the object, or while it is lifted
  ``LIFT_HEIGHT`` above its start height with the hand at it (within ``HOLD_RADIUS``);
  ``place``: the share of the object's start distance to the goal covered
  (:func:`~simulators.base.distance_fraction`). The maxima make a later stage imply the
  earlier ones (an object halfway to the goal has been reached and held). The goal distance
  (:func:`goal_distance`) is to the region's box for ``In`` (LIBERO's ``in_box``), to the
  band just above a region's top face for ``On`` a region (LIBERO's ``under``), and, for
  ``On`` an object, the horizontal distance beyond ``ON_RADIUS`` plus the height missing to
  the target's (LIBERO's ``check_ontop``);
- ``(On plate region of the table)``, a pushed dish (``goals.PUSHED_KINDS``, never grasped):
  ``0.9 * place``;
- ``(Open region)`` / ``(Close region)`` / ``(Close <microwave>)`` / ``(Turnon obj)``:
  ``0.9 * joint_fraction(qpos, qpos at reset, goal qpos)`` (:func:`joint_fraction`), the
  goal qpos being the middle of the fixture's open / close range or the low end of its
  turn-on range (:class:`PrivilegedScene`'s ``open_close_qpos``, ``closed_qpos``,
  ``turn_on_qpos``: each at or past LIBERO's threshold, so a joint whose predicate fails
  starts short of its goal). A predicate that already held at the reset and was undone
  since counts 0 (there is no way back to measure it on).

A :class:`PrivilegedProgress` is built for one episode: :meth:`PrivilegedProgress.start`
records what the terms are measured from (start heights, start distances, joint positions)
right after the reset, :meth:`PrivilegedProgress.value` reads the progress of the state now.
The vector env does both for each of its envs
(:meth:`~simulators.libero.env.LiberoVectorEnv.privileged_progress`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simulators.base import distance_fraction
from simulators.libero.goals import (
    HANDLED,
    PICK_PLACE_RELATIONS,
    PUSHED_KINDS,
    GoalAtom,
    UnsupportedGoalError,
    is_door_fixture,
    is_drawer_region,
    is_table_region,
    object_kind,
    parse_goal,
)
from simulators.libero.privileged import PrivilegedScene, RegionBox

TASK_CAP = 0.99  # a task that has not succeeded counts at most this
ATOM_CAP = 0.9  # a predicate that does not hold counts at most this
W_REACH, W_HOLD, W_PLACE = 0.2, 0.2, 0.5  # the stages of a pick-and-place (sum: ATOM_CAP)
REACH_RADIUS = 0.02  # m: the hand this close to the object's surface has reached it
HOLD_RADIUS = 0.05  # m: a lifted object counts as held only with the hand this close
LIFT_HEIGHT = 0.03  # m above its start height: lifted
ON_RADIUS = 0.03  # m: LIBERO's On an object: centres within this, horizontally
ON_BAND = (-0.005, 0.10)  # m: LIBERO's On a region: body this far above its top face


def joint_fraction(qpos: float, start: float, goal: float) -> float:
    """The share of the way from ``start`` to ``goal`` a joint has gone:
    ``clip((qpos - start) / (goal - start), 0, 1)`` (1 when ``start == goal``).

    Moving away from the goal counts 0, going past it 1. Metres (a slide) or radians (a hinge).
    """
    span = goal - start
    if span == 0.0:
        return 1.0
    return float(np.clip((qpos - start) / span, 0.0, 1.0))


def staged_progress(reach: float, hold: float, place: float) -> float:
    """A pick-and-place predicate's progress from its stages, each in ``[0, 1]``:
    ``W_REACH * max(reach, hold, place) + W_HOLD * max(hold, place) + W_PLACE * place``
    (at most ``ATOM_CAP``)."""
    return W_REACH * max(reach, hold, place) + W_HOLD * max(hold, place) + W_PLACE * place


def box_distance(point: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """Euclidean distance from ``point`` ``(3,)`` to the axis-aligned box ``[low, high]``
    (each ``(3,)``); 0 inside."""
    outside = np.maximum(np.maximum(low - point, point - high), 0.0)
    return float(np.linalg.norm(outside))


def on_region_band(box: RegionBox) -> tuple[np.ndarray, np.ndarray]:
    """``(low (3,), high (3,))`` of the space where a body's position is ``On`` a region of
    box ``box``: its horizontal extent, from ``ON_BAND[0]`` to ``ON_BAND[1]`` above its top
    face (LIBERO's ``under``: ``size_z - 0.005 < dz < size_z + 0.10`` from the site's centre)."""
    top = box.high[2]
    low = np.array([box.low[0], box.low[1], top + ON_BAND[0]])
    high = np.array([box.high[0], box.high[1], top + ON_BAND[1]])
    return low, high


def on_object_distance(position: np.ndarray, target: np.ndarray) -> float:
    """How far a body at ``position`` ``(3,)`` is from ``On`` a body at ``target`` ``(3,)``:
    its horizontal distance beyond ``ON_RADIUS`` plus the height it lacks to be at or above
    the target (LIBERO's ``check_ontop``: higher, in contact, centres within 3 cm)."""
    across = max(float(np.linalg.norm(position[:2] - target[:2])) - ON_RADIUS, 0.0)
    return across + max(float(target[2] - position[2]), 0.0)


def goal_distance(scene: PrivilegedScene, atom: GoalAtom) -> float:
    """Metres between object ``atom.args[0]`` and where ``(In | On obj target)`` puts it
    (0 where LIBERO's geometric test of the predicate passes)."""
    obj, target = atom.args
    position = scene.object_position(obj)
    if not scene.is_site(target):  # a body: On a plate, In a body (rare)
        if atom.predicate == "on":
            return on_object_distance(position, scene.object_position(target))
        return float(np.linalg.norm(position - scene.object_position(target)))
    box = scene.region_box(target)
    if atom.predicate == "in":
        return box_distance(position, box.low, box.high)
    return box_distance(position, *on_region_band(box))


def surface_distance(scene: PrivilegedScene, obj: str) -> float:
    """Metres from the grip site to the nearest point of object ``obj``'s collision shape."""
    position, _ = scene.eef_pose()
    return float(np.min(np.linalg.norm(scene.object_points(obj) - position, axis=1)))


class _PickPlace:
    """Progress of ``(In obj region)`` / ``(On obj target)``: reach, hold, place."""

    def __init__(self, atom: GoalAtom) -> None:
        self.atom = atom
        self.obj, target = atom.args
        self.pushed = (
            atom.predicate == "on"
            and object_kind(self.obj) in PUSHED_KINDS
            and is_table_region(target)
        )

    def start(self, scene: PrivilegedScene) -> None:
        self.height = float(scene.object_position(self.obj)[2])
        self.reach = max(surface_distance(scene, self.obj) - REACH_RADIUS, 0.0)
        self.place = goal_distance(scene, self.atom)

    def value(self, scene: PrivilegedScene) -> float:
        if scene.holds(self.atom.predicate, self.atom.args):
            return 1.0
        place = distance_fraction(goal_distance(scene, self.atom), self.place)
        if self.pushed:
            return ATOM_CAP * place
        hand = surface_distance(scene, self.obj)
        reach = distance_fraction(max(hand - REACH_RADIUS, 0.0), self.reach)
        # lifted only counts with the hand at the object: a scene may throw an object up
        lifted = scene.object_position(self.obj)[2] - self.height > LIFT_HEIGHT
        held = scene.is_grasping(self.obj) or (lifted and hand < HOLD_RADIUS)
        return staged_progress(reach, float(held), place)


class _Joint:
    """Progress of ``(Open | Close region)``, ``(Close <microwave>)``, ``(Turnon obj)``."""

    def __init__(self, atom: GoalAtom) -> None:
        self.atom = atom

    def _qpos_and_goal(self, scene: PrivilegedScene) -> tuple[float, float]:
        """The joint's position now and its goal position (see the module docstring)."""
        name = self.atom.args[0]
        if self.atom.predicate == "turnon":
            return scene.object_joint(name).qpos, scene.turn_on_qpos(name)
        if is_door_fixture(name):
            return scene.object_joint(name).qpos, scene.closed_qpos(name)
        opened, closed = scene.open_close_qpos(name)
        goal = opened if self.atom.predicate == "open" else closed
        return scene.region_joint(name).qpos, goal

    def start(self, scene: PrivilegedScene) -> None:
        qpos, _ = self._qpos_and_goal(scene)
        held = scene.holds(self.atom.predicate, self.atom.args)
        self.start_qpos = None if held else qpos  # None: nothing to measure the way on

    def value(self, scene: PrivilegedScene) -> float:
        if scene.holds(self.atom.predicate, self.atom.args):
            return 1.0
        if self.start_qpos is None:
            return 0.0
        qpos, goal = self._qpos_and_goal(scene)
        return ATOM_CAP * joint_fraction(qpos, self.start_qpos, goal)


def _measure(atom: GoalAtom) -> _PickPlace | _Joint:
    """The progress measure of one goal predicate.

    Raises:
        UnsupportedGoalError: a predicate without one (``Turnoff``, ``Open`` of a
            microwave, ...), naming it.
    """
    name, args = atom.predicate, atom.args
    if name in PICK_PLACE_RELATIONS and len(args) == 2:
        return _PickPlace(atom)
    if name == "open" and len(args) == 1 and is_drawer_region(args[0]):
        return _Joint(atom)
    closes = len(args) == 1 and (is_drawer_region(args[0]) or is_door_fixture(args[0]))
    if (name == "close" and closes) or (name == "turnon" and len(args) == 1):
        return _Joint(atom)
    raise UnsupportedGoalError(
        f"goal ({name} {' '.join(args)}) has no privileged progress; it is defined for "
        f"{HANDLED} (the goals the scripted planner handles)"
    )


@functools.lru_cache(maxsize=256)
def read_goal(bddl_file: str) -> tuple[GoalAtom, ...]:
    """The goal predicates of a BDDL task file (read and parsed once per file and process).

    Raises:
        UnsupportedGoalError: the goal uses ``Or`` / ``Not`` (:func:`parse_goal`).
    """
    return parse_goal(Path(bddl_file).read_text(encoding="utf-8"))


class PrivilegedProgress:
    """Privileged progress of one episode of a task (formulas: the module docstring).

    A goal without a measure does not fail here but in :meth:`value`, so an env can run
    tasks whose progress nobody asks for.

    Args:
        atoms: the goal predicates (:func:`~simulators.libero.goals.parse_goal`).
        unsupported: why the goal has no measure, when that is known already (its parse
            failed); ``atoms`` is then ignored.

    Attributes:
        unsupported: the error :meth:`value` raises, ``None`` for a goal it measures.
    """

    def __init__(
        self, atoms: Sequence[GoalAtom], unsupported: UnsupportedGoalError | None = None
    ) -> None:
        self.atoms = tuple(atoms)
        self.unsupported = unsupported
        self._measures: list[_PickPlace | _Joint] = []
        self._scene: PrivilegedScene | None = None
        if unsupported is not None:
            return
        if not self.atoms:
            raise ValueError("privileged progress needs at least one goal predicate")
        try:
            self._measures = [_measure(atom) for atom in self.atoms]
        except UnsupportedGoalError as err:
            self.unsupported = err

    @classmethod
    def of_file(cls, bddl_file: str) -> PrivilegedProgress:
        """The progress of the goal of a BDDL file (an ``Or`` goal: refused by :meth:`value`)."""
        try:
            return cls(read_goal(bddl_file))
        except UnsupportedGoalError as err:
            return cls((), unsupported=err)

    def start(self, scene: PrivilegedScene) -> PrivilegedProgress:
        """Record the episode's start (call it right after the reset); returns ``self``."""
        self._scene = scene
        for measure in self._measures:
            measure.start(scene)
        return self

    def atom_values(self) -> np.ndarray:
        """``(A,)`` float64: each goal predicate's progress now, in goal order."""
        self._check()
        return np.array([measure.value(self._scene) for measure in self._measures])

    def value(self) -> float:
        """The task's progress now: 1.0 at success, else the atoms' mean, at most ``TASK_CAP``.

        Raises:
            UnsupportedGoalError: the goal has a predicate without a measure, naming it.
        """
        self._check()
        if self._scene.success():
            return 1.0
        return min(float(np.mean(self.atom_values())), TASK_CAP)

    def _check(self) -> None:
        if self.unsupported is not None:
            raise self.unsupported
        if self._scene is None:
            raise RuntimeError("PrivilegedProgress: call start(scene) after the reset first")


def env_progress(progress: PrivilegedProgress | None) -> float:
    """One env's privileged progress for ``privileged_progress``: 0 for an env left out of
    the reset (``None``), NaN for a task whose goal has a predicate without a measure."""
    if progress is None:
        return 0.0
    try:
        return progress.value()
    except UnsupportedGoalError:
        return math.nan
