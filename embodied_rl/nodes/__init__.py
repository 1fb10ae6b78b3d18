"""Built-in node types of the core (data, advantage, log-probs, training, SFT).

Importing this package registers them; plugin packages register rollout and reward nodes.
"""

from embodied_rl.nodes import (  # noqa: F401
    advantage,
    critic,
    data,
    evaluation,
    faults,
    filters,
    marft,
    rewards,
    sft,
    srpo,
    train,
)
