"""The SRPO reward node ``reward.srpo`` (docs/ALGORITHMS.md, "SRPO"), feeding the GRPO advantage node.

The reference implementation compares a failure only with the successes in one GPU's local
batch, so a task whose successes happen to sit on another worker gets no shaping there. With
``reference_scope: global`` (the default) every worker all-gathers the small
(embedding, success, task id) rows of the node's whole data-parallel group, computes the
rewards of the global batch (identically on every rank: the computation is deterministic and
in float64) and keeps its own rows. ``local`` reproduces the per-GPU behaviour.

``reward.progress_oracle`` is the same reward with privileged progress (read from simulator
state, ``VectorEnv.privileged_progress``) in place of the embedding distance: an upper bound
for what a video encoder's ranking of failures can give SRPO, never a default
(``dag=srpo_oracle``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.algorithms.srpo import (
    SrpoRewardConfig,
    progress_oracle_rewards,
    srpo_rewards,
    tasks_without_reference,
    tasks_without_success,
    valid_embeddings,
)
from embodied_rl.dag.node_type import register_node
from embodied_rl.runtime.context import NodeContext

SCOPES = ("global", "local")


@dataclass
class SrpoNodeConfig(SrpoRewardConfig):
    """Options of ``reward.srpo``: the reward options plus where the reference set comes from.

    Attributes:
        reference_scope: ``global`` (successes of all dp workers of the node) or ``local``
            (this worker's batch only, as in the reference implementation).
    """

    reference_scope: str = "global"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reference_scope not in SCOPES:
            raise ValueError(
                f"srpo reference_scope must be one of {SCOPES}, got {self.reference_scope!r}"
            )


def _gather_inputs(
    ctx: NodeContext, embeddings: torch.Tensor, success: torch.Tensor, task_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """All dp ranks' (N, D) embeddings, (N,) success and (N,) task ids, and this rank's rows.

    The three are packed into one (B, D + 2) float64 tensor per rank (task ids are exact in
    float64 up to 2**53) and concatenated in dp-rank order.
    """
    packed = torch.cat(
        [embeddings.double(), success.double()[:, None], task_ids.double()[:, None]], dim=-1
    )
    everyone, mine = ctx.gather_rows_over_dp(packed.cpu())
    return everyone[:, :-2], everyone[:, -2].bool(), everyone[:, -1].long(), mine


def _reference_rows(
    ctx: NodeContext,
    cfg: SrpoNodeConfig,
    columns: torch.Tensor,
    success: torch.Tensor,
    task_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, slice]:
    """The rows the rewards are computed over (every dp rank's with ``global`` scope, this
    rank's with ``local``): (N, D) columns, (N,) success, (N,) task ids, and this rank's rows."""
    if cfg.reference_scope == "global":
        return _gather_inputs(ctx, columns, success, task_ids)
    return columns, success, task_ids, slice(0, len(success))


@register_node(
    "reward.srpo",
    reads=(K.TRAJ_EMBEDDING, K.SUCCESS, K.TASK_ID),
    writes=(K.REWARDS,),
    config=SrpoNodeConfig,
)
def srpo_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REWARDS (B,) float32: 1 for a success, the SRPO-shaped distance reward for a failure.

    Metrics: ``srpo/success_rate`` (mean over samples), ``srpo/failure_reward_mean`` (mean
    over valid failures), ``srpo/tasks_without_reference`` (task keys whose failures could not
    be shaped for want of a success in the reference set; with ``local`` scope the largest
    count over the workers).
    """
    cfg: SrpoNodeConfig = ctx.node_config
    embeddings = batch[K.TRAJ_EMBEDDING].detach().cpu()
    success = batch[K.SUCCESS].detach().cpu().bool()
    task_ids = batch[K.TASK_ID].detach().cpu().long()
    embeddings, success, task_ids, mine = _reference_rows(ctx, cfg, embeddings, success, task_ids)
    rewards = srpo_rewards(embeddings, success, task_ids, cfg)
    missing = tasks_without_reference(embeddings, success, task_ids)
    batch[K.REWARDS] = rewards[mine].to(batch[K.SUCCESS].device)
    _log_metrics(ctx, rewards[mine], success[mine], valid_embeddings(embeddings[mine]), missing)
    return batch


@register_node(
    "reward.progress_oracle",
    reads=(K.PRIVILEGED_PROGRESS, K.SUCCESS, K.TASK_ID),
    writes=(K.REWARDS,),
    config=SrpoNodeConfig,
)
def progress_oracle_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """REWARDS (B,) float32: 1 for a success, SRPO's shaping of ``1 - privileged progress``
    for a failure (:func:`embodied_rl.algorithms.srpo.progress_oracle_rewards`); the options
    and metrics of ``reward.srpo`` (the reference set: the task's successes, ``global`` or
    ``local``). PRIVILEGED_PROGRESS (B,) float32 from ``rollout.env``; a simulator without
    privileged progress (NaN) is refused."""
    cfg: SrpoNodeConfig = ctx.node_config
    progress = batch[K.PRIVILEGED_PROGRESS].detach().cpu().float()
    if progress.isnan().any():
        raise ValueError(
            "reward.progress_oracle needs privileged progress, and some episodes have none "
            "(a simulator without VectorEnv.privileged_progress, or a LIBERO goal predicate "
            "without a measure). Fix: use reward.srpo (dag=srpo), or tasks of a simulator "
            "that measures progress (libero, reach)"
        )
    success = batch[K.SUCCESS].detach().cpu().bool()
    task_ids = batch[K.TASK_ID].detach().cpu().long()
    columns, success, task_ids, mine = _reference_rows(
        ctx, cfg, progress[:, None], success, task_ids
    )
    rewards = progress_oracle_rewards(columns[:, 0], success, task_ids, cfg)
    batch[K.REWARDS] = rewards[mine].to(batch[K.SUCCESS].device)
    missing = tasks_without_success(success, task_ids)
    everyone = torch.ones(len(rewards[mine]), dtype=torch.bool)
    _log_metrics(ctx, rewards[mine], success[mine], everyone, missing)
    return batch


def _log_metrics(
    ctx: NodeContext,
    rewards: torch.Tensor,
    success: torch.Tensor,
    valid: torch.Tensor,
    missing: int,
) -> None:
    """Log this rank's share of the SRPO metrics (weights make the means global)."""
    if len(rewards):
        ctx.metrics.log("srpo/success_rate", float(success.float().mean()), weight=len(rewards))
    failures = ~success & valid
    if failures.any():
        count = int(failures.sum())
        ctx.metrics.log("srpo/failure_reward_mean", float(rewards[failures].mean()), weight=count)
    ctx.metrics.log("srpo/tasks_without_reference", missing, reduce="max")
