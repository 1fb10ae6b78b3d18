"""Privileged state of a LIBERO scene for the scripted planner: poses, shapes, regions, grasp.

:class:`PrivilegedScene` reads the robosuite/BDDL env that ``OffScreenRenderEnv`` wraps (``env.env``):
the end effector's pose, the world-frame points of an object's collision geoms (its shape as
the physics sees it), the box of a goal region, whether the fingers grasp an object, and the
OSC controller's action scaling. Everything is read from ``sim.data`` at call time, so a
planner that calls it at the start of each phase sees the current state.

Frames: world frame throughout (robosuite's OSC_POSE takes deltas in the world frame:
``goal_pos = eef_pos + delta``, ``goal_ori = R(delta) @ eef_ori``; LIBERO's robot base has
no rotation). Quaternions: MuJoCo ``sim.data`` is ``(w, x, y, z)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

# Local half-extents of primitive geoms from their ``geom_size`` (MuJoCo conventions).
_PRIMITIVE_EXTENTS = {
    int(mujoco.mjtGeom.mjGEOM_BOX): lambda s: s[:3],
    int(mujoco.mjtGeom.mjGEOM_SPHERE): lambda s: np.full(3, s[0]),
    int(mujoco.mjtGeom.mjGEOM_CYLINDER): lambda s: np.array([s[0], s[0], s[1]]),
    int(mujoco.mjtGeom.mjGEOM_CAPSULE): lambda s: np.array([s[0], s[0], s[1] + s[0]]),
    int(mujoco.mjtGeom.mjGEOM_ELLIPSOID): lambda s: s[:3],
}
_CORNERS = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], float)


@dataclass(frozen=True)
class RegionBox:
    """An axis-aligned box in the world frame (LIBERO's ``SiteObject.in_box`` test).

    Attributes:
        low, high: ``(3,)`` corners.
    """

    low: np.ndarray
    high: np.ndarray

    @property
    def center(self) -> np.ndarray:
        return (self.low + self.high) / 2


@dataclass(frozen=True)
class Joint:
    """A fixture's 1-dof joint (a drawer's slide, a knob's hinge) as it is now.

    Attributes:
        name: the MuJoCo joint name (``wooden_cabinet_1_top_level``).
        qpos: its position (metres for a slide, radians for a hinge).
        axis: ``(3,)`` world-frame unit axis: a slide moves its body by ``qpos * axis``.
        body: id of the body it moves (the drawer, the knob).
        anchor: ``(3,)`` world point on the axis (a hinge turns its body about it).
    """

    name: str
    qpos: float
    axis: np.ndarray
    body: int
    anchor: np.ndarray


class PrivilegedScene:
    """Read-only privileged view of one LIBERO env (the BDDL env inside ``OffScreenRenderEnv``).

    Args:
        env: an ``OffScreenRenderEnv`` (or its ``.env``) after ``reset``; call
            :meth:`refresh` after every later ``reset`` (the MuJoCo model is rebuilt).
    """

    def __init__(self, env: Any) -> None:
        self.env = getattr(env, "env", env)
        self.refresh()

    def refresh(self) -> None:
        """Re-bind to the env's current MuJoCo model and data (after a reset)."""
        self.model = self.env.sim.model._model  # raw mujoco.MjModel behind robosuite's MjSim
        self.data = self.env.sim.data._data
        self.robot = self.env.robots[0]
        self._local_points: dict[str, list[tuple[int, np.ndarray]]] = {}

    # --- robot --------------------------------------------------------------------------------
    def eef_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """``(position (3,), rotation matrix (3, 3))`` of the grip site, world frame."""
        site = self.robot.eef_site_id
        return self.data.site_xpos[site].copy(), self.data.site_xmat[site].reshape(3, 3).copy()

    def base_position(self) -> np.ndarray:
        """``(3,)`` world position of the robot's base (its root body)."""
        return self.env.sim.data.get_body_xpos(self.robot.robot_model.root_body).copy()

    def finger_opening(self) -> float:
        """Distance between the two finger joints in metres (about 0.08 open, 0 closed)."""
        qpos = self.data.qpos[self.robot._ref_gripper_joint_pos_indexes]
        return float(np.sum(np.abs(qpos)))

    def joint_positions(self) -> np.ndarray:
        """``(7,)`` arm joint positions (LIBERO's ``obs/joint_states``)."""
        return self.data.qpos[self.robot._ref_joint_pos_indexes].copy()

    def robot_state_vector(self) -> np.ndarray:
        """``(9,)`` gripper qpos (2), eef position (3), eef quaternion (4, ``x, y, z, w``).

        LIBERO's ``get_robot_state_vector``, computed from the sim like robosuite's
        observables (the eef quaternion is the hand body's).
        """
        gripper = self.data.qpos[self.robot._ref_gripper_joint_pos_indexes]
        position, _ = self.eef_pose()
        hand = self.model.body(self.robot.robot_model.eef_name).id
        w, x, y, z = self.data.xquat[hand]
        return np.concatenate([gripper, position, [x, y, z, w]])

    def flat_state(self) -> np.ndarray:
        """The flattened MuJoCo state (LIBERO's ``states``; what ``set_init_state`` takes)."""
        return np.asarray(self.env.sim.get_state().flatten())

    def action_scale(self) -> tuple[np.ndarray, np.ndarray]:
        """``(position (3,), rotation (3,))``: metres / radians of one action unit.

        OSC_POSE maps an input of ``input_max`` to ``output_max`` (robosuite's default config:
        0.05 m and 0.5 rad).
        """
        controller = self.robot.controller
        scale = np.asarray(controller.output_max, float) / np.asarray(controller.input_max, float)
        return scale[:3].copy(), scale[3:6].copy()

    def gripper_boxes(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Bounding boxes ``(low (3,), high (3,))`` of the gripper's collision geoms (hand,
        fingers, pads) in the grip-site frame, at the fingers' current opening."""
        position, rotation = self.eef_pose()
        boxes = []
        for name in self.robot.gripper.contact_geoms:
            geom = self.env.sim.model.geom_name2id(name)
            world = self._world_points(geom, self._geom_local_points(geom))
            local = (world - position) @ rotation
            boxes.append((local.min(axis=0), local.max(axis=0)))
        return boxes

    def is_grasping(self, name: str) -> bool:
        """Whether both finger pads touch object ``name`` (robosuite's grasp test)."""
        return bool(self.env._check_grasp(self.robot.gripper, self.env.get_object(name)))

    def success(self) -> bool:
        """The task's own success test (all goal predicates hold)."""
        return bool(self.env._check_success())

    def holds(self, predicate: str, args: tuple[str, ...]) -> bool:
        """Whether one goal predicate holds now, by LIBERO's own test (the one
        :meth:`success` runs for each predicate of the goal), e.g. ``holds("in", ("bowl_1",
        "basket_1_contain_region"))``; ``predicate`` lower-case, as BDDL's parser gives it."""
        return bool(self.env._eval_predicate([predicate, *args]))

    # --- objects and regions ------------------------------------------------------------------
    def movable_objects(self) -> list[str]:
        """Names of the task's movable objects (``objects_dict``)."""
        return list(self.env.objects_dict)

    def fixtures(self) -> list[str]:
        """Names of the task's fixtures (``fixtures_dict``: cabinets, stoves, racks)."""
        return list(self.env.fixtures_dict)

    def is_site(self, name: str) -> bool:
        """Whether ``name`` is a region site (``object_sites_dict``) rather than a body."""
        return name in self.env.object_sites_dict

    def object_points(self, name: str) -> np.ndarray:
        """World-frame points ``(P, 3)`` spanning the collision geoms of object ``name``.

        Mesh geoms give their vertices, primitives the corners of their local bounding box,
        over every body below the object's root body.
        """
        return np.concatenate(self.object_parts(name))

    def object_parts(self, name: str) -> list[np.ndarray]:
        """:meth:`object_points` per collision geom, ``(K, 3)`` each: convex pieces (a
        drawer's walls, a can's segments) for finer obstacle tests than the whole object."""
        if name not in self._local_points:
            self._local_points[name] = self._collision_geoms(name)
        return [self._world_points(geom, local) for geom, local in self._local_points[name]]

    def object_position(self, name: str) -> np.ndarray:
        """``(3,)`` body position of object ``name`` (what LIBERO's goal tests use)."""
        return self.data.xpos[self.env.obj_body_id[name]].copy()

    def object_speed(self, name: str) -> float:
        """Linear speed (m/s) of object ``name``'s body (world frame)."""
        velocity = np.zeros(6)  # [angular (3), linear (3)]
        body = self.env.obj_body_id[name]
        mujoco.mj_objectVelocity(self.model, self.data, mujoco.mjtObj.mjOBJ_BODY, body, velocity, 0)
        return float(np.linalg.norm(velocity[3:]))

    def region_box(self, name: str) -> RegionBox:
        """The box of region site ``name``, as LIBERO's ``in_box`` computes it.

        ``in_box`` takes the site's half sizes through its rotation (absolute values) and
        lowers the bottom by 1 cm.
        """
        site = self.env.object_sites_dict[name]
        position = self.env.sim.data.get_site_xpos(name).copy()
        rotation = self.env.sim.data.get_site_xmat(name)
        half = np.abs(rotation @ np.asarray(site.size, float))
        low, high = position - half, position + half
        low[2] -= 0.01
        return RegionBox(low=low, high=high)

    # --- articulated fixtures -----------------------------------------------------------------
    def is_open(self, region: str) -> bool:
        """LIBERO's ``Open`` of a fixture region (a drawer past its open threshold)."""
        return bool(self.env.object_states_dict[region].is_open())

    def is_closed(self, region: str) -> bool:
        """LIBERO's ``Close`` of a fixture region or fixture (a drawer, a microwave's door,
        past its close threshold)."""
        return bool(self.env.object_states_dict[region].is_close())

    def is_turned_on(self, obj: str) -> bool:
        """LIBERO's ``Turnon`` of a fixture (a stove's knob past its on threshold)."""
        return bool(self.env.object_states_dict[obj].turn_on())

    def region_joint(self, region: str) -> Joint:
        """The joint that moves region ``region`` (a cabinet drawer's slide)."""
        joints = self.env.object_sites_dict[region].joints
        if not joints:
            raise ValueError(f"region {region!r} has no joint (it is not a drawer)")
        return self._joint(joints[0])

    def object_joint(self, obj: str) -> Joint:
        """The articulation joint of fixture ``obj`` (a stove's knob, a microwave's door)."""
        joints = self.env.get_object(obj).joints
        if not joints:
            raise ValueError(f"object {obj!r} has no joint (it has no knob)")
        return self._joint(joints[0])

    def open_close_qpos(self, region: str) -> tuple[float, float]:
        """Middles of the fixture's ``default_open_ranges`` and ``default_close_ranges`` (a
        wooden cabinet's drawer: -0.15 m and 0.0025 m)."""
        parent = self.env.object_states_dict[region].parent_name
        ranges = self.env.get_object(parent).object_properties["articulation"]
        return (
            float(np.mean(ranges["default_open_ranges"])),
            float(np.mean(ranges["default_close_ranges"])),
        )

    def closed_qpos(self, obj: str) -> float:
        """Middle of fixture ``obj``'s own ``default_close_ranges`` (a microwave's door:
        -0.0025 rad)."""
        ranges = self.env.get_object(obj).object_properties["articulation"]
        return float(np.mean(ranges["default_close_ranges"]))

    def drawer_outward(self, region: str) -> np.ndarray:
        """Unit direction ``(3,)`` in which the drawer of ``region`` opens (its joint's axis,
        signed by which end of its range counts as open)."""
        opened, closed = self.open_close_qpos(region)
        return np.sign(opened - closed) * self.region_joint(region).axis

    def turn_on_qpos(self, obj: str) -> float:
        """Lower end of the fixture's ``default_turnon_ranges`` (a flat stove: 0.5 rad)."""
        ranges = self.env.get_object(obj).object_properties["articulation"]
        return float(min(ranges["default_turnon_ranges"]))

    def body_parts(self, body: int) -> list[np.ndarray]:
        """World points ``(K, 3)`` of each colliding geom of body ``body`` (not its children)."""
        model = self.model
        return [
            self._world_points(geom, self._geom_local_points(geom))
            for geom in range(model.ngeom)
            if model.geom_bodyid[geom] == body
            and (model.geom_contype[geom] or model.geom_conaffinity[geom])
        ]

    def _joint(self, name: str) -> Joint:
        joint = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_JOINT, name)
        return Joint(
            name=name,
            qpos=float(self.data.qpos[self.model.jnt_qposadr[joint]]),
            axis=self.data.xaxis[joint].copy(),
            body=int(self.model.jnt_bodyid[joint]),
            anchor=self.data.xanchor[joint].copy(),
        )

    def _collision_geoms(self, name: str) -> list[tuple[int, np.ndarray]]:
        """``(geom id, local points (K, 3))`` of the colliding geoms of object ``name``."""
        root = self.env.obj_body_id[name]
        model = self.model
        bodies = {root} | {body for body in range(model.nbody) if _is_descendant(model, body, root)}
        geoms = []
        for geom in range(model.ngeom):
            collides = model.geom_contype[geom] or model.geom_conaffinity[geom]
            if model.geom_bodyid[geom] not in bodies or not collides:
                continue
            geoms.append((geom, self._geom_local_points(geom)))
        if not geoms:
            raise ValueError(f"object {name!r} has no collision geoms to plan a grasp on")
        return geoms

    def _world_points(self, geom: int, local: np.ndarray) -> np.ndarray:
        """Geom-frame points ``(K, 3)`` -> world frame, at the geom's current pose."""
        return local @ self.data.geom_xmat[geom].reshape(3, 3).T + self.data.geom_xpos[geom]

    def _geom_local_points(self, geom: int) -> np.ndarray:
        model = self.model
        kind = int(model.geom_type[geom])
        if kind == int(mujoco.mjtGeom.mjGEOM_MESH):
            mesh = model.geom_dataid[geom]
            start, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
            return np.asarray(model.mesh_vert[start : start + count], float)
        if kind not in _PRIMITIVE_EXTENTS:
            raise ValueError(f"geom {geom} has type {kind}, which has no extent rule")
        return _CORNERS * _PRIMITIVE_EXTENTS[kind](np.asarray(model.geom_size[geom], float))


def _is_descendant(model: Any, body: int, root: int) -> bool:
    while body not in (0, root):
        body = int(model.body_parentid[body])
    return body == root and body != 0
