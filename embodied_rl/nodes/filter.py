"""``filter.dynamic_sampling``: DAPO's dynamic sampling (docs/ALGORITHMS.md, "DAPO"; arXiv
2503.14476).

It drops groups that carry no learning signal (all rewards equal, or a success rate outside a
band) and refills the batch by re-running its upstream nodes (prompts -> rollout -> reward) on
all its workers until it holds ``target_groups`` groups. DAPO's over-length penalty is the
reward node ``reward.overlong`` (:mod:`embodied_rl.nodes.reward.overlong`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodied_rl import keys as K
from embodied_rl.checks import check_fields
from embodied_rl.dag.node_type import register_node
from embodied_rl.data.batch import batch_len, concat
from embodied_rl.runtime.context import NodeContext


@dataclass
class DynamicSamplingConfig:
    """Options of ``filter.dynamic_sampling``.

    Attributes:
        target_groups: groups to keep per step over all workers (normally
            ``data.batch_size``, so the trained batch has its usual size).
        success_band: keep groups whose success rate is in ``[lo, hi]``; ``None`` keeps every
            group whose rewards are not all equal.
        success_threshold: a sample with reward >= this counts as a success.
        max_rounds: rollout rounds per step at most (the first one included).
        on_shortfall: ``train`` on fewer groups (logged) or ``error`` when rounds run out.
    """

    target_groups: int = 8
    success_band: tuple[float, float] | None = None
    success_threshold: float = 1.0
    max_rounds: int = 8
    on_shortfall: str = "train"

    def __post_init__(self) -> None:
        check_fields(self, ("target_groups", "max_rounds"), 1)
        if self.success_band is not None:
            self.success_band = tuple(float(x) for x in self.success_band)
            lo, hi = self.success_band
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(
                    f"success_band must satisfy 0 <= lo <= hi <= 1, got {self.success_band}"
                )
        if self.on_shortfall not in ("train", "error"):
            raise ValueError(f"on_shortfall must be 'train' or 'error', got {self.on_shortfall!r}")


def informative_groups(
    rewards: torch.Tensor, groups: torch.Tensor, order: torch.Tensor, cfg: DynamicSamplingConfig
) -> list[int]:
    """Group ids that pass the filter, in ``order`` (smallest first) of their first sample.

    Args:
        rewards: (N,) scalar reward per sample, all workers together.
        groups: (N,) group id per sample.
        order: (N,) sort key per sample; a group is ranked by its smallest key.
    """
    passing: list[tuple[float, int]] = []
    for gid in torch.unique(groups).tolist():
        member = groups == gid
        values = rewards[member]
        if cfg.success_band is None:
            keep = bool(values.max() > values.min())
        else:
            rate = (values >= cfg.success_threshold).float().mean().item()
            keep = cfg.success_band[0] <= rate <= cfg.success_band[1]
        if keep:
            passing.append((order[member].min().item(), gid))
    return [gid for _, gid in sorted(passing)]


def _global_view(ctx: NodeContext, batch: TensorDict) -> tuple[torch.Tensor, ...]:
    """(gid, reward, order) of every sample on the node's dp group.

    The order interleaves workers (local index first, then dp rank), so the groups kept when
    only part of them fit come evenly from every worker instead of all from rank 0.
    """
    n = batch_len(batch)
    local = (
        torch.stack(
            [
                batch[K.GROUP_ID].double(),
                batch[K.REWARDS].double(),
                torch.arange(n, dtype=torch.float64) * ctx.dp_size + ctx.dp_rank,
            ],
            dim=-1,
        )
        if n
        else torch.zeros(0, 3, dtype=torch.float64)
    )
    everyone, _ = ctx.gather_rows_over_dp(local)
    return everyone[:, 0].long(), everyone[:, 1].float(), everyone[:, 2]


@register_node(
    "filter.dynamic_sampling",
    reads=(K.REWARDS, K.GROUP_ID),
    writes=(),
    config=DynamicSamplingConfig,
    resamples=True,
)
def dynamic_sampling_node(ctx: NodeContext, batch: TensorDict) -> TensorDict:
    """Keep informative groups; re-run upstream until ``target_groups`` groups are kept."""
    cfg: DynamicSamplingConfig = ctx.node_config
    kept_parts: list[TensorDict] = []
    kept = dropped = rounds = 0
    while True:
        rounds += 1
        groups, rewards, order = _global_view(ctx, batch)
        passing = informative_groups(rewards, groups, order, cfg)
        chosen = passing[: cfg.target_groups - kept]
        kept += len(chosen)
        dropped += len(torch.unique(groups)) - len(passing)
        mask = torch.isin(batch[K.GROUP_ID], torch.tensor(chosen, dtype=torch.long))
        kept_parts.append(batch[mask])
        # Every worker computed the same global picture, so all stop in the same round.
        if kept >= cfg.target_groups or rounds >= cfg.max_rounds:
            break
        batch = ctx.resample()
    if kept < cfg.target_groups and cfg.on_shortfall == "error":
        raise RuntimeError(
            f"dynamic sampling kept {kept} of {cfg.target_groups} groups after {rounds} rounds; "
            "raise max_rounds, widen success_band, or set on_shortfall: train"
        )
    ctx.metrics.log("dapo/rounds", rounds, reduce="max")
    ctx.metrics.log("dapo/kept_groups", kept, reduce="max")
    ctx.metrics.log("dapo/dropped_groups", dropped, reduce="max")
    out = concat(kept_parts)
    ctx.log_share("dapo/kept_samples", batch_len(out))
    return out
