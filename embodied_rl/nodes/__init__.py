"""Built-in node types of the core. A node type ``<prefix>.<name>`` lives in the module (or
package) ``embodied_rl.nodes.<prefix>``: ``advantage.gae`` in ``nodes/advantage.py``,
``reward.srpo`` in ``nodes/reward/``. Rollout nodes (``rollout.*``) live in the ``rollout``
plugin package. ``tests/embodied_rl/test_node_layout.py`` checks the rule for every type.

Importing this package registers them.
"""

from embodied_rl.nodes import (  # noqa: F401
    actor,
    advantage,
    critic,
    data,
    encode,
    eval,
    fault,
    filter,
    ref,
    reward,
    sft,
    world_model,
)
