"""Grasp geometry for the scripted LIBERO planner: top-down grasps that miss the neighbours.

Objects are point sets ``(P, 3)`` in the world frame (collision mesh vertices and primitive
corners, :meth:`simulators.libero.privileged.PrivilegedScene.object_points`); their horizontal footprint is
the convex hull of the points' xy. The gripper is a few boxes in the grip-site frame
(:meth:`~simulators.libero.privileged.PrivilegedScene.gripper_boxes`: the hand, the two fingers).

A grasp is an eef position and a yaw with the eef pointing straight down. :func:`plan_grasp`
tries yaws every 5 degrees over half a turn (the gripper is symmetric), preferring the
narrowest width across the fingers (a box across its short side) and then the least
rotation, and rejects a candidate whose hand or fingers, lowered to the grasp height, would
overlap another object that reaches above their bottom; when every yaw collides it tries a
shallower grasp. An object wider than the open gripper at every yaw (a bowl) is taken by its
rim instead: the fingers straddle the wall at the outer edge of its top, pointing at the
centre, from the side that misses the neighbours and turns the hand least.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The eef (robosuite's grip site) pointing straight down with yaw 0: eef x = world x, eef
# z = -world z. The Panda's fingers close along the grip site's x axis, so the yaw is the
# heading of the closing direction.
DOWN = np.diag([1.0, -1.0, -1.0])
YAW_STEP_DEG = 5
WIDTH_TIE = 0.004  # widths this close count as equal: then the smaller rotation wins
HEIGHT_STEP = 0.005  # shallower grasps tried in these steps when every yaw collides


@dataclass(frozen=True)
class GraspLimits:
    """What makes a grasp feasible (metres).

    Attributes:
        max_width: widest object the open fingers can straddle.
        grasp_depth: eef (finger-pad centre) height below the object's top.
        min_depth: the shallowest grasp tried when deeper ones collide.
        floor_clearance: lowest eef height above the object's bottom.
        margin: required horizontal gap between the gripper and other objects.
        rim_depth: rim grasps: eef height below the object's top (less than the hand's
            3 cm above the finger pads, so the hand stays above the rim).
        rim_band: rim grasps: the rim is the object's points this close to its top.
    """

    max_width: float = 0.075
    grasp_depth: float = 0.03
    min_depth: float = 0.012
    floor_clearance: float = 0.012
    margin: float = 0.008
    rim_depth: float = 0.01
    rim_band: float = 0.01


@dataclass(frozen=True)
class Grasp:
    """A top-down grasp: eef ``position (3,)``, ``yaw``, the object's ``top`` height, and
    whether the gripper clears every other object (``clear``)."""

    position: np.ndarray
    yaw: float
    top: float
    clear: bool = True


def wrap_angle(angle: float) -> float:
    """``angle`` wrapped into ``[-pi, pi)``."""
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def down_rotation(yaw: float) -> np.ndarray:
    """The eef rotation ``(3, 3)`` pointing straight down with finger heading ``yaw``."""
    c, s = np.cos(yaw), np.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]) @ DOWN


def yaw_of(rotation: np.ndarray) -> float:
    """Yaw of a down-pointing eef rotation matrix: the heading of its x (finger) axis."""
    return float(np.arctan2(rotation[1, 0], rotation[0, 0]))


def _turn(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """z of ``(b - a) x (c - a)``: positive for a left (counter-clockwise) turn."""
    return float((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]))


def convex_hull(points_xy: np.ndarray) -> np.ndarray:
    """Counter-clockwise convex hull ``(K, 2)`` of ``(P, 2)`` points (monotone chain)."""
    pts = np.unique(np.asarray(points_xy, float), axis=0)
    if len(pts) < 3:
        return pts

    def half(sequence: np.ndarray) -> list[np.ndarray]:
        chain: list[np.ndarray] = []
        for p in sequence:
            while len(chain) >= 2 and _turn(chain[-2], chain[-1], p) <= 0:
                chain.pop()
            chain.append(p)
        return chain[:-1]

    return np.array(half(pts) + half(pts[::-1]))


def polygons_overlap(a: np.ndarray, b: np.ndarray, margin: float = 0.0) -> bool:
    """Whether convex polygons ``a (K, 2)`` and ``b (L, 2)`` come closer than ``margin``.

    Separating-axis test on the edge normals of both (a gap of ``margin`` along any of them
    separates them; this under-reports corner-to-corner gaps, so it errs towards overlap).
    """
    for polygon in (a, b):
        if len(polygon) < 2:
            continue
        edges = np.roll(polygon, -1, axis=0) - polygon
        normals = np.stack([-edges[:, 1], edges[:, 0]], axis=1)
        lengths = np.linalg.norm(normals, axis=1)
        for normal in normals[lengths > 1e-12] / lengths[lengths > 1e-12, None]:
            pa, pb = a @ normal, b @ normal
            if pa.max() + margin <= pb.min() or pb.max() + margin <= pa.min():
                return False
    return True


def segment_polygon(start: np.ndarray, end: np.ndarray, half_width: float) -> np.ndarray:
    """The rectangle ``(4, 2)`` swept by a disc of radius ``half_width`` along ``start -> end``."""
    direction = end - start
    length = float(np.linalg.norm(direction))
    unit = direction / length if length > 1e-9 else np.array([1.0, 0.0])
    side = np.array([-unit[1], unit[0]]) * half_width
    back, front = start - unit * half_width, end + unit * half_width
    return np.array([back - side, front - side, front + side, back + side])


def finger_width(points_xy: np.ndarray, yaw: float) -> tuple[float, np.ndarray]:
    """Object width along the finger axis at ``yaw`` and the centre of its extent.

    Args:
        points_xy: ``(P, 2)`` object points.

    Returns:
        ``(width, centre (2,))``: ``centre`` is the middle of the object's extent along the
        finger axis and across it, in world xy.
    """
    axis = np.array([np.cos(yaw), np.sin(yaw)])  # eef x axis of down_rotation(yaw)
    across = np.array([-axis[1], axis[0]])
    along, side = points_xy @ axis, points_xy @ across
    centre = axis * (along.max() + along.min()) / 2 + across * (side.max() + side.min()) / 2
    return float(np.ptp(along)), centre


def gripper_footprints(
    boxes: Sequence[tuple[np.ndarray, np.ndarray]], position: np.ndarray, yaw: float
) -> list[tuple[np.ndarray, float]]:
    """World xy rectangles ``(4, 2)`` and bottom heights of the gripper boxes at a pose.

    Args:
        boxes: ``(low (3,), high (3,))`` per gripper part in the grip-site frame.
        position: eef position ``(3,)``; the eef points down with heading ``yaw``.
    """
    rotation = down_rotation(yaw)
    out = []
    for low, high in boxes:
        corners = np.array(
            [
                [x, y, 0.0]
                for x, y in (
                    (low[0], low[1]),
                    (high[0], low[1]),
                    (high[0], high[1]),
                    (low[0], high[1]),
                )
            ]
        )
        xy = (corners @ rotation.T)[:, :2] + position[:2]
        out.append((xy, float(position[2] - high[2])))  # site z points down
    return out


@dataclass(frozen=True)
class Obstacles:
    """Obstacle pieces as horizontal footprints (convex hulls) with their top heights.

    Build with :meth:`of` from world points ``(K, 3)`` per piece (one per collision geom:
    the hull of a whole cabinet would cover the open drawer in front of it). Axis-aligned
    bounds make most queries skip the polygon test.
    """

    hulls: tuple[np.ndarray, ...]
    tops: np.ndarray  # (N,)
    low: np.ndarray  # (N, 2) xy bounds of each hull
    high: np.ndarray  # (N, 2)

    @classmethod
    def of(cls, pieces: Sequence[np.ndarray]) -> Obstacles:
        hulls = tuple(convex_hull(p[:, :2]) for p in pieces)
        empty = np.zeros((0, 2))
        return cls(
            hulls=hulls,
            tops=np.array([float(p[:, 2].max()) for p in pieces]),
            low=np.array([h.min(axis=0) for h in hulls]) if hulls else empty,
            high=np.array([h.max(axis=0) for h in hulls]) if hulls else empty,
        )

    def overlapping(self, polygon: np.ndarray, above: float, margin: float) -> np.ndarray:
        """Indices of pieces higher than ``above`` within ``margin`` of ``polygon (K, 2)``."""
        low, high = polygon.min(axis=0) - margin, polygon.max(axis=0) + margin
        near = (
            (self.tops > above) & np.all(self.low < high, axis=1) & np.all(self.high > low, axis=1)
        )
        return np.array(
            [i for i in np.flatnonzero(near) if polygons_overlap(polygon, self.hulls[i], margin)],
            dtype=int,
        )


def _collides(
    footprints: list[tuple[np.ndarray, float]], obstacles: Obstacles, margin: float
) -> bool:
    """Whether a gripper part ``(rectangle, bottom)`` overlaps an obstacle rising above it."""
    return any(len(obstacles.overlapping(rect, bottom, margin)) for rect, bottom in footprints)


def clear_yaw(
    position: np.ndarray,
    yaws: Sequence[float],
    obstacles: Sequence[np.ndarray],
    gripper: Sequence[tuple[np.ndarray, np.ndarray]],
    margin: float,
) -> float | None:
    """The first of ``yaws`` at which the gripper (boxes in the grip-site frame) pointing down
    at ``position (3,)`` misses every obstacle piece ``(Q, 3)``; ``None`` if none does."""
    hulls = Obstacles.of(obstacles)
    for yaw in yaws:
        if not _collides(gripper_footprints(gripper, position, yaw), hulls, margin):
            return float(yaw)
    return None


def plan_grasp(
    points: np.ndarray,
    obstacles: Sequence[np.ndarray],
    gripper: Sequence[tuple[np.ndarray, np.ndarray]],
    current_yaw: float,
    limits: GraspLimits,
    eef_xy: np.ndarray | None = None,
) -> Grasp:
    """A top-down grasp of an object ``(P, 3)`` that keeps the gripper off ``obstacles``.

    Args:
        points: the object's world points.
        obstacles: the other objects' world points, one ``(Q, 3)`` array each.
        gripper: the gripper's boxes in the grip-site frame (fingers open).
        current_yaw: the eef's yaw now (the least rotation is preferred).
        eef_xy: the eef's position now (rim grasps: of two sides needing the same rotation,
            the nearer wins).

    Returns:
        The first collision-free candidate (deepest height first, then narrowest width,
        then least rotation); if there is none, the preferred candidate at the deepest
        height with ``clear=False``. An object wider than ``max_width`` at every yaw gets
        :func:`plan_rim_grasp`.
    """
    yaws = current_yaw + np.deg2rad(np.arange(-90, 90, YAW_STEP_DEG))
    widths = np.array([finger_width(points[:, :2], yaw)[0] for yaw in yaws])
    if widths.min() > limits.max_width:
        return plan_rim_grasp(points, obstacles, gripper, current_yaw, limits, eef_xy)
    rank = np.floor((widths - widths.min()) / WIDTH_TIE)
    order = [
        i for i in np.lexsort((np.abs(yaws - current_yaw), rank)) if widths[i] <= limits.max_width
    ]
    hulls = Obstacles.of(obstacles)
    top, bottom = float(points[:, 2].max()), float(points[:, 2].min())
    deepest = max(top - limits.grasp_depth, bottom + limits.floor_clearance)
    heights = np.arange(deepest, max(deepest, top - limits.min_depth) + 1e-9, HEIGHT_STEP)
    for height in heights:
        for i in order:
            _, centre = finger_width(points[:, :2], yaws[i])
            position = np.array([centre[0], centre[1], height])
            if not _collides(gripper_footprints(gripper, position, yaws[i]), hulls, limits.margin):
                return Grasp(position, wrap_angle(yaws[i]), top)
    _, centre = finger_width(points[:, :2], yaws[order[0]])
    position = np.array([centre[0], centre[1], deepest])
    return Grasp(position, wrap_angle(yaws[order[0]]), top, clear=False)


def plan_rim_grasp(
    points: np.ndarray,
    obstacles: Sequence[np.ndarray],
    gripper: Sequence[tuple[np.ndarray, np.ndarray]],
    current_yaw: float,
    limits: GraspLimits,
    eef_xy: np.ndarray | None = None,
) -> Grasp:
    """A grasp of a wide open object (a bowl) by its rim, fingers across the wall.

    The rim is the object's points within ``rim_band`` of its top; the eef goes to the
    middle of their radial extent (the wall) from the centre of their xy extent,
    ``rim_depth`` below the top, with the fingers pointing at the centre. Sides are tried
    every 10 degrees, least hand rotation first (the gripper is symmetric, so opposite sides
    tie; the one nearer ``eef_xy`` goes first), and the first that keeps the gripper off
    ``obstacles`` wins (else the first, with ``clear=False``).
    """
    top = float(points[:, 2].max())
    rim = points[points[:, 2] > top - limits.rim_band, :2]
    centre = (rim.min(axis=0) + rim.max(axis=0)) / 2
    radii = np.linalg.norm(rim - centre, axis=1)
    radius = float(radii.min() + radii.max()) / 2  # the middle of the wall's thickness
    sides = np.deg2rad(np.arange(0, 360, 10))
    # the hand's yaw for side s: s or s + pi (the same grasp), whichever is nearer now
    turns = np.array([wrap_angle(2 * (s - current_yaw)) / 2 for s in sides])
    hulls = Obstacles.of(obstacles)
    height = top - limits.rim_depth
    spots = centre + radius * np.stack([np.cos(sides), np.sin(sides)], axis=1)
    distance = np.zeros(len(sides)) if eef_xy is None else np.linalg.norm(spots - eef_xy, axis=1)
    grasps = [
        Grasp(
            np.array([*spots[i], height]),
            wrap_angle(current_yaw + turns[i]),
            top,
        )
        for i in np.lexsort((distance, np.round(np.abs(turns), 6)))  # rounding: exact ties
    ]
    for grasp in grasps:
        if not _collides(
            gripper_footprints(gripper, grasp.position, grasp.yaw), hulls, limits.margin
        ):
            return grasp
    return Grasp(grasps[0].position, grasps[0].yaw, top, clear=False)


def path_obstacle_top(
    start_xy: np.ndarray,
    end_xy: np.ndarray,
    obstacles: Sequence[np.ndarray],
    half_width: float,
) -> float:
    """Highest obstacle piece whose footprint comes within ``half_width`` of the segment.

    Args:
        obstacles: world points ``(Q, 3)`` of each piece that may be in the way.

    Returns:
        The height, or ``-inf`` when the path is clear.
    """
    corridor = segment_polygon(np.asarray(start_xy, float), np.asarray(end_xy, float), half_width)
    pieces = Obstacles.of(obstacles)
    hit = pieces.overlapping(corridor, -np.inf, 0.0)
    return float(pieces.tops[hit].max()) if len(hit) else -np.inf
