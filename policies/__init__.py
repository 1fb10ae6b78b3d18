"""Policies and video encoders. Importing this package registers every policy and every
video encoder (``encoders/``) in ``embodied_rl.registry``."""

import embodied_rl  # noqa: F401  (first: installs the torchvision fix transformers needs)

# isort: split
from policies import (
    causal_lm,  # noqa: F401  (registers "causal_lm")
    commands,  # noqa: F401  (registers the CLI command "inspect")
    encoders,  # noqa: F401  (registers "video_encoder.cheap", "video_encoder.vjepa2")
    export,  # noqa: F401  (registers each policy's exporter: embodied-rl export)
    flow_vla,  # noqa: F401  (registers "flow_vla")
    mlp,  # noqa: F401  (registers "mlp")
    openvla,  # noqa: F401  (registers "openvla")
    openvla_oft,  # noqa: F401  (registers "openvla_oft")
    world_model,  # noqa: F401  (registers "world_model.vjepa2")
)
