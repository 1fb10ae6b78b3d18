"""Batch keys: the one place where the names of batch fields are spelled.

Every batch is a ``tensordict.TensorDict`` whose leading dimension is the sample dimension
(``B``). Nodes declare the keys they read and write with these constants, so a typo fails at
import time instead of silently producing an empty field.

Shapes use ``B`` samples, ``P`` prompt tokens (left-padded), ``R`` response tokens
(right-padded), ``T`` environment steps.
"""

# --- identity -------------------------------------------------------------------------
SAMPLE_ID = "sample_id"  # (B,) int64, unique in the whole run step
GROUP_ID = "group_id"  # (B,) int64, samples of one prompt / (task, init state) share it
ROW_INDEX = "row_index"  # (B,) int64, the sample's row in its dataset file (0-based)

# --- LLM prompts and responses ----------------------------------------------------------
PROMPT_TEXT = "prompt_text"  # non-tensor str per sample
ANSWER_TEXT = "answer_text"  # non-tensor str per sample: ground truth for rule rewards
PROMPT_IDS = "prompt_ids"  # (B, P) int64, left-padded
PROMPT_MASK = "prompt_mask"  # (B, P) int64, 1 = real token
RESPONSE_IDS = "response_ids"  # (B, R) int64, right-padded
RESPONSE_MASK = "response_mask"  # (B, R) float32, 1 = generated token (EOS included)
RESPONSE_TEXT = "response_text"  # non-tensor str per sample

# --- RL quantities ------------------------------------------------------------------------
OLD_LOGPROBS = "old_logprobs"  # (B, R) log pi_old of each response token
REF_LOGPROBS = "ref_logprobs"  # (B, R) log pi_ref of each response token
REWARDS = "rewards"  # (B,) float32 scalar reward per sample
TOKEN_REWARDS = "token_rewards"  # (B, R) float32 per-token reward
ADVANTAGES = "advantages"  # (B, R) float32, broadcast over valid tokens/steps
VALUES = "values"  # (B, R) float32 critic values
RETURNS = "returns"  # (B, R) float32

# --- embodied trajectories -------------------------------------------------------------------
OBS_IMAGE = "obs_image"  # (B, T, H, W, 3) uint8, the third-person (agentview) camera
OBS_WRIST_IMAGE = "obs_wrist_image"  # (B, T, H, W, 3) uint8, for policies that read the wrist
OBS_STATE = "obs_state"  # (B, T, S) float32 proprio
ACTIONS = "actions"  # (B, T, A) float32 env actions (demos: (B, C, A), a step's action chunk)
ENV_ACTIONS = "env_actions"  # (B, T, C, A) what the env got at each policy step (to replay it)
ACTION_TOKENS = "action_tokens"  # (B, T, K) int64 discrete action tokens
RAW_ACTIONS = "raw_actions"  # (B, T, K) float32 sampled pre-squash continuous actions
STEP_MASK = "step_mask"  # (B, T) float32, 1 = step before (and at) finish
FINISH_STEP = "finish_step"  # (B,) int64
SUCCESS = "success"  # (B,) bool
# (B,) float32 in [0, 1] at the episode's end, from simulator state the policy cannot see
# (VectorEnv.privileged_progress: 1 exactly at success); NaN where the simulator has none.
# For logging and oracle rewards only, never a policy input.
PRIVILEGED_PROGRESS = "privileged_progress"
TASK_ID = "task_id"  # (B,) int64
INIT_STATE_ID = "init_state_id"  # (B,) int64
PADDED = "padded"  # (B,) bool: a row repeated only to fill the batch (evaluations skip it)
FRAME_COUNT = "frame_count"  # (B,) int64 valid frames in FRAMES (with a frame stride)
FRAMES = "frames"  # (B, T, H, W, 3) uint8 frames of the policy steps (SRPO video encoder)
HAS_VIDEO = "has_video"  # (B,) bool: rollout.videos wrote the episode's video
TRAJ_EMBEDDING = "traj_embedding"  # (B, D) float32, all zero = invalid trajectory

# --- multi-turn interaction (rollout.llm_multiturn) ---------------------------------------
TURN_REWARDS = "turn_rewards"  # (B, U) float32 the environment's reward per model turn, 0 after
NUM_TURNS = "num_turns"  # (B,) int64 model turns taken (<= U = max_turns)
FINAL_REWARDS = "final_rewards"  # (B,) float32 the environment's reward for the whole episode

# --- multi-agent DAGs -------------------------------------------------------------------------
# What one agent of a multi-agent DAG produces for itself and trains on. A node with an
# ``agent: <name>`` field reads and writes these under ``<name>/<key>`` (e.g.
# ``tens/response_ids``), so two agents' rollouts, values and advantages share one batch
# row (one joint episode) without overwriting each other. Everything else (sample and group
# ids, the task's prompt and answer, the team REWARDS) is shared by all agents.
AGENT_FIELDS = frozenset(
    {
        PROMPT_IDS,
        PROMPT_MASK,
        RESPONSE_IDS,
        RESPONSE_MASK,
        RESPONSE_TEXT,
        OLD_LOGPROBS,
        REF_LOGPROBS,
        TOKEN_REWARDS,
        ADVANTAGES,
        VALUES,
        RETURNS,
    }
)
AGENT_SEPARATOR = "/"


def agent_key(agent: str, key: str) -> str:
    """``<agent>/<key>``: agent ``agent``'s own copy of the per-agent field ``key``."""
    return f"{agent}{AGENT_SEPARATOR}{key}"


def key_of_agent(agent: str | None, key: str) -> str:
    """What a node of ``agent`` (``None``: of no agent) means by ``key`` in the batch."""
    return agent_key(agent, key) if agent is not None and key in AGENT_FIELDS else key


def owning_agent(key: str) -> str | None:
    """The agent whose namespace ``key`` is in (``tens/response_ids`` -> ``tens``), else None."""
    agent, sep, field_name = key.partition(AGENT_SEPARATOR)
    return agent if sep and field_name in AGENT_FIELDS else None


ALL_KEYS = frozenset(
    v
    for k, v in dict(globals()).items()
    if k.isupper() and isinstance(v, str) and k != "AGENT_SEPARATOR"
)

# The batch key of each camera a policy may read (``interfaces.policy_cameras``), in the order a
# policy reading several takes them (OpenVLA-OFT's: the third-person camera, then the wrist).
CAMERA_KEYS = {"agentview": OBS_IMAGE, "wrist": OBS_WRIST_IMAGE}
CAMERAS = tuple(CAMERA_KEYS)
