"""``ref.logprobs``: log-probs of the frozen reference policy (for a KL term or KL reward)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.fsdp import chunked_forward
from embodied_rl.training.inputs import evaluate_keys


@dataclass
class RefLogprobConfig:
    """Options of ``ref.logprobs``: which model, sampling temperature, rows per forward."""

    model: str = "reference"
    temperature: float = 1.0
    micro_batch_size: int = 16
    inputs: str = "text"

    def __post_init__(self) -> None:
        evaluate_keys(self.inputs)
        check_range("temperature", self.temperature, 0, low_open=True)
        check_range("micro_batch_size", self.micro_batch_size, 1)


@register_node(
    "ref.logprobs",
    reads=lambda c: evaluate_keys(c.inputs),
    writes=(K.REF_LOGPROBS,),
    config=RefLogprobConfig,
)
def ref_logprobs_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REF_LOGPROBS (B, R) of the frozen reference policy."""
    cfg: RefLogprobConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    with torch.no_grad():
        chunks = chunked_forward(
            ctx,
            policy,
            batch,
            max(cfg.micro_batch_size, 1),
            lambda rows: policy.evaluate(rows, cfg.temperature)[0],
        )
    width = batch[K.RESPONSE_MASK].shape[-1]
    batch[K.REF_LOGPROBS] = torch.cat(chunks) if chunks else torch.zeros(0, width)
    return batch
