"""Text tasks: problem generators, their scoring rules and multi-turn text environments.

Importing this package registers the text environments (``running_sum``, ``echo``) in
``TEXT_ENVS``. The reward nodes that apply the scoring rules (``reward.arithmetic``,
``reward.digit_team``) are in :mod:`embodied_rl.nodes.reward.tasks`.
"""

from embodied_rl.tasks import arithmetic, digit_team, echo, running_sum  # noqa: F401
