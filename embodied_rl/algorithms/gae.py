"""PPO's critic-side math (docs/ALGORITHMS.md, "GAE (PPO)"): GAE, global whitening, value loss.

Per valid response token t of a sequence:

    delta_t = r_t + gamma * V_{t+1} - V_t                      (V after the last valid token = 0)
    A_t     = sum_l (gamma * lam)^l * delta_{t+l}              (over valid tokens only)
    R_t     = A_t + V_t                                        (the critic's regression target)

"Over valid tokens only": masked positions are skipped, not treated as zero-reward steps, so
the token after t is the next *valid* token. Right padding (holes at the end) is the usual
case; holes inside a sequence (e.g. masked tool output) are skipped the same way.

The value loss is ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
``V_clip = V_old + clip(V - V_old, -c, c)``.

Shapes: ``B`` sequences, ``R`` response tokens.
"""

from __future__ import annotations

import torch


def _check_shapes(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> None:
    shapes = {tuple(token_rewards.shape), tuple(values.shape), tuple(mask.shape)}
    if token_rewards.dim() != 2 or len(shapes) != 1:
        raise ValueError(
            "gae needs token_rewards, values and mask of one shape (B, R); got "
            f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(mask.shape)}"
        )


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of every valid token by the backward GAE recursion.

    The recursion ``A_t = delta_t + gamma * lam * A_{t+1}`` runs from the last position to the
    first; at a masked position nothing is updated, so the carried ``V_{t+1}`` and ``A_{t+1}``
    are those of the next valid token (0 after the last one).

    Args:
        token_rewards: (B, R) reward r_t received for emitting token t.
        values: (B, R) critic values V(s_t) of the state before token t.
        mask: (B, R) 1 for valid tokens, 0 for padding (any numeric dtype).
        gamma: discount factor in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        advantages: (B, R) float32, 0 at masked positions.
        returns: (B, R) float32 ``advantages + values``, 0 at masked positions.
    """
    _check_shapes(token_rewards, values, mask)
    rewards = token_rewards.float()
    values = values.float()
    valid = mask > 0
    batch, length = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(batch)  # V_{t+1}: 0 after the last valid token
    next_advantage = rewards.new_zeros(batch)  # A_{t+1}
    for t in range(length - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # delta_t
        advantage = delta + gamma * lam * next_advantage  # A_t = delta_t + gamma*lam*A_{t+1}
        keep = valid[:, t]
        advantages[:, t] = torch.where(keep, advantage, torch.zeros_like(advantage))
        next_value = torch.where(keep, values[:, t], next_value)
        next_advantage = torch.where(keep, advantage, next_advantage)
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` per token.

    ``V_clip = V_old + clip(V - V_old, -c, c)`` keeps the new value within ``c`` of the value
    the critic predicted at rollout time.

    Args:
        values: (B, R) current critic values V.
        old_values: (B, R) values V_old at rollout time.
        returns: (B, R) regression targets R (GAE returns).
        clip: the value clip range c > 0.

    Returns:
        loss: (B, R) per-token loss (unmasked; aggregate it with the response mask).
        clipped: (B, R) bool, where the clipped term is the larger one.
    """
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)  # V_clip
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    return loss, clipped_loss > unclipped_loss
