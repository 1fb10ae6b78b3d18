"""The input kinds a trainable policy scores, and the batch keys its ``evaluate`` reads."""

from __future__ import annotations

from embodied_rl import keys as K

# What ``policy.evaluate`` reads, by the kind of data the policy scores (interfaces.py).
EVALUATE_KEYS = {
    "text": (K.PROMPT_IDS, K.PROMPT_MASK, K.RESPONSE_IDS, K.RESPONSE_MASK),
    "trajectory": (K.STEP_MASK, K.RESPONSE_MASK),
}


def evaluate_keys(inputs: str) -> tuple[str, ...]:
    """Batch keys a policy's ``evaluate`` needs: ``text`` (LLM) or ``trajectory`` (embodied).

    A trajectory policy also reads its own observation and action keys (OBS_STATE and/or
    OBS_IMAGE, ACTION_TOKENS or RAW_ACTIONS), which depend on the policy and are checked by it.
    """
    if inputs not in EVALUATE_KEYS:
        raise ValueError(f"inputs must be one of {sorted(EVALUATE_KEYS)}, got {inputs!r}")
    return EVALUATE_KEYS[inputs]
