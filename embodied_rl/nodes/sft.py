"""Behaviour cloning on demonstrations (``sft.train``), on the trainer's update machinery.

The input is a batch of one-step trajectories from ``data.demos``: observations, the chunk of
demonstrated env actions (ACTIONS (n, C, A)) and the mask of its real (unpadded) actions
(RESPONSE_MASK (n, C * A)). The policy turns the actions into what it scores
(``action_targets``, see ``embodied_rl/interfaces.py``); discrete heads are trained with the
token cross-entropy, continuous heads with the L1 regression of their mean, flow-matching
policies with the regression of their velocity (``embodied_rl/algorithms/bc.py``), normalised
by the global count of valid action tokens.
Gradients are synced, clipped and guarded against non-finite values exactly as in
``actor.train`` (:func:`embodied_rl.training.updates.mini_batch_update`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.bc import (
    flow_matching_regression,
    l1_regression,
    smoothed_token_cross_entropy,
    token_accuracy,
    token_cross_entropy,
)
from embodied_rl.algorithms.losses import GlobalCounts
from embodied_rl.checks import check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.interfaces import BinnedActionPolicy, FlowMatchingPolicy
from embodied_rl.runtime.context import NodeContext
from embodied_rl.training.guard import (
    check_max_bad_steps,
    count_bad_steps,
    create_bad_step_counter,
)
from embodied_rl.training.updates import global_counts, mini_batch_update


@dataclass
class SFTTrainConfig:
    """Options of ``sft.train``.

    Attributes:
        model: the trainable policy (its optimizer comes from ``models.<name>``).
        micro_batch_size: rows per forward/backward (gradient accumulation; no effect on math).
        max_bad_steps: stop after this many consecutive steps with a skipped (non-finite)
            update; 0 never stops.
        target_sigma_bins: discrete heads only: > 0 trains against a discretised Gaussian
            of this standard deviation (in action bins) around each demonstrated bin instead
            of the bin alone (``algorithms/bc.py``); 0 is the plain token cross-entropy.
    """

    model: str = "actor"
    micro_batch_size: int = 16
    max_bad_steps: int = 3
    target_sigma_bins: float = 0.0

    def __post_init__(self) -> None:
        check_max_bad_steps(self.max_bad_steps)
        check_range("micro_batch_size", self.micro_batch_size, 1)
        check_range("target_sigma_bins", self.target_sigma_bins, 0.0)


@register_node(
    "sft.train",
    reads=(K.ACTIONS, K.RESPONSE_MASK, K.STEP_MASK),
    writes=(),
    config=SFTTrainConfig,
    setup=create_bad_step_counter,
)
def sft_train_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """One optimizer update of behaviour cloning on this rank's demonstration steps.

    Logs ``sft/loss``, ``sft/l1`` (continuous heads), ``sft/flow_mse`` (flow-matching
    policies) or ``sft/token_accuracy`` (discrete heads), ``sft/grad_norm`` and
    ``sft/skipped_updates``.
    """
    cfg: SFTTrainConfig = ctx.node_config
    policy = ctx.models[cfg.model]
    policy.train()
    key, targets = policy.action_targets(batch[K.ACTIONS])
    if cfg.target_sigma_bins > 0 and key != K.ACTION_TOKENS:
        raise ValueError(
            f"target_sigma_bins={cfg.target_sigma_bins} smooths discrete action bins, but this "
            f"{type(policy).__name__} regresses continuous actions ({key}); set "
            "algorithm.sft.target_sigma_bins=0 or use a discrete head"
        )
    width = batch[K.RESPONSE_MASK].shape[-1]
    if targets.shape[-1] != width:
        raise ValueError(
            f"the policy scores {targets.shape[-1]} outputs per step but the demonstration "
            f"rows carry {width} action dimensions; give data.demos the policy's chunk"
        )
    batch[key] = targets.unsqueeze(1)  # (n, T = 1, K), what evaluate reads
    loss = partial(_bc_loss, ctx, policy, key=key, counts=global_counts(ctx, batch))
    grad_norm, skipped = mini_batch_update(ctx, cfg.model, batch, cfg.micro_batch_size, loss)
    if not skipped:
        ctx.metrics.log("sft/grad_norm", grad_norm, reduce="max")
    count_bad_steps(ctx, "sft", int(skipped), cfg.max_bad_steps, cfg.model)
    return batch


def _token_loss(
    policy: torch.nn.Module,
    micro: TensorDict,
    mask: torch.Tensor,
    counts: GlobalCounts,
    sigma: float,
) -> torch.Tensor:
    """The token cross-entropy of a discrete head: against the demonstrated tokens, or
    (``sigma`` > 0) against Gaussians of ``sigma`` bins around them."""
    if sigma == 0:
        logprobs, _ = policy.evaluate(micro, 1.0)
        return token_cross_entropy(logprobs, mask.to(logprobs.device), counts)
    if not isinstance(policy, BinnedActionPolicy):
        raise ValueError(
            f"target_sigma_bins={sigma} needs a policy with ordered action bins (openvla, "
            f"openvla_oft with discrete tokens, mlp with head: discrete); "
            f"{type(policy).__name__} has none: set algorithm.sft.target_sigma_bins=0"
        )
    logprobs, index = policy.bin_logprobs(micro)
    return smoothed_token_cross_entropy(logprobs, index, sigma, mask.to(logprobs.device), counts)


def _bc_loss(
    ctx: NodeContext,
    policy: torch.nn.Module,
    micro: TensorDict,
    key: str,
    counts: GlobalCounts,
) -> torch.Tensor:
    """This micro-batch's share of the batch's behaviour-cloning loss; logs its metric shares."""
    sigma = ctx.node_config.target_sigma_bins
    mask = micro[K.RESPONSE_MASK].float()
    target = micro[key].reshape(len(mask), -1)
    if isinstance(policy, FlowMatchingPolicy):  # flow head: the velocity regression
        error = policy.flow_matching_loss(micro, target)
        loss = flow_matching_regression(error, mask.to(error.device), counts)
        metrics = {"sft/loss": loss.detach(), "sft/flow_mse": loss.detach()}
    elif key == K.RAW_ACTIONS:  # continuous head: L1 of the mean (OpenVLA-OFT)
        mean = policy.action_mode(micro)
        loss = l1_regression(mean, target.to(mean.device), mask.to(mean.device), counts)
        metrics = {"sft/loss": loss.detach(), "sft/l1": loss.detach()}
    else:  # discrete head: -log p of the demonstrated tokens at temperature 1
        loss = _token_loss(policy, micro, mask, counts, sigma)
        mask = mask.to(loss.device)
        with torch.no_grad():
            mode = policy.action_mode(micro)
        accuracy = token_accuracy(mode, target.to(mode.device), mask, counts)
        metrics = {"sft/loss": loss.detach(), "sft/token_accuracy": accuracy}
    for (
        name,
        value,
    ) in metrics.items():  # shares of a global mean add up over ranks and micro-batches
        ctx.log_share(name, value.item())
    return loss
