"""File names of a saved policy folder (the Hugging Face layout) and which state-dict entries
are normalisation statistics rather than weights.

Shared by the VLA checkpoints (``openvla/loading.py``) and the MLP policy's
``save_pretrained``, so that the MLP policy does not import the VLA package for them.
"""

from __future__ import annotations

CONFIG_FILE = "config.json"
STATISTICS_FILE = "dataset_statistics.json"
INDEX_FILE = "model.safetensors.index.json"
WEIGHTS_FILE = "model.safetensors"
STATISTICS_PREFIX = "normalizer."  # buffers filled from the statistics, not from weight files


def is_statistics_buffer(name: str) -> bool:
    """Whether a state-dict entry is a normalisation buffer (not a published weight)."""
    return name.startswith(STATISTICS_PREFIX)
