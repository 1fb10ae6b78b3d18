"""Configuration of the OpenVLA-OFT policy (the shared VLA options plus OFT's own)."""

from __future__ import annotations

from dataclasses import dataclass

from embodied_rl.checks import check_range
from embodied_rl.keys import CAMERAS
from policies.openvla.configuration import VLAOptions


@dataclass
class OpenVLAOFTConfig(VLAOptions):
    """Options of the ``openvla_oft`` policy (see :class:`VLAOptions` for the shared ones).

    Attributes:
        center_crop: OFT's test-time crop of 90 % of the image area (on by default: the
            released LIBERO fine-tunes were trained with random crops).
        chunk: actions per policy step; K = chunk * 7 outputs decoded in one forward pass.
        use_continuous_head: predict the chunk with an MLP head on the action positions'
            hidden states (OFT's L1-regression head) and sample from a Gaussian around it
            with a learnable per-dimension log-std, instead of the 256-bin action tokens.
        use_proprio: feed the (normalised) proprio state as one extra token after the image.
        proprio_dim: size of the proprio state (8 on LIBERO).
        num_images_in_input: camera images per step, as the published ``config.json`` says:
            1, the third-person (agentview) camera; 2, it and the wrist camera (the OFT LIBERO
            fine-tunes): each goes through the vision towers, agentview's P tokens first.
        init_log_std: initial log-std of the Gaussian head (normalised action units).
    """

    center_crop: bool = True
    chunk: int = 8
    use_continuous_head: bool = False
    use_proprio: bool = False
    proprio_dim: int = 8
    num_images_in_input: int = 1
    init_log_std: float = -2.0

    policy_name = "openvla_oft"

    @property
    def normalized_proprio_dim(self) -> int:
        """``proprio_dim`` with ``use_proprio``, else 0 (no proprio statistics kept)."""
        return self.proprio_dim if self.use_proprio else 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("openvla_oft chunk", self.chunk, 1)
        check_range("openvla_oft proprio_dim", self.proprio_dim, 1)
        check_range("openvla_oft num_images_in_input", self.num_images_in_input, 1, len(CAMERAS))

    @property
    def cameras(self) -> tuple[str, ...]:
        """The cameras read each step, in order: agentview, then wrist."""
        return CAMERAS[: self.num_images_in_input]
