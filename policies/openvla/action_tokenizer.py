"""OpenVLA action tokens, de-normalisation and the LIBERO gripper convention.

Discretisation (the convention the released OpenVLA / OpenVLA-OFT checkpoints were trained
with, ``prismatic.vla.action_tokenizer``):

- ``edges = linspace(-1, 1, 256)`` (256 edges, so 255 bins plus the value 1.0 itself) and
  ``centers = (edges[:-1] + edges[1:]) / 2`` (255 centres).
- Encode: clip to [-1, 1], ``d = digitize(x, edges)`` in [1, 256], ``token = V - d`` where
  ``V`` is the tokenizer vocabulary (32000 for Llama-2). Token ids are therefore the last 256
  ids ``[V - 256, V)``, with *larger* actions on *smaller* ids.
- Decode: ``centers[clip(V - token - 1, 0, 254)]`` (ids ``V - 256`` and ``V - 255`` both decode
  to the top centre).

The 256 action ids sit at positions ``[V - 256, V)`` of the (padded) LM output, so the action
logits are ``logits[..., V - 256 - P : V - P]`` for a padded size ``P`` (``-320:-64`` for
32000/32064). "Index" below means the position in that 256-wide slice:
``index = token - (V - 256)``, i.e. the slice position the policy samples.

De-normalisation (BOUNDS_Q99): ``a = 0.5 * (x + 1) * (q99 - q01) + q01`` where the statistics'
``mask`` is true, identity elsewhere (the gripper). The LIBERO gripper convention maps the
policy's gripper output in [0, 1] to ``-sign(2x - 1)`` (-1 open, +1 close).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

N_ACTION_BINS = 256
GRIPPER_CONVENTIONS = ("none", "libero")


class ActionTokenizer:
    """Maps continuous actions in [-1, 1] to the last ``n_bins`` ids of a vocabulary and back.

    Args:
        vocab_size: ``V``, one past the last action token id (the tokenizer's vocabulary
            without the LM's padding rows; 32000 for OpenVLA).
        padded_vocab_size: rows of the LM output layer (32064 for OpenVLA); ``vocab_size``
            when the LM is not padded.
        n_bins: number of action ids (256).
    """

    def __init__(
        self, vocab_size: int, padded_vocab_size: int | None = None, n_bins: int = N_ACTION_BINS
    ) -> None:
        padded = vocab_size if padded_vocab_size is None else padded_vocab_size
        if n_bins < 2 or vocab_size < n_bins or padded < vocab_size:
            raise ValueError(
                f"need 2 <= n_bins ({n_bins}) <= vocab_size ({vocab_size}) <= "
                f"padded_vocab_size ({padded})"
            )
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded
        self.n_bins = n_bins
        # Explicit CPU device: policies are built under ``torch.device("meta")`` when loading.
        self.edges = torch.linspace(-1.0, 1.0, n_bins, dtype=torch.float64, device="cpu")
        self.centers = (self.edges[:-1] + self.edges[1:]) / 2

    @property
    def first_id(self) -> int:
        """The smallest action token id, ``V - n_bins``."""
        return self.vocab_size - self.n_bins

    @property
    def logit_slice(self) -> slice:
        """Slice of the (padded) LM logits' last dim holding the action ids, from the end."""
        stop = self.vocab_size - self.padded_vocab_size
        return slice(self.first_id - self.padded_vocab_size, stop if stop < 0 else None)

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Token ids (int64, same shape) of normalised actions (any shape, clipped to [-1, 1])."""
        clipped = actions.to(torch.float64).clamp(-1.0, 1.0)
        # bucketize(right=True) is numpy's digitize: edges[d-1] <= x < edges[d].
        digitized = torch.bucketize(clipped, self.edges.to(clipped.device), right=True)
        return self.vocab_size - digitized

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Bin centres (float32, same shape) of action token ids."""
        index = (self.vocab_size - tokens.long() - 1).clamp(0, self.centers.numel() - 1)
        return self.centers.to(tokens.device)[index].float()

    def index_to_token(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of positions in the 256-wide action-logit slice."""
        return index.long() + self.first_id

    def token_to_index(self, tokens: torch.Tensor) -> torch.Tensor:
        """Positions in the action-logit slice of token ids; raises on non-action ids."""
        index = tokens.long() - self.first_id
        if bool(((index < 0) | (index >= self.n_bins)).any()):
            bad = tokens[(index < 0) | (index >= self.n_bins)].unique()[:8].tolist()
            raise ValueError(
                f"token ids {bad} are not action tokens (valid ids: {self.first_id}.."
                f"{self.vocab_size - 1}); were they sampled by a policy with another vocabulary?"
            )
        return index


def select_statistics(
    norm_stats: Mapping[str, Any] | None, unnorm_key: str | None
) -> Mapping[str, Any] | None:
    """The statistics entry (``{"action": {...}, "proprio": {...}}``) of one dataset.

    Args:
        norm_stats: ``{dataset_name: {"action": {"q01": [...], "q99": [...], "mask": [...]},
            "proprio": {...}}}`` as in ``config.json``'s ``norm_stats`` or
            ``dataset_statistics.json``; ``None`` when the model has none.
        unnorm_key: the dataset name; may be omitted when there is exactly one.

    Returns:
        The entry, or ``None`` when there are no statistics and no key was asked for.
    """
    if not norm_stats:
        if unnorm_key is not None:
            raise ValueError(
                f"unnorm_key={unnorm_key!r} but the model has no dataset statistics "
                "(no norm_stats in config.json, no dataset_statistics.json); unset unnorm_key"
            )
        return None
    if unnorm_key is None:
        if len(norm_stats) != 1:
            raise ValueError(
                f"the model has statistics of {len(norm_stats)} datasets; set unnorm_key to one "
                f"of {sorted(norm_stats)}"
            )
        unnorm_key = next(iter(norm_stats))
    if unnorm_key not in norm_stats:
        raise ValueError(f"unnorm_key {unnorm_key!r} is not one of {sorted(norm_stats)}")
    return norm_stats[unnorm_key]


def _bounds(stats: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    low = np.asarray(stats["q01"], dtype=np.float64)
    high = np.asarray(stats["q99"], dtype=np.float64)
    mask = np.asarray(stats.get("mask", np.ones_like(low, dtype=bool)), dtype=bool)
    return low, high, mask


def unnormalize_actions(normalized: np.ndarray, stats: Mapping[str, Any] | None) -> np.ndarray:
    """Map normalised actions back to dataset units with its q01/q99 statistics.

    Args:
        normalized: (..., A) values in [-1, 1].
        stats: ``{"q01": (A,), "q99": (A,), "mask": (A,) optional}``; ``None`` = identity.

    Returns:
        (..., A) float64 ``0.5 * (x + 1) * (q99 - q01) + q01`` where mask, ``x`` elsewhere.
    """
    x = np.asarray(normalized, dtype=np.float64)
    if stats is None:
        return x
    low, high, mask = _bounds(stats)
    if low.shape[-1] != x.shape[-1]:
        raise ValueError(f"statistics have {low.shape[-1]} action dims, actions {x.shape[-1]}")
    return np.where(mask, 0.5 * (x + 1.0) * (high - low) + low, x)


def normalize_proprio(state: torch.Tensor, stats: Mapping[str, Any] | None) -> torch.Tensor:
    """Proprio state to [-1, 1] with q01/q99 (OpenVLA-OFT's BOUNDS_Q99), clipped.

    Args:
        state: (N, S) float.
        stats: the ``proprio`` statistics entry; ``None`` = identity.

    Returns:
        (N, S) ``clip(2 (s - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)`` where mask, ``s`` elsewhere.
    """
    if stats is None:
        return state
    low, high, mask = (torch.as_tensor(v, device=state.device) for v in _bounds(stats))
    scaled = 2.0 * (state.double() - low) / (high - low + 1e-8) - 1.0
    return torch.where(mask, scaled.clamp(-1.0, 1.0), state.double()).to(state.dtype)


def libero_gripper(actions: np.ndarray) -> np.ndarray:
    """LIBERO gripper convention on the last action dim (a copy; other dims unchanged).

    OpenVLA's data loader flips the gripper to 0 = close, 1 = open; LIBERO wants -1 = open,
    +1 = close. So ``g -> 2g - 1`` (to [-1, 1]), binarised with ``sign``, then negated.
    ``g = 0.5`` exactly gives 0 (as ``np.sign`` does).

    Args:
        actions: (..., A) with the gripper command in [0, 1] at index ``A - 1``.
    """
    out = np.array(actions, dtype=np.float64, copy=True)
    out[..., -1] = -np.sign(2.0 * out[..., -1] - 1.0)
    return out


@dataclass
class ActionPostprocessor:
    """Normalised policy actions -> environment-ready actions.

    Attributes:
        stats: the ``action`` statistics (q01/q99/mask) or ``None`` for identity.
        gripper_convention: ``"none"`` or ``"libero"`` (see :func:`libero_gripper`).
    """

    stats: Mapping[str, Any] | None = None
    gripper_convention: str = "none"

    def __post_init__(self) -> None:
        if self.gripper_convention not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"gripper_convention {self.gripper_convention!r} is not one of "
                f"{list(GRIPPER_CONVENTIONS)}"
            )

    def __call__(self, normalized: np.ndarray) -> np.ndarray:
        """(..., A) normalised actions -> (..., A) float32 environment actions."""
        actions = unnormalize_actions(normalized, self.stats)
        if self.gripper_convention == "libero":
            actions = libero_gripper(actions)
        return actions.astype(np.float32)
