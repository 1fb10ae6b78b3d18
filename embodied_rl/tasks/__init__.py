"""Text tasks (problem generators), their rule-based reward nodes and text environments.

Importing this package registers the reward node types (``reward.arithmetic``,
``reward.digit_team``) and the multi-turn text environments (``running_sum``, ``echo``).
"""

from embodied_rl.tasks import arithmetic, digit_team, echo, running_sum  # noqa: F401
