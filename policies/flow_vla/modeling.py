"""Flow-matching VLA policy (the pi0 family, CPU-sized): a prefix of image, proprio and
instruction features, and an action expert that denoises a chunk of C x A actions.

Implements ``embodied_rl.interfaces.EmbodiedPolicy``. ``act`` samples a chain ``x_0 .. x_S``
(``policies/flow_vla/denoising.py``): ``x_0`` is noise, ``x_S`` the normalised action chunk
(clipped to [-1, 1] and mapped to env units by the :class:`Normalizer`). What the trainer
scores is each step's Gaussian: per observation ``K = S C A`` log-probs, step-major
(entry ``(k C + c) A + d`` is step ``k``, chunk position ``c``, dimension ``d``). The whole
chain is recorded as RAW_ACTIONS ``((S + 1) C A`` values), so ``evaluate`` recomputes the
same log-probs from the same inputs.

Temperature multiplies every step's standard deviation and the initial noise's. Greedy
``act`` integrates the ODE from ``x_0 = 0``.

Behaviour cloning uses the flow-matching loss (:meth:`FlowVLAPolicy.flow_matching_loss`):
the velocity at a random time on the straight path from noise to the demonstrated chunk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from embodied_rl import keys as K
from embodied_rl.interfaces import ActOutput
from embodied_rl.registry import POLICIES
from policies.flow_vla.configuration import FlowVLAConfig
from policies.flow_vla.denoising import (
    gaussian_entropy,
    gaussian_logprob,
    ode_mean,
    sde_step,
    step_times,
)
from policies.normalization import Normalizer
from policies.observation import (
    as_tensor,
    image_encoder,
    observation_features,
    step_features,
)


def time_embedding(tau: torch.Tensor, width: int) -> torch.Tensor:
    """(N,) flow times in [0, 1] -> (N, width) sines and cosines of periods 1 down to 1/250."""
    frequencies = torch.exp(torch.linspace(0.0, math.log(250.0), width // 2, device=tau.device))
    angles = 2.0 * math.pi * tau[:, None] * frequencies
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


class ActionExpert(nn.Module):
    """A transformer over ``[prefix token, C noisy action tokens]``: the velocity of each
    action token and, for ``noise_net``, the log standard deviation of its next step."""

    def __init__(self, config: FlowVLAConfig, prefix_dim: int) -> None:
        super().__init__()
        width, actions = config.expert_width, config.action_dim
        self.width = width
        self.action_in = nn.Linear(actions, width)
        self.prefix_in = nn.Linear(prefix_dim, width)
        self.time_mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.position = nn.Parameter(torch.randn(config.chunk, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, config.expert_heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, config.expert_layers, enable_nested_tensor=False)
        self.velocity_out = nn.Linear(width, actions)
        self.log_std_out = (
            nn.Linear(width, actions) if config.logprob_method == "noise_net" else None
        )
        self.log_std_range = tuple(config.noise_log_std_range)

    def forward(
        self, x: torch.Tensor, tau: torch.Tensor, prefix: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (N, C, A), tau (N,), prefix (N, P) -> velocity (N, C, A), log-std (N, C, A) or None."""
        tokens = (
            self.action_in(x)
            + self.position
            + self.time_mlp(time_embedding(tau, self.width))[:, None]
        )
        sequence = torch.cat([self.prefix_in(prefix)[:, None], tokens], dim=1)
        hidden = self.blocks(sequence)[:, 1:]
        velocity = self.velocity_out(hidden)
        if self.log_std_out is None:
            return velocity, None
        low, high = self.log_std_range
        return velocity, low + (high - low) * torch.sigmoid(self.log_std_out(hidden))


