"""World-model pretraining (``world_model.train``): one V-JEPA update on this rank's clips.

The input is a batch of clips from ``data.videos`` (FRAMES ``(n, F, H, W, 3)`` uint8). For
each micro-batch a tube mask is drawn (``embodied_rl/algorithms/jepa.py``); the model
(``world_model.vjepa2``, ``policies/world_model/vjepa.py``) encodes the context tokens,
predicts the latents of the target tokens, and is scored by the L1 distance to its EMA target
encoder's latents of the whole clip. Gradients are synced, clipped and guarded against
non-finite values as in ``actor.train``; after an applied update the target encoder moves
towards the context encoder with a momentum that rises linearly from ``ema_start`` to
``ema_end`` over ``trainer.total_steps`` (V-JEPA's schedule).

The model exposes ``pixels``, ``context_tokens``, ``predict``, ``target_tokens``,
``update_target``, ``depth`` and ``grid`` (see ``world_model.vjepa2``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.jepa import TubeMaskConfig, latent_l1, tube_mask
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len
from embodied_rl.runtime.context import NodeContext
from embodied_rl.training.guard import (
    check_max_bad_steps,
    count_bad_steps,
    create_bad_step_counter,
)
from embodied_rl.training.updates import mini_batch_update


@dataclass
class WorldModelTrainConfig:
    """Options of ``world_model.train``.

    Attributes:
        model: the world model (its optimizer comes from ``models.<name>``).
        micro_batch_size: clips per forward/backward (one mask each).
        max_bad_steps: stop after this many consecutive skipped (non-finite) updates.
        ema_start / ema_end: momentum of the target encoder at the first and the last step.
        num_blocks / block_scale: the tube mask (see ``TubeMaskConfig``).
    """

    model: str = "world_model"
    micro_batch_size: int = 8
    max_bad_steps: int = 3
    ema_start: float = 0.99
    ema_end: float = 0.999
    num_blocks: int = 4
    block_scale: float = 0.15

    def __post_init__(self) -> None:
        check_max_bad_steps(self.max_bad_steps)
        check_range("micro_batch_size", self.micro_batch_size, 1)
        check_range("ema_start", self.ema_start, 0.0, 1.0)
        check_range("ema_end", self.ema_end, self.ema_start, 1.0)
        self.mask_config()  # checks num_blocks and block_scale

    def mask_config(self) -> TubeMaskConfig:
        """The mask options of this node."""
        return TubeMaskConfig(self.num_blocks, self.block_scale)

    def momentum(self, step: int, total_steps: int) -> float:
        """The target encoder's momentum after update ``step`` (0-based) of ``total_steps``."""
        fraction = step / max(1, total_steps - 1)
        return self.ema_start + (self.ema_end - self.ema_start) * min(1.0, fraction)


@register_node(
    "world_model.train",
    reads=(K.FRAMES,),
    writes=(),
    config=WorldModelTrainConfig,
    setup=create_bad_step_counter,
)
def world_model_train_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """One V-JEPA update of the world model on this rank's clips.

    Logs ``world_model/loss`` (mean L1 latent error over all clips), ``world_model/target_std``
    (the spread of the target latents: near 0 means the representation collapsed),
    ``world_model/momentum``, ``world_model/grad_norm`` and ``world_model/skipped_updates``.
    """
    cfg: WorldModelTrainConfig = ctx.node_config
    model = ctx.models[cfg.model]
    model.train()
    rows = torch.tensor([float(batch_len(batch))], dtype=torch.float64, device=ctx.device)
    total_rows = ctx.all_reduce_sum(rows).item()
    generator = torch.Generator().manual_seed(ctx.seed("tube_mask"))
    loss = partial(
        _jepa_loss, ctx, model, mask=cfg.mask_config(), generator=generator, total_rows=total_rows
    )
    grad_norm, skipped = mini_batch_update(ctx, cfg.model, batch, cfg.micro_batch_size, loss)
    if not skipped:
        ctx.metrics.log("world_model/grad_norm", grad_norm, reduce="max")
        momentum = cfg.momentum(ctx.step, int(ctx.cfg.trainer.total_steps))
        model.update_target(momentum)
        ctx.metrics.log("world_model/momentum", momentum, reduce="max")
    count_bad_steps(ctx, "world_model", int(skipped), cfg.max_bad_steps, cfg.model)
    return batch


def _jepa_loss(
    ctx: NodeContext,
    model: torch.nn.Module,
    micro: TensorDict,
    mask: TubeMaskConfig,
    generator: torch.Generator,
    total_rows: float,
) -> torch.Tensor:
    """This micro-batch's share of the batch's V-JEPA loss; logs its metric shares."""
    context_ids, target_ids = tube_mask(model.depth, model.grid, mask, generator)
    pixels = model.pixels(micro[K.FRAMES])
    target = model.target_tokens(pixels)[:, target_ids.to(pixels.device)]  # (n, N_t, D)
    predicted = model.predict(model.context_tokens(pixels, context_ids), context_ids, target_ids)
    loss = latent_l1(predicted, target, total_rows)
    n = len(target)
    ctx.log_share("world_model/loss", loss.item())
    spread = target.float().std(dim=(0, 1)).mean().item() if n > 1 else 0.0
    ctx.log_share("world_model/target_std", spread * n / total_rows)
    return loss
