"""PPO critic nodes: values at rollout time and the value-function update.

The critic is used only through ``critic.values(batch)`` (differentiable), so any value model
implementing it fits. With ``inputs: text`` it returns one value per response token (B, R)
(see ``policies/causal_lm/critic.py``); with ``inputs: trajectory`` one value per policy step
(B, T) (an embodied policy with ``value_head: true``), which these nodes expand to the token
layout (B, T * K) of RESPONSE_MASK (see :func:`step_values_to_tokens`), so ``advantage.gae``
(:mod:`embodied_rl.nodes.advantage`) serves both unchanged.

Shapes: ``B`` samples on this rank, ``R`` response tokens (``R = T * K`` for trajectories).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.gae import clipped_value_loss
from embodied_rl.algorithms.losses import LOSS_AGG_MODES, GlobalCounts, aggregate
from embodied_rl.checks import check_fields, check_range
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext
from embodied_rl.runtime.fsdp import chunked_forward
from embodied_rl.training.guard import check_max_bad_steps, create_bad_step_counter
from embodied_rl.training.inputs import evaluate_keys
from embodied_rl.training.updates import global_counts, run_updates


# --------------------------------------------------------------------------- step -> token
def step_values_to_tokens(step_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-step values (B, T) -> the token layout (B, T * K), 0 where RESPONSE_MASK is 0.

    Every token of step t gets V(s_t): all K action tokens of a step are emitted from the same
    observation, so the state "before token j" of that step is s_t for each of them.

    Why this is consistent with the unchanged token-level GAE (``gamma``, ``lam`` are then
    per TOKEN): inside a step the reward is 0 and the next value is the same V(s_t), so the
    K - 1 inner deltas are ``0 + gamma * V(s_t) - V(s_t) = (gamma - 1) V(s_t)``, and the
    step's last token carries ``r_t + gamma * V(s_{t+1}) - V(s_t)``. With ``gamma = 1`` the
    inner deltas vanish and the recursion equals step-level GAE with discount 1 and
    ``lam_step = lam^K``: the last token of step t gets exactly that step advantage, the token
    i positions before it ``lam^i`` times it (``lam = 1``: all K tokens get ``G - V(s_t)``).
    With ``gamma < 1`` the per-step discount is ``gamma^K``. So choose per-token values:
    ``lam = lam_step^(1/K)``, ``gamma = gamma_step^(1/K)`` (1 for success rewards).

    Args:
        step_values: (B, T) value of each step's observation.
        response_mask: (B, T * K) the per-step STEP_MASK repeated over each step's tokens.
    """
    b, t = step_values.shape
    width = response_mask.shape[-1]
    if t == 0 or width % t != 0 or response_mask.shape[0] != b:
        raise ValueError(
            f"step values {tuple(step_values.shape)} do not tile RESPONSE_MASK "
            f"{tuple(response_mask.shape)} (expected (B, T * K))"
        )
    tokens = step_values.repeat_interleave(width // t, dim=1)
    return tokens * response_mask.to(device=tokens.device, dtype=tokens.dtype)


def critic_token_values(critic: torch.nn.Module, batch: TensorDict, inputs: str) -> torch.Tensor:
    """The critic's values in the token layout (B, R), differentiable.

    ``text``: ``critic.values`` already returns (B, R). ``trajectory``: it returns (B, T),
    expanded by :func:`step_values_to_tokens`.
    """
    values = critic.values(batch)
    if inputs == "trajectory":
        values = step_values_to_tokens(values, batch[K.RESPONSE_MASK])
    return values


# --------------------------------------------------------------------------- critic.values
@dataclass
class CriticValuesConfig:
    """Options of ``critic.values``: which model, rows per forward pass, the input kind.

    Attributes:
        inputs: ``text`` (a token-level LM critic) or ``trajectory`` (per-step values of an
            embodied critic, expanded to the step's tokens).
    """

    model: str = "critic"
    micro_batch_size: int = 16
    inputs: str = "text"

    def __post_init__(self) -> None:
        check_range("micro_batch_size", self.micro_batch_size, 1)
        evaluate_keys(self.inputs)


@register_node(
    "critic.values",
    reads=lambda c: evaluate_keys(c.inputs),
    writes=(K.VALUES,),
    config=CriticValuesConfig,
)
def critic_values_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """VALUES (B, R): the critic's V(s_t) for every response token, before any update."""
    cfg: CriticValuesConfig = ctx.node_config
    critic = ctx.models[cfg.model]
    was_training = critic.training
    critic.eval()
    with torch.no_grad():
        chunks = chunked_forward(
            ctx,
            critic,
            batch,
            cfg.micro_batch_size,
            lambda rows: critic_token_values(critic, rows, cfg.inputs).float(),
        )
    critic.train(was_training)
    mask = batch[K.RESPONSE_MASK]
    values = torch.cat(chunks) if chunks else torch.zeros(mask.shape)
    batch[K.VALUES] = values.to(mask.device)
    return batch


# --------------------------------------------------------------------------- critic.train
@dataclass
class CriticTrainConfig:
    """Options of ``critic.train``.

    Attributes:
        model: the trainable critic (its optimizer comes from ``models.<name>``).
        ppo_epochs: passes over the batch per step.
        num_mini_batches: optimizer steps per epoch: the global batch is cut into this many
            pieces by ``SAMPLE_ID``, the same for any number of workers
            (:mod:`embodied_rl.data.mini_batches`).
        micro_batch_size: rows per forward/backward (gradient accumulation; no effect on math).
        cliprange_value: c in ``V_clip = V_old + clip(V - V_old, -c, c)``.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-sum`` or ``seq-mean-token-mean``.
        inputs: ``text`` or ``trajectory`` (as in ``critic.values``); with trajectories every
            step counts K times (once per token), so ``token-mean`` is the mean over steps.
        max_bad_steps: stop the run after this many consecutive steps with a skipped
            (non-finite loss or gradient) update; 0 never stops (as in ``actor.train``).
    """

    model: str = "critic"
    ppo_epochs: int = 1
    num_mini_batches: int = 1
    micro_batch_size: int = 16
    cliprange_value: float = 0.2
    loss_agg_mode: str = "token-mean"
    inputs: str = "text"
    max_bad_steps: int = 3

    def __post_init__(self) -> None:
        evaluate_keys(self.inputs)
        check_max_bad_steps(self.max_bad_steps)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(
                f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {self.loss_agg_mode!r}"
            )
        check_fields(self, ("ppo_epochs", "num_mini_batches", "micro_batch_size"), 1)
        check_range("cliprange_value", self.cliprange_value, 0, low_open=True)


@register_node(
    "critic.train",
    reads=lambda c: evaluate_keys(c.inputs) + (K.VALUES, K.RETURNS),
    writes=(),
    config=CriticTrainConfig,
    setup=create_bad_step_counter,
)
def critic_train_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Clipped value regression onto RETURNS, gradients summed over the dp group.

    Non-finite updates are skipped on every rank, as in ``actor.train`` (``guarded_step``).
    """
    cfg: CriticTrainConfig = ctx.node_config
    critic = ctx.models[cfg.model]
    _log_batch_means(ctx, batch)
    critic.train()
    run_updates(
        ctx,
        batch,
        cfg,
        lambda counts: partial(_micro_batch_value_loss, ctx, critic, counts=counts, cfg=cfg),
        prefix="critic",
    )
    return batch


def _micro_batch_value_loss(
    ctx: NodeContext,
    critic: torch.nn.Module,
    micro: TensorDict,
    counts: GlobalCounts,
    cfg: CriticTrainConfig,
) -> torch.Tensor:
    """This micro-batch's share of the mini-batch value loss; logs its metric shares."""
    values = critic_token_values(critic, micro, cfg.inputs)
    mask = micro[K.RESPONSE_MASK].float().to(values.device)
    old_values = micro[K.VALUES].to(values.device)
    returns = micro[K.RETURNS].to(values.device)
    per_token, clipped = clipped_value_loss(values, old_values, returns, cfg.cliprange_value)
    loss = aggregate(per_token, mask, cfg.loss_agg_mode, counts)
    clip_fraction = aggregate(clipped.float(), mask, "token-mean", counts)
    # Shares of a global mean add up over ranks and micro-batches; averaged over updates.
    updates = cfg.ppo_epochs * cfg.num_mini_batches
    ctx.log_share("critic/value_loss", loss.item() / updates)
    ctx.log_share("critic/vf_clip_fraction", clip_fraction.item() / updates)
    return loss


def _log_batch_means(ctx: NodeContext, batch: TensorDict) -> None:
    """Token means of the rollout-time values and of the returns over the global batch."""
    counts = global_counts(ctx, batch)
    mask = batch[K.RESPONSE_MASK].float()
    for name, key in (("critic/values_mean", K.VALUES), ("critic/returns_mean", K.RETURNS)):
        ctx.log_share(name, aggregate(batch[key].float(), mask, "token-mean", counts).item())