class FlowVLAPolicy(nn.Module):
    """See the module docstring.

    Attributes:
        chunk: C; tokens_per_step: K = S C A (scored values per observation).
        image_encoder / instruction / trunk: the prefix features (``policies/observation.py``).
        expert: the :class:`ActionExpert`; value: the critic on the prefix, or ``None``.
    """

    NAME = "flow_vla"

    def __init__(self, config: FlowVLAConfig) -> None:
        super().__init__()
        self.config = config
        self.chunk = config.chunk
        self.tokens_per_step = config.tokens_per_step
        features = max(config.state_dim, 0)
        self.image_encoder = None
        if config.image_size > 0:
            self.image_encoder, image_features = image_encoder(config.image_size)
            features += image_features
        self.instruction = None
        if config.instruction_buckets > 0:
            self.instruction = nn.EmbeddingBag(
                config.instruction_buckets, config.instruction_dim, mode="mean"
            )
            features += config.instruction_dim
        layers: list[nn.Module] = []
        for width in config.prefix_hidden:
            layers += [nn.Linear(features, width), nn.GELU()]
            features = width
        self.trunk = nn.Sequential(*layers)
        self.expert = ActionExpert(config, features)
        self.value = nn.Linear(features, 1) if config.value_head else None
        self.normalizer = Normalizer(
            config.action_dim, max(config.state_dim, 0), config.gripper_convention
        )
        self.bucket_cache: dict[str, list[int]] = {}  # instruction -> word buckets

    @property
    def device(self) -> torch.device:
        return self.expert.velocity_out.weight.device

    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Set the normalisation statistics (a ``norm_stats`` entry, e.g. from demos)."""
        self.normalizer.set_statistics(statistics)

    # ------------------------------------------------------------------------ the chain
    def _step(
        self, x: torch.Tensor, tau: torch.Tensor, prefix: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The Gaussian of the next chain value: x (N, C, A), tau (N,), prefix (N, P) ->
        mean, std (N, C, A) and the velocity u (N, C, A)."""
        delta = 1.0 / self.config.denoise_steps
        u, log_std = self.expert(x, tau, prefix)
        if log_std is None:  # Flow-SDE
            mean, std = sde_step(x, u, tau, delta, self.config.noise_level)
        else:  # Flow-Noise
            mean, std = ode_mean(x, u, delta), torch.exp(log_std)
        return mean, std * temperature, u

    def _sample_chain(
        self, prefix: torch.Tensor, temperature: float, do_sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain (N, S + 1, C, A) and its step log-probs (N, S, C, A).

        Sampled: ``x_0 ~ N(0, temperature^2)``, each next value drawn from the step's
        Gaussian. Greedy: ``x_0 = 0`` and Euler steps of the ODE (scored all the same).
        """
        n, config = prefix.shape[0], self.config
        shape = (n, config.chunk, config.action_dim)
        x = (
            torch.randn(shape, device=prefix.device) * temperature
            if do_sample
            else prefix.new_zeros(shape)
        )
        chain, logprobs = [x], []
        for tau in step_times(config.denoise_steps).tolist():
            times = prefix.new_full((n,), tau)
            mean, std, u = self._step(x, times, prefix, temperature)
            if do_sample:
                x = mean + std * torch.randn_like(mean)
            else:
                x = ode_mean(x, u, 1.0 / config.denoise_steps)
            chain.append(x)
            logprobs.append(gaussian_logprob(x, mean, std))
        return torch.stack(chain, dim=1), torch.stack(logprobs, dim=1)

    def _score_chain(
        self, chain: torch.Tensor, prefix: torch.Tensor, temperature: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies (N, S, C, A) of recorded chains (N, S + 1, C, A): every
        step at once (the N S step inputs in one batch)."""
        n, steps = chain.shape[0], self.config.denoise_steps
        inputs = chain[:, :-1].reshape(n * steps, *chain.shape[2:])
        times = step_times(steps).to(prefix.device).repeat(n)
        mean, std, _ = self._step(
            inputs, times, prefix.repeat_interleave(steps, dim=0), temperature
        )
        taken = chain[:, 1:].reshape_as(mean)
        logprobs = gaussian_logprob(taken, mean, std).view(n, steps, *chain.shape[2:])
        return logprobs, gaussian_entropy(std).view_as(logprobs)

    # ------------------------------------------------------------------ the interface
    @torch.no_grad()
    def act(
        self,
        images: np.ndarray | None,
        instructions: Sequence[str],
        states: np.ndarray | None,
        *,
        temperature: float = 1.0,
        do_sample: bool = True,
    ) -> ActOutput:
        """One chunk of C actions per observation.

        Returns:
            ActOutput with actions (N, C, A) in env units, raw_actions (N, (S + 1) C A) the
            chain, logprobs (N, S C A), values (N,) with a value head.
        """
        prefix = observation_features(self, as_tensor(images), as_tensor(states), instructions)
        chain, logprobs = self._sample_chain(prefix, temperature, do_sample)
        n = prefix.shape[0]
        values = self.value(prefix).squeeze(-1) if self.value is not None else None
        return ActOutput(
            actions=self.normalizer.to_env(chain[:, -1].clamp(-1.0, 1.0)),
            tokens=None,
            raw_actions=chain.reshape(n, -1).float().cpu(),
            logprobs=logprobs.reshape(n, -1).float().cpu(),
            values=None if values is None else values.float().cpu(),
        )

    def recorded_chains(self, batch: TensorDict) -> torch.Tensor:
        """RAW_ACTIONS (B, T, (S + 1) C A) as chains (B T, S + 1, C, A); a width that another
        step count or chunk wrote is refused."""
        raw = batch[K.RAW_ACTIONS]
        config = self.config
        if raw.shape[-1] != config.chain_width:
            raise ValueError(
                f"the recorded chains have {raw.shape[-1]} values per step, this flow_vla "
                f"policy's have {config.chain_width} ((denoise_steps + 1) x chunk x action_dim "
                f"= ({config.denoise_steps} + 1) x {config.chunk} x {config.action_dim}). Fix: "
                "score rollouts with the denoise_steps and chunk that sampled them"
            )
        return raw.reshape(-1, config.denoise_steps + 1, config.chunk, config.action_dim)

    def evaluate(
        self, batch: TensorDict, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, T K) of the recorded chains, step-major, 0 on masked
        steps."""
        features, mask = step_features(self, batch)
        b, t = mask.shape
        chains = self.recorded_chains(batch).to(self.device)
        logprobs, entropy = self._score_chain(chains, features, temperature)
        keep = mask.to(self.device).unsqueeze(-1)
        return (logprobs.view(b, t, -1) * keep).reshape(b, -1), (
            entropy.view(b, t, -1) * keep
        ).reshape(b, -1)

    def flow_matching_loss(self, batch: TensorDict, targets: torch.Tensor) -> torch.Tensor:
        """Squared velocity error (n, C A) at a uniform random time of each row's path.

        ``x_tau = (1 - tau) eps + tau a`` with ``eps ~ N(0, 1)``; the target velocity is
        ``a - eps``. targets: (n, C A) normalised demonstrated actions (``action_targets``).
        """
        features, _ = step_features(self, batch)
        actions = targets.to(self.device).view(-1, self.chunk, self.config.action_dim)
        noise = torch.randn_like(actions)
        tau = torch.rand(actions.shape[0], device=actions.device)
        point = (1.0 - tau[:, None, None]) * noise + tau[:, None, None] * actions
        velocity, _ = self.expert(point, tau, features)
        return ((velocity - (actions - noise)) ** 2).reshape(len(actions), -1)

    def action_targets(self, actions: torch.Tensor) -> tuple[str, torch.Tensor]:
        """RAW_ACTIONS (N, C A): the normalised env actions (N, C, A), what the flow-matching
        loss reads."""
        wanted = (self.chunk, self.config.action_dim)
        if tuple(actions.shape[1:]) != wanted:
            raise ValueError(
                f"the flow_vla policy takes chunks of {wanted[0]} x {wanted[1]} actions, got "
                f"{tuple(actions.shape)}; set the demonstrations' chunk to {self.chunk}"
            )
        return K.RAW_ACTIONS, self.normalizer.from_env(actions).reshape(len(actions), -1)

    @torch.no_grad()
    def action_mode(self, batch: TensorDict) -> torch.Tensor:
        """The greedy (ODE) chunk of every step (B, T C A), normalised, 0 on masked steps."""
        features, mask = step_features(self, batch)
        chain, _ = self._sample_chain(features, 1.0, do_sample=False)
        b, t = mask.shape
        return (chain[:, -1].reshape(b, t, -1) * mask.to(self.device).unsqueeze(-1)).reshape(b, -1)

    def values(self, batch: TensorDict) -> torch.Tensor:
        """Value of every step's observation (B, T) from the prefix, 0 on masked steps."""
        if self.value is None:
            raise ValueError("this flow_vla policy has no value head; set value_head: true")
        features, mask = step_features(self, batch)
        return self.value(features).view(mask.shape) * mask.to(self.device)


@POLICIES.register("flow_vla")
def build_flow_vla_policy(options: Mapping[str, Any], device: torch.device) -> FlowVLAPolicy:
    """Registry builder: seeded init without touching the global RNG."""
    config = FlowVLAConfig.from_options(options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = FlowVLAPolicy(config)
    return policy.to(device)


# What an ``init_from`` checkpoint must agree on (embodied_rl/interfaces.py, PolicyBuilder).
build_flow_vla_policy.architecture_options = FlowVLAConfig.architecture_options
build_flow_vla_policy.state_size = FlowVLAConfig.state_size_of
