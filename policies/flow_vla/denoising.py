"""The denoising chain of a flow-matching policy, made stochastic so that RL can score it.

Time ``tau`` runs from 0 (noise) to 1 (action) in ``S`` equal steps of ``delta = 1 / S``;
``x_tau = (1 - tau) eps + tau a`` and the network predicts the velocity ``u = a - eps``.
Inference integrates ``dx / dtau = u`` (Euler: ``x_{k+1} = x_k + delta u``), so a sampled
chunk has no likelihood of its own; each step is made a Gaussian instead and the chain's
log-probability is the sum of the steps' (piRL, arXiv 2510.25889, after Flow-GRPO):

- ``sde`` (Flow-SDE): the ODE step becomes the step of the SDE with the same marginals
  (Flow-GRPO, arXiv 2505.05470, eq. 9 and 12, written here in ``tau``; ``t = 1 - tau`` is
  their noise time)::

      sigma_t = noise_level * sqrt(t / (1 - t))        (t of the first step: that of the
                                                        second, their sigma_max; t = 1 is
                                                        infinite)
      mean    = x + delta u - delta sigma_t^2 / (2 t) (x - (1 - t) u)
      std     = sigma_t sqrt(delta)

- ``noise_net`` (Flow-Noise): the ODE step's mean ``x + delta u`` with a per-dimension
  standard deviation that a small learned network sets for each step.

Greedy evaluation integrates the ODE from ``x_0 = 0`` (the noise's mode).
"""

from __future__ import annotations

import math

import torch

LOGPROB_METHODS = ("sde", "noise_net")


def step_times(steps: int) -> torch.Tensor:
    """(S,) ``tau_k = k / S``, the time at which step ``k`` reads the velocity."""
    return torch.arange(steps, dtype=torch.float32) / steps


def sde_sigma(tau: torch.Tensor, delta: float, noise_level: float) -> torch.Tensor:
    """``sigma_t`` of Flow-SDE at ``t = 1 - tau`` (capped at ``t = 1 - delta``)."""
    t = (1.0 - tau).clamp(max=1.0 - delta)
    return noise_level * torch.sqrt(t / (1.0 - t))


def sde_step(
    x: torch.Tensor, u: torch.Tensor, tau: torch.Tensor, delta: float, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of ``x_{k+1}`` given ``x_k``: x, u (N, ...), tau (N,) -> (N, ...) each."""
    shape = (-1,) + (1,) * (x.dim() - 1)
    t = (1.0 - tau).clamp(min=delta).view(shape)  # the last step reads t = delta, never 0
    sigma = sde_sigma(tau, delta, noise_level).view(shape)
    mean = x + delta * u - delta * sigma**2 / (2.0 * t) * (x - (1.0 - t) * u)
    return mean, (sigma * math.sqrt(delta)).expand_as(mean)


def ode_mean(x: torch.Tensor, u: torch.Tensor, delta: float) -> torch.Tensor:
    """The Euler step of the ODE (the mean of a ``noise_net`` step)."""
    return x + delta * u


def gaussian_logprob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise ``log N(value; mean, std^2)``."""
    return -((value - mean) ** 2) / (2.0 * std**2) - torch.log(std) - 0.5 * math.log(2.0 * math.pi)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy ``0.5 log(2 pi e std^2)``."""
    return 0.5 * math.log(2.0 * math.pi * math.e) + torch.log(std)
