"""Text tasks (problem generators) and their rule-based reward nodes.

Importing this package registers the reward node types (``reward.arithmetic``).
"""

from embodied_rl.tasks import arithmetic  # noqa: F401  (registers "reward.arithmetic")
