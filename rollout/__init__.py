"""Rollout nodes. Importing this package registers them in ``embodied_rl.registry``."""

# Registers "rollout.env", "rollout.llm", "rollout.llm_agent", "rollout.llm_multiturn",
# "rollout.videos", "rollout.save_episodes", "encode.video" and the video encoders.
from rollout import agents, encoders, env, llm, multiturn, save_episodes, videos  # noqa: F401
