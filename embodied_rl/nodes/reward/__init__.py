"""Reward nodes (``reward.*``): each writes REWARDS (B,) or TOKEN_REWARDS (B, R).

- :mod:`~embodied_rl.nodes.reward.outcome`: ``reward.success``, ``reward.turns``.
- :mod:`~embodied_rl.nodes.reward.srpo`: ``reward.srpo`` (world-model progress reward).
- :mod:`~embodied_rl.nodes.reward.tokens`: ``reward.token_rewards``, ``reward.kl_penalty``.
- :mod:`~embodied_rl.nodes.reward.overlong`: ``reward.overlong`` (DAPO).
- :mod:`~embodied_rl.nodes.reward.tasks`: ``reward.arithmetic``, ``reward.digit_team``.

Importing this package registers them all.
"""

from embodied_rl.nodes.reward import outcome, overlong, srpo, tasks, tokens  # noqa: F401
