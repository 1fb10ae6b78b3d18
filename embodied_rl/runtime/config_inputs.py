"""Checks of a run's inputs on the driver, before anything is written or a worker starts.

Node configs offer two optional methods that this module calls (no node type is named here):

- ``check_inputs()``: open and check the files the node will read (data files, demo folders)
  and raise ``ValueError`` naming the file, what is wrong and the fix; the workers read the
  same files again at setup, so this costs a driver-side open, not a second full pass.
- ``ids_written()`` on a node that draws ids (task and init-state ids) and ``ids_accepted()``
  on one that consumes them (a rollout, asking its simulator): each returns
  ``{batch key: (exclusive bound, what sets it)}``; a consumer whose upstream writer draws
  ids its simulator does not have is refused here rather than at step 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from embodied_rl.dag.graph import DagSpec, NodeSpec
from embodied_rl.runtime.config_errors import ConfigError

_ID_NAMES = {"task_id": "tasks", "init_state_id": "init states per task"}
_PRESET_KEYS = {
    "task_id": "simulator.num_tasks or data.tasks",
    "init_state_id": "simulator.num_init_states",
}


def check_inputs(dags: Iterable[DagSpec]) -> None:
    """Every node's input files, then the id ranges along each DAG.

    Raises:
        ConfigError: one line naming the node, the file or setting, and the fix.
    """
    for dag in dags:
        for node in dag.nodes:
            _check_node_files(node)
        for node in dag.nodes:
            _check_ids(dag, node)


def _check_node_files(node: NodeSpec) -> None:
    check = getattr(node.config, "check_inputs", None)
    if check is None:
        return
    try:
        check()
    except (ValueError, OSError) as err:
        problem, has_fix, fix = str(err).partition(". Fix: ")
        if not has_fix:
            fix = "correct the file, or point the node's config at another"
        raise ConfigError(f"node {node.id!r}: {problem}", fix) from None


def _check_ids(dag: DagSpec, node: NodeSpec) -> None:
    """The ids the upstream writers of ``node`` draw fit what ``node`` accepts."""
    accepted = getattr(node.config, "ids_accepted", None)
    if accepted is None:
        return
    limits = accepted()
    for writer_id in sorted(dag.ancestors(node.id)):
        written = getattr(dag.by_id[writer_id].config, "ids_written", None)
        if written is None:
            continue
        for key, (bound, setting) in written().items():
            if key not in limits or bound <= limits[key][0]:
                continue
            limit, who = limits[key]
            name, preset = setting.split("=")[0], _PRESET_KEYS.get(key, key)
            raise ConfigError(
                f"node {writer_id!r} draws {key} up to {bound - 1} ({setting}), but node "
                f"{node.id!r} runs {who}, which has {limit} {_ID_NAMES.get(key, key)} "
                f"(ids 0..{limit - 1})",
                f"lower {name} to fit {limit} (the presets set it from {preset}), or choose "
                "a simulator configuration that has that many",
            )
