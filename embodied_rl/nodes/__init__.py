"""Built-in node types of the core (data, advantage, log-probs, training).

Importing this package registers them; plugin packages register rollout and reward nodes.
"""

from embodied_rl.nodes import advantage, critic, data, faults, filters, rewards, srpo, train  # noqa: F401
