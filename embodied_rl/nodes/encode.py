"""``encode.video``: one embedding per episode from its recorded frames (SRPO's trajectory
embedding), by a frozen video encoder from ``VIDEO_ENCODERS`` that the model store builds.

The node uses only the encoder interface, ``encode(frames (B, T, H, W, 3) uint8, lengths (B,)
int64) -> (B, D) float32`` and ``embedding_dim``; the encoders themselves (pooled pixels,
V-JEPA 2) are in the ``policies`` plugin (``policies/encoders/``), which the core never
imports: the model store finds them in ``VIDEO_ENCODERS`` by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext


@dataclass
class EncodeVideoConfig:
    """Options of ``encode.video``.

    Attributes:
        model: name of the encoder in ``ctx.models`` (a ``video_encoder.*`` model).
        micro_batch_size: episodes encoded per call (bounds the encoder's activations).
    """

    model: str = "video_encoder"
    micro_batch_size: int = 8

    def __post_init__(self) -> None:
        check_range("micro_batch_size", self.micro_batch_size, 1)


@register_node(
    "encode.video",
    reads=(K.FRAMES, K.FINISH_STEP),
    writes=(K.TRAJ_EMBEDDING,),
    config=EncodeVideoConfig,
)
def encode_video_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """TRAJ_EMBEDDING (B, D) float32 from FRAMES (B, T, H, W, 3) uint8.

    Episode lengths are ``FINISH_STEP + 1`` frames (FINISH_STEP is the index of the last valid
    step), clipped to ``[0, T]``; so ``FINISH_STEP = -1`` marks an episode without frames,
    whose embedding is all zero. Success plays no part here.
    """
    cfg: EncodeVideoConfig = ctx.node_config
    encoder = ctx.models[cfg.model]
    frames = batch[K.FRAMES]
    if K.FRAME_COUNT in batch.keys():  # frames recorded every k-th step
        lengths = batch[K.FRAME_COUNT].long()
    else:
        lengths = batch[K.FINISH_STEP].long() + 1
    parts = [
        encoder.encode(frames[i : i + cfg.micro_batch_size], lengths[i : i + cfg.micro_batch_size])
        for i in range(0, len(frames), cfg.micro_batch_size)
    ]
    dim = int(encoder.embedding_dim)
    embedding = torch.cat(parts) if parts else torch.zeros(0, dim)
    batch[K.TRAJ_EMBEDDING] = embedding.to(batch[K.FINISH_STEP].device)
    return batch
