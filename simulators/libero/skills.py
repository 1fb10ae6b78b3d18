"""Geometry of the planner's articulated-object skills: a drawer handle's grip, a knob's grip.

Pure functions on world-frame points ``(K, 3)`` (collision geom vertices / corners from
:class:`~simulators.libero.privileged.PrivilegedScene`), no simulator:

- :func:`handle_grip`: the eef pose that grasps a drawer's handle bar from the front, the hand
  nearly horizontal and the fingers closing nearly vertically around the bar (a top-down finger does not fit
  the 1.6 cm slot between a LIBERO cabinet's handle and its drawer front: the Panda's finger
  tip is 1.44 cm thick);
- :func:`knob_grip_points`: the raised grip of a knob (what the fingers close on);
- :func:`push_path`: a path for a pushed disc (a plate) around the objects on the table;
- :func:`clear_move`: the shortest move of an object out of a keep-out area (a drawer's
  sweep) and away from the other objects;
- :func:`ray_hit`, :func:`handle_bar`, :func:`widest_gap`, :func:`door_push_point`: a
  microwave's cavity seen from inside, a mug's handle, where the hand passes the opening,
  where fingers push a hinged door shut.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from simulators.libero.grasp import convex_hull, polygons_overlap

# Panda finger geometry in the grip-site frame (site z points from the hand to the tips):
FINGER_TIP = 0.0092  # the finger tips are this far beyond the grip site
PAD_BACK = 0.0044  # the pads reach this far past the site towards the tips ...
PAD_FRONT = 0.0116  # ... and this far back towards the hand
FINGER_OUTER = 0.053  # a finger's outer face from the site, along the closing axis (open)


def horizontal_rotation(approach: np.ndarray, closing: np.ndarray) -> np.ndarray:
    """The eef rotation ``(3, 3)`` pointing along ``approach`` with fingers closing along
    ``closing`` (both unit, orthogonal; not necessarily horizontal): columns are the grip
    site's x (closing), y, z axes."""
    return np.stack([closing, np.cross(approach, closing), approach], axis=1)


