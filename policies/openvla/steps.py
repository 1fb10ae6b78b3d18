"""The valid steps of a trajectory batch, flattened to observations (the VLA policies'
micro-batching for ``evaluate``, ``values`` and ``action_mode``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.data.batch import strings
from embodied_rl.interfaces import batch_images


class StepInputs:
    """The valid steps of a trajectory batch, flattened to observations (shared batching).

    Attributes:
        images: (B * T, H, W, 3) uint8 ((B * T, V, H, W, 3) with V cameras); states:
            (B * T, S) or ``None``.
        instructions: B strings (step row r belongs to trajectory r // T).
        valid: (n,) int64 indices of the valid steps in [0, B * T), on the CPU.
        b, t: the batch and trajectory sizes.
    """

    def __init__(
        self,
        images: torch.Tensor,
        states: torch.Tensor | None,
        instructions: list[str],
        valid: torch.Tensor,
        b: int,
        t: int,
    ) -> None:
        self.images, self.states, self.instructions = images, states, instructions
        self.valid, self.b, self.t = valid, b, t

    @classmethod
    def from_batch(cls, batch: TensorDict, cameras: Sequence[str]) -> StepInputs:
        """From the images of ``cameras`` (OBS_IMAGE (B, T, H, W, 3), OBS_WRIST_IMAGE with
        the wrist: then (B * T, V, H, W, 3) images), OBS_STATE (B, T, S) if any, PROMPT_TEXT and
        STEP_MASK."""
        step_mask = batch[K.STEP_MASK]
        b, t = step_mask.shape
        images = batch_images(batch, cameras)
        images = images.reshape(b * t, *images.shape[2:])
        states = batch.get(K.OBS_STATE, None)
        states = None if states is None else states.reshape(b * t, -1)
        valid = torch.nonzero(step_mask.reshape(-1).cpu() > 0).squeeze(1)
        return cls(images, states, strings(batch, K.PROMPT_TEXT), valid, b, t)

    def micro_batches(
        self, size: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[str], torch.Tensor | None]]:
        """Yield (rows (m,), images (m, H, W, 3), m instructions, states (m, S) or None)."""
        for rows in self.valid.split(size):
            yield (
                rows,
                self.images[rows.to(self.images.device)],
                [self.instructions[r // self.t] for r in rows.tolist()],
                None if self.states is None else self.states[rows.to(self.states.device)],
            )

    def scatter(self, parts: list[torch.Tensor], width: int, device: torch.device) -> torch.Tensor:
        """Per-micro-batch outputs (m, width) -> (B * T, width) float32, 0 on masked steps."""
        full = torch.zeros(self.b * self.t, width, device=device)
        if parts:
            full = full.index_copy(0, self.valid.to(device), torch.cat(parts).float())
        return full
