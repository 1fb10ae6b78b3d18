"""Action and proprio normalisation that travels with a policy's weights.

Policies output *normalised* actions in [-1, 1] and read normalised proprio; the statistics
that map between those and the environment's units are persistent buffers of a
:class:`Normalizer` sub-module, so every checkpoint, resume and ``init_from`` carries them.

Statistics use OpenVLA's ``norm_stats`` entry format (``embodied_rl.data.demos.
dataset_statistics`` writes it, published checkpoints ship it in ``config.json`` /
``dataset_statistics.json``)::

    {"action": {"q01": [...], "q99": [...], "mask": [...]}, "proprio": {...}}

Maps (BOUNDS_Q99, as OpenVLA / OpenVLA-OFT; ``m`` is the entry's ``mask``):

- forward, policy output ``x`` -> env action ``a`` (:meth:`Normalizer.to_env`):
  ``a = 0.5 (x + 1)(q99 - q01) + q01`` where ``m``, ``a = x`` elsewhere; then the gripper
  convention: ``"libero"`` maps the last dimension ``g`` (OpenVLA's 1 = open, 0 = close) to
  ``-sign(2g - 1)`` (LIBERO's -1 = open, +1 = close); ``"none"`` leaves it.
- inverse, env action ``a`` -> training target ``x`` (:meth:`Normalizer.from_env`): the
  gripper first (``"libero"``: ``1 - clip(a, 0, 1)``, OpenVLA's LIBERO data transform), then
  ``x = clip(2 (a - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)`` where ``m``, ``x = a`` elsewhere.
  For binary grippers and in-range actions ``to_env(from_env(a)) == a``.
- proprio ``s`` -> policy input (:meth:`Normalizer.normalize_proprio`): the inverse formula
  with the proprio statistics, clipped to [-1, 1].

Without statistics every map is the identity (apart from the gripper convention).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

GRIPPER_CONVENTIONS = ("none", "libero")
NO_NOOPS = "_no_noops"  # suffix of the LIBERO datasets' statistics in OpenVLA / OFT checkpoints
logger = logging.getLogger(__name__)
_EPS = 1e-8  # OpenVLA's denominator guard for dimensions with q99 == q01


def select_statistics(
    norm_stats: Mapping[str, Any] | None, unnorm_key: str | None
) -> tuple[str, Mapping[str, Any]] | None:
    """The name and statistics entry (``{"action": ..., "proprio": ...}``) of one dataset.

    Args:
        norm_stats: ``{dataset_name: entry}`` as in ``config.json``'s ``norm_stats`` or
            ``dataset_statistics.json``; ``None`` when the model has none.
        unnorm_key: the dataset name; may be omitted when there is exactly one. A suite name
            (``libero_10``) falls back to its ``_no_noops`` entry, with a warning.

    Returns:
        ``(name, entry)``, or ``None`` when there are no statistics and no key was asked for.
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
    if unnorm_key not in norm_stats and f"{unnorm_key}{NO_NOOPS}" in norm_stats:
        # OFT's and OpenVLA's LIBERO statistics are named <suite>_no_noops (the demos with
        # no-op actions filtered out); their evaluation scripts accept the suite name too.
        logger.warning(
            "unnorm_key %r: using the statistics of %r", unnorm_key, unnorm_key + NO_NOOPS
        )
        unnorm_key = f"{unnorm_key}{NO_NOOPS}"
    if unnorm_key not in norm_stats:
        raise ValueError(f"unnorm_key {unnorm_key!r} is not one of {sorted(norm_stats)}")
    return unnorm_key, norm_stats[unnorm_key]