def handle_grip(
    handle: np.ndarray,
    outward: np.ndarray,
    current: np.ndarray,
    tip_clearance: float,
    pitch: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The eef pose that grasps a handle bar from the front, fingers above and below it.

    The hand points at the drawer, its tips tilted ``pitch`` below the horizontal: the hand
    reaches 10 cm along the closing axis, and the tilt lifts its lower end off what stands
    in front of a low drawer (libero_goal's plate, 2 mm under a level hand).

    Args:
        handle: the bar's points ``(K, 3)``.
        outward: ``(3,)`` horizontal unit direction in which the drawer opens (the bar's
            front faces it).
        current: the eef rotation now ``(3, 3)``; of the two closing directions (up or
            down) the one nearer its x axis is chosen (the smaller wrist turn).
        tip_clearance: the deepest finger point (the upper finger's tip, tilted towards
            the drawer) reaches this far past the bar's back face; it must stay short of
            the drawer front behind (a LIBERO cabinet's slot is 1.6 cm).
        pitch: the tilt (rad).

    Returns:
        ``(position (3,), rotation (3, 3))``: the site at the bar's middle (along it and in
        height), as deep as the fingers fit (the pads over most of the bar's depth).
    """
    outward = np.asarray(outward, float)
    along = handle @ outward
    front, back = float(along.max()), float(along.min())
    reach = FINGER_TIP * np.cos(pitch) + FINGER_OUTER * np.sin(pitch)  # deepest finger point
    depth = max(front - PAD_FRONT, back - tip_clearance + reach)  # the site, along outward
    centre = (handle.min(axis=0) + handle.max(axis=0)) / 2
    position = centre + outward * (depth - float(centre @ outward))
    up = np.array([0.0, 0.0, 1.0])
    approach = -outward * np.cos(pitch) - up * np.sin(pitch)
    closing = -outward * np.sin(pitch) + up * np.cos(pitch)
    closing = closing if current[:, 0] @ closing >= 0 else -closing
    return position, horizontal_rotation(approach, closing)


def tilt_towards(rotation: np.ndarray, toward_xy: np.ndarray, pitch: float) -> np.ndarray:
    """``rotation (3, 3)`` (an eef pointing down) tilted by ``pitch`` about its closing (x)
    axis, the way that swings the finger tips towards the horizontal direction ``toward_xy``
    (the hand's wrist swings the other way)."""
    axis = rotation[:, 0]
    candidates = []
    for angle in (pitch, -pitch):
        k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
        turn = np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k  # Rodrigues
        candidates.append(turn @ rotation)
    return max(candidates, key=lambda r: float(r[:2, 2] @ np.asarray(toward_xy, float)))


def handle_part(parts: list[np.ndarray], outward: np.ndarray) -> np.ndarray:
    """The drawer's handle: of its collision pieces ``(K, 3)`` each, the one that reaches
    furthest along ``outward`` (the bar stands off the drawer front)."""
    return max(parts, key=lambda p: float(np.max(p @ outward)))


def knob_grip_points(parts: list[np.ndarray]) -> np.ndarray:
    """The knob's raised grip ``(P, 3)``: its pieces whose tops reach above the middle of the
    knob's height (a flat stove's knob: a 2.5 cm wide ridge on a 9.5 cm disc of tabs)."""
    low = min(float(p[:, 2].min()) for p in parts)
    high = max(float(p[:, 2].max()) for p in parts)
    ridge = [p for p in parts if float(p[:, 2].max()) > (low + high) / 2]
    return np.concatenate(ridge)


def polygon_distance(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """Distance ``(N,)`` from points ``(N, 2)`` to a convex counter-clockwise polygon ``(K, 2)``
    (0 inside)."""
    start, end = polygon, np.roll(polygon, -1, axis=0)
    edge = end - start  # (K, 2)
    rel = points[:, None, :] - start[None]  # (N, K, 2)
    t = np.clip((rel * edge).sum(-1) / np.maximum((edge * edge).sum(-1), 1e-12), 0.0, 1.0)
    gap = np.linalg.norm(rel - t[..., None] * edge, axis=-1).min(axis=1)
    inside = np.all(edge[None, :, 0] * rel[..., 1] - edge[None, :, 1] * rel[..., 0] >= 0, axis=1)
    return np.where(inside, 0.0, gap)


def push_path(
    start: np.ndarray,
    goal_low: np.ndarray,
    goal_high: np.ndarray,
    radius: float,
    obstacles: Sequence[np.ndarray],
    cell: float = 0.01,
) -> np.ndarray | None:
    """Centre positions ``(M, 2)`` that take a disc of ``radius`` from ``start`` into the box
    ``goal_low``..``goal_high`` (xy) without touching ``obstacles`` (xy points ``(Q, 2)`` per
    piece), on an 8-connected grid of ``cell``: the reachable goal cell nearest the box's
    centre, by a shortest grid path. The disc may touch what it touches at ``start`` for its
    first 3 cm. ``None`` when no goal cell is reachable.
    """
    centre = (goal_low + goal_high) / 2
    low = np.minimum(start, goal_low) - 0.2
    shape = np.ceil((np.maximum(start, goal_high) + 0.2 - low) / cell).astype(int) + 1
    xs, ys = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    points = low + np.stack([xs, ys], axis=-1).reshape(-1, 2) * cell
    clearance = np.full(len(points), np.inf)
    for piece in obstacles:
        clearance = np.minimum(clearance, polygon_distance(points, convex_hull(piece)))
    free = (clearance > radius) | (np.linalg.norm(points - start, axis=1) < 0.03)
    free = free.reshape(shape)
    first = tuple(np.round((start - low) / cell).astype(int))
    parent = {first: first}
    queue = deque([first])
    while queue:
        here = queue.popleft()
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                near = (here[0] + dx, here[1] + dy)
                inside = 0 <= near[0] < shape[0] and 0 <= near[1] < shape[1]
                if inside and near not in parent and free[near]:
                    parent[near] = here
                    queue.append(near)
    reached = [
        c
        for c in parent
        if np.all(np.abs(low + np.array(c) * cell - centre) <= (goal_high - goal_low) / 2)
    ]
    if not reached:
        return None
    last = min(reached, key=lambda c: float(np.linalg.norm(low + np.array(c) * cell - centre)))
    path = [last]
    while path[-1] != first:
        path.append(parent[path[-1]])
    return low + np.array(path[::-1], float) * cell


def clear_move(
    footprint: np.ndarray,
    keep_out: Sequence[tuple[np.ndarray, float]],
    base_xy: np.ndarray,
    reach: float = 0.2,
    cell: float = 0.01,
    farther: float = 0.03,
) -> np.ndarray | None:
    """The shortest move ``(2,)`` (on a grid of ``cell``, at most ``reach``, taking the
    object at most ``farther`` further from the robot's base at ``base_xy``: the arm reaches
    less there) after which an object's xy ``footprint`` ``(K, 2)`` keeps its margin from the convex hull of
    every ``keep_out`` piece (``(xy points (Q, 2), margin)``); ``(0, 0)`` when it already
    does, ``None`` when no such move does.
    """
    hull = convex_hull(footprint)
    hulls = [(convex_hull(piece), margin) for piece, margin in keep_out]
    ticks = np.arange(-round(reach / cell), round(reach / cell) + 1) * cell
    moves = np.stack(np.meshgrid(ticks, ticks, indexing="ij"), axis=-1).reshape(-1, 2)
    centre = footprint.mean(axis=0)
    distance = np.linalg.norm(centre - base_xy)
    near = np.linalg.norm(centre + moves - base_xy, axis=1) <= distance + farther
    lengths = np.where(near, np.linalg.norm(moves, axis=1), np.inf)
    for move in moves[np.argsort(lengths, kind="stable")][: int((lengths <= reach).sum())]:
        if not any(polygons_overlap(hull + move, other, margin) for other, margin in hulls):
            return move
    return None


def shift_clear(
    footprint: np.ndarray,
    overhangs: Sequence[np.ndarray],
    direction: np.ndarray,
    reach: float,
    margin: float,
    cell: float = 0.0025,
) -> np.ndarray | None:
    """The shortest shift ``(2,)`` along unit ``direction`` ``(2,)`` (a multiple of ``cell``, at
    most ``reach``) after which an object's xy ``footprint`` ``(K, 2)`` keeps ``margin`` from
    the convex hull of every ``overhangs`` piece ``(Q, 2)``; ``None`` when none does (a bowl
    lowered into an open bottom drawer must come down in front of the drawers above it and
    their handles)."""
    hull = convex_hull(footprint)
    hulls = [convex_hull(piece) for piece in overhangs]
    for k in range(int(np.floor(max(reach, 0.0) / cell + 1e-9)) + 1):
        shift = direction * k * cell
        if not any(polygons_overlap(hull + shift, other, margin) for other in hulls):
            return shift
    return None


def slot_offset(
    low: np.ndarray, high: np.ndarray, slot: tuple[int, int], inset: float = 0.01
) -> np.ndarray:
    """The xy offset ``(2,)`` from a region box's centre of slot ``k`` of ``n``: evenly along
    the box's longer horizontal side, the outer slots ``inset`` inside its ends (0 for n=1)."""
    k, n = slot
    offset = np.zeros(2)
    if n > 1:
        extent = (high - low)[:2]
        axis = int(np.argmax(extent))
        offset[axis] = (k - (n - 1) / 2) * (extent[axis] - 2 * inset) / (n - 1)
    return offset


def ray_hit(
    origin: np.ndarray, direction: np.ndarray, parts: Sequence[np.ndarray], reach: float
) -> float | None:
    """How far the ray ``origin + t * direction`` (both ``(3,)``, direction unit) runs, within
    ``0 <= t <= reach``, before it enters the first of ``parts`` (points ``(K, 3)`` each, taken
    as their axis-aligned boxes); ``None`` when it meets none. A cavity's walls, floor and
    roof seen from inside it."""
    origin, direction = np.asarray(origin, float), np.asarray(direction, float)
    nearest = None
    for part in parts:
        low, high = part.min(axis=0), part.max(axis=0)
        enter, leave = 0.0, reach
        for k in range(3):
            if abs(direction[k]) < 1e-12:
                if not low[k] <= origin[k] <= high[k]:
                    break
                continue
            a, b = (low[k] - origin[k]) / direction[k], (high[k] - origin[k]) / direction[k]
            enter, leave = max(enter, min(a, b)), min(leave, max(a, b))
        else:
            if enter <= leave and (nearest is None or enter < nearest):
                nearest = enter
    return nearest


def handle_bar(parts: Sequence[np.ndarray]) -> np.ndarray:
    """A mug's handle: of its collision pieces ``(K, 3)`` each, the one whose centre lies
    furthest (xy) from the middle of all pieces' centres (LIBERO's mugs: the handle's outer
    bar, 8.3 cm from the cup's axis, 1.8 cm thick, 5.8 cm tall)."""
    centres = np.array([(p.min(axis=0) + p.max(axis=0)) / 2 for p in parts])
    middle = np.median(centres[:, :2], axis=0)
    return parts[int(np.argmax(np.linalg.norm(centres[:, :2] - middle, axis=1)))]


def long_axis(points_xy: np.ndarray) -> np.ndarray:
    """The unit direction ``(2,)`` along which ``points_xy (K, 2)`` spread most (a door
    panel's length); its sign is arbitrary."""
    centred = points_xy - points_xy.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return vt[0]


def turn_xy(vector: np.ndarray, angle: float) -> np.ndarray:
    """``vector (2,)`` turned by ``angle`` (rad, counter-clockwise seen from above)."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * vector[0] - s * vector[1], s * vector[0] + c * vector[1]])


def door_push_point(
    hinge_xy: np.ndarray, along: np.ndarray, closing: float, radius: float, standoff: float
) -> np.ndarray:
    """Where closed fingers push a hinged door shut ``(2,)``: ``radius`` from the hinge along
    the door (unit ``along (2,)``, hinge to free end), ``standoff`` off the hinge line on the
    side the door turns away from (``closing``: +1 when it shuts turning counter-clockwise
    seen from above, -1 clockwise)."""
    along = np.asarray(along, float)
    moving = closing * np.array([-along[1], along[0]])  # where a door point goes as it shuts
    return np.asarray(hinge_xy, float) + radius * along - standoff * moving


def widest_gap(
    feasible: tuple[float, float],
    body: tuple[float, float],
    obstacles: Sequence[tuple[float, float]],
    cell: float = 0.001,
) -> float:
    """The position ``g`` in ``feasible`` (low, high) at which the interval ``body`` shifted
    by ``g`` keeps the most distance from every ``obstacles`` interval (1-D; the distance is
    negative while they overlap): where the hand (20 cm across its closing axis) passes a
    microwave's opening between its door and its control panel. ``feasible``'s middle when
    there is no obstacle; its low end when it is empty."""
    low, high = feasible
    if high <= low:
        return low
    if not obstacles:
        return (low + high) / 2
    candidates = np.arange(low, high + cell / 2, cell)
    starts = candidates[:, None] + body[0]
    ends = candidates[:, None] + body[1]
    first = np.array([o[0] for o in obstacles])[None, :]
    last = np.array([o[1] for o in obstacles])[None, :]
    gaps = np.maximum(first - ends, starts - last)  # > 0: apart; < 0: overlapping
    return float(candidates[int(np.argmax(gaps.min(axis=1)))])
