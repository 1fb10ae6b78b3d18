"""Rollout nodes. Importing this package registers them in ``embodied_rl.registry``."""

from rollout import llm  # noqa: F401  (registers "rollout.llm")