class Bounds(nn.Module):
    """q01 / q99 / mask of one quantity (actions or proprio) as persistent buffers.

    Attributes:
        q01, q99: (D,) float64 bounds; mask: (D,) bool, the dimensions they apply to;
        present: () bool, whether statistics were set (identity maps otherwise).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        # Explicit CPU: policies loading a checkpoint are built under torch.device("meta"),
        # and published weight files do not hold these buffers (they are filled from stats).
        self.register_buffer("q01", torch.full((dim,), -1.0, dtype=torch.float64, device="cpu"))
        self.register_buffer("q99", torch.full((dim,), 1.0, dtype=torch.float64, device="cpu"))
        self.register_buffer("mask", torch.zeros(dim, dtype=torch.bool, device="cpu"))
        self.register_buffer("present", torch.zeros((), dtype=torch.bool, device="cpu"))

    def _apply(self, fn: Any, recurse: bool = True) -> Bounds:
        # Follow the module's device only: ``policy.to(dtype=torch.bfloat16)`` must not round
        # the statistics (float64, like OpenVLA's numpy de-normalisation).
        for name, buffer in self._buffers.items():
            self._buffers[name] = buffer.to(fn(buffer).device)
        return self

    @property
    def is_set(self) -> bool:
        return bool(self.present)

    def parse(
        self, entry: Mapping[str, Any], what: str
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Checked (q01, q99, mask) of ``{"q01", "q99", "mask" (optional: all true)}``."""
        missing = [k for k in ("q01", "q99") if k not in entry]
        if missing:
            raise ValueError(f"{what} statistics lack {missing}; they need q01, q99 (and mask)")
        # Explicit CPU: under torch.device("meta") (checkpoint loading) factories make meta.
        low = torch.tensor(np.asarray(entry["q01"], dtype=np.float64), device="cpu")
        high = torch.tensor(np.asarray(entry["q99"], dtype=np.float64), device="cpu")
        default_mask = np.ones(low.shape, dtype=bool)
        mask = torch.tensor(np.asarray(entry.get("mask", default_mask), dtype=bool), device="cpu")
        if not low.shape == high.shape == mask.shape == (self.dim,):
            raise ValueError(
                f"{what} statistics have q01 {tuple(low.shape)}, q99 {tuple(high.shape)}, mask "
                f"{tuple(mask.shape)}; this policy has {self.dim} {what} dimensions. Use "
                f"statistics of data with {self.dim}-d {what} (or change the policy's size)"
            )
        if not bool(torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ValueError(f"{what} statistics hold non-finite q01/q99: {low}, {high}")
        return low, high, mask

    def set(self, low: torch.Tensor, high: torch.Tensor, mask: torch.Tensor) -> None:
        """Copy :meth:`parse`'s output into the buffers."""
        with torch.no_grad():
            self.q01.copy_(low)
            self.q99.copy_(high)
            self.mask.copy_(mask)
            self.present.fill_(True)

    def entry(self) -> dict[str, list]:
        """The buffers as a ``norm_stats`` entry (lists of floats / bools)."""
        return {
            "q01": self.q01.tolist(),
            "q99": self.q99.tolist(),
            "mask": self.mask.tolist(),
        }

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """``0.5 (x + 1)(q99 - q01) + q01`` where mask (float64); identity when not set."""
        x = x.to(torch.float64)
        if not self.is_set:
            return x
        low, high, mask = (t.to(x.device) for t in (self.q01, self.q99, self.mask))
        return torch.where(mask, 0.5 * (x + 1.0) * (high - low) + low, x)

    def normalize(self, a: torch.Tensor) -> torch.Tensor:
        """``clip(2 (a - q01) / (q99 - q01 + eps) - 1, -1, 1)`` where mask (float64)."""
        a = a.to(torch.float64)
        if not self.is_set:
            return a
        low, high, mask = (t.to(a.device) for t in (self.q01, self.q99, self.mask))
        scaled = (2.0 * (a - low) / (high - low + _EPS) - 1.0).clamp(-1.0, 1.0)
        return torch.where(mask, scaled, a)


class Normalizer(nn.Module):
    """A policy's action and proprio statistics and its gripper convention.

    Args:
        action_dim: A, the action size (7 on LIBERO).
        proprio_dim: S, the proprio size the policy normalises (0: it reads none; proprio
            statistics are then ignored).
        gripper_convention: ``"none"`` or ``"libero"`` (see the module docstring).
    """

    def __init__(self, action_dim: int, proprio_dim: int, gripper_convention: str) -> None:
        super().__init__()
        if gripper_convention not in GRIPPER_CONVENTIONS:
            raise ValueError(
                f"gripper_convention {gripper_convention!r} is not one of "
                f"{list(GRIPPER_CONVENTIONS)}"
            )
        self.gripper_convention = gripper_convention
        self.action = Bounds(action_dim)
        self.proprio = Bounds(proprio_dim) if proprio_dim > 0 else None

    @property
    def has_statistics(self) -> bool:
        """Whether action statistics were set (from demos, a checkpoint or ``init_from``)."""
        return self.action.is_set

    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Set from a ``norm_stats`` entry: ``{"action": {...}, "proprio": {...} (optional)}``.

        The proprio entry is ignored when this normaliser reads no proprio.
        """
        if "action" not in statistics:
            raise ValueError(
                f"statistics need an 'action' entry (q01/q99/mask), got keys {sorted(statistics)}"
            )
        action = self.action.parse(statistics["action"], "action")
        proprio = None
        if self.proprio is not None and statistics.get("proprio") is not None:
            proprio = self.proprio.parse(statistics["proprio"], "proprio")
        self.action.set(*action)  # only after both parsed: never half-set
        if proprio is not None:
            self.proprio.set(*proprio)

    def statistics(self) -> dict[str, Any] | None:
        """The set statistics as a ``norm_stats`` entry, or ``None`` when none are set."""
        if not self.has_statistics:
            return None
        out: dict[str, Any] = {"action": self.action.entry()}
        if self.proprio is not None and self.proprio.is_set:
            out["proprio"] = self.proprio.entry()
        return out

    def to_env(self, normalized: torch.Tensor | np.ndarray) -> np.ndarray:
        """Policy outputs (..., A) in [-1, 1] -> env actions (..., A) float32 (a numpy array)."""
        if not isinstance(normalized, torch.Tensor):
            normalized = torch.as_tensor(np.asarray(normalized))
        x = self.action.unnormalize(normalized)
        if self.gripper_convention == "libero":
            # g in [0, 1] (1 = open) -> 2g - 1 -> sign -> negated: -1 open, +1 close.
            x = torch.cat([x[..., :-1], -torch.sign(2.0 * x[..., -1:] - 1.0)], dim=-1)
        return x.cpu().numpy().astype(np.float32)

    def from_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Env actions (..., A) -> the normalised targets (..., A) float32 a policy learns."""
        a = actions.to(torch.float64)
        if self.gripper_convention == "libero":
            # OpenVLA's LIBERO transform: clip to [0, 1] (close = 1), then invert (open = 1).
            a = torch.cat([a[..., :-1], 1.0 - a[..., -1:].clamp(0.0, 1.0)], dim=-1)
        return self.action.normalize(a).float()

    def normalize_proprio(self, state: torch.Tensor) -> torch.Tensor:
        """Proprio (N, S) -> normalised (N, S) in the input's dtype; identity without stats."""
        if self.proprio is None:
            return state
        return self.proprio.normalize(state).to(state.dtype)
