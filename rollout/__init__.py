"""Rollout nodes. Importing this package registers them in ``embodied_rl.registry``."""

# Registers "rollout.env", "rollout.llm", "rollout.llm_agent", "rollout.llm_multiturn",
# "rollout.videos" and "rollout.save_episodes".
from rollout import agents, env, llm, multiturn, save_episodes, videos  # noqa: F401
