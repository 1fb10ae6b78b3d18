"""MLP policy: a small state (and optional image) encoder with a Gaussian or discrete head.

Implements ``embodied_rl.interfaces.EmbodiedPolicy`` with one step per action (chunk 1) and
``K = A`` tokens per step: one log-prob per action dimension.

Temperature: discrete logits are divided by it; the Gaussian standard deviation is multiplied
by it. ``act`` and ``evaluate`` apply it identically, so a stored sample scores the same.
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
from policies.mlp.configuration import MLPPolicyConfig


def _image_encoder(size: int) -> tuple[nn.Module, int]:
    """Three stride-2 convolutions: (N, 3, size, size) -> (N, 32 * (size/8)^2)."""
    layers = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    return layers, 32 * (size // 8) ** 2


class MLPPolicy(nn.Module):
    """The fast policy for CPU runs. See the module docstring for the action semantics."""

    def __init__(self, config: MLPPolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.tokens_per_step = config.action_dim
        features = config.state_dim if config.state_dim > 0 else 0
        self.image_encoder = None
        if config.image_size > 0:
            self.image_encoder, image_features = _image_encoder(config.image_size)
            features += image_features
        layers: list[nn.Module] = []
        for width in config.hidden:
            layers += [nn.Linear(features, width), nn.Tanh()]
            features = width
        self.trunk = nn.Sequential(*layers)
        outputs = config.action_dim * (config.num_bins if config.head == "discrete" else 1)
        self.head = nn.Linear(features, outputs)
        nn.init.zeros_(self.head.bias)
        self.head.weight.data.mul_(0.01)  # start near-uniform / near-zero mean
        self.log_std = nn.Parameter(torch.full((config.action_dim,), config.init_log_std))
        self.value = nn.Linear(features, 1) if config.value_head else None
        centres = torch.linspace(-1.0, 1.0, config.num_bins)
        self.register_buffer("bin_centres", centres, persistent=False)

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def _features(self, images: torch.Tensor | None, states: torch.Tensor | None) -> torch.Tensor:
        """Trunk output (N, F) from images (N, H, W, 3) uint8 and states (N, S)."""
        parts = []
        if self.config.state_dim > 0:
            parts.append(states.float().to(self.device))
        if self.image_encoder is not None:
            pixels = images.to(self.device).permute(0, 3, 1, 2).float() / 255.0
            parts.append(self.image_encoder(pixels))
        return self.trunk(torch.cat(parts, dim=-1))

    def _distribution(
        self, features: torch.Tensor, temperature: float
    ) -> torch.distributions.Distribution:
        if self.config.head == "discrete":
            logits = self.head(features).view(-1, self.config.action_dim, self.config.num_bins)
            return torch.distributions.Categorical(logits=logits / temperature)
        std = torch.exp(self.log_std) * temperature
        return torch.distributions.Normal(self.head(features), std.expand(features.shape[0], -1))

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
        """Sample (or take the mode of) one action per observation; instructions are unused."""
        features = self._features(_tensor(images), _tensor(states))
        dist = self._distribution(features, temperature)
        if self.config.head == "discrete":
            tokens = dist.sample() if do_sample else dist.logits.argmax(-1)
            actions = self.bin_centres[tokens]
            raw, logprobs = None, dist.log_prob(tokens)
        else:
            raw = dist.sample() if do_sample else dist.mean
            actions, tokens, logprobs = raw.clamp(-1.0, 1.0), None, dist.log_prob(raw)
        values = self.value(features).squeeze(-1) if self.value is not None else None
        return ActOutput(
            actions=actions.unsqueeze(1).cpu().numpy().astype(np.float32),
            tokens=None if tokens is None else tokens.cpu(),
            raw_actions=None if raw is None else raw.float().cpu(),
            logprobs=logprobs.float().cpu(),
            values=None if values is None else values.float().cpu(),
        )

    def _flat_steps(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Trunk features (B*T, F) of every step and the step mask (B, T)."""
        mask = batch[K.STEP_MASK].float()
        b, t = mask.shape
        images = states = None
        if self.config.state_dim > 0:
            states = batch[K.OBS_STATE].reshape(b * t, -1)
        if self.image_encoder is not None:
            images = batch[K.OBS_IMAGE].reshape(b * t, *batch[K.OBS_IMAGE].shape[2:])
        return self._features(images, states), mask

    def evaluate(
        self, batch: TensorDict, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, T*A) of the stored actions, step-major, 0 on masked steps."""
        features, mask = self._flat_steps(batch)
        b, t = mask.shape
        dist = self._distribution(features, temperature)
        if self.config.head == "discrete":
            taken = batch[K.ACTION_TOKENS].reshape(b * t, -1).to(self.device)
        else:
            taken = batch[K.RAW_ACTIONS].reshape(b * t, -1).to(self.device)
        logprobs = dist.log_prob(taken).view(b, t, -1)
        entropy = dist.entropy().view(b, t, -1)
        keep = mask.to(self.device).unsqueeze(-1)
        return (logprobs * keep).reshape(b, -1), (entropy * keep).reshape(b, -1)

    def values(self, batch: TensorDict) -> torch.Tensor:
        """Value of every step's observation (B, T), 0 on masked steps (needs value_head)."""
        if self.value is None:
            raise ValueError("this MLP policy has no value head; set value_head: true")
        features, mask = self._flat_steps(batch)
        return self.value(features).view(mask.shape) * mask.to(self.device)


def _tensor(array: np.ndarray | torch.Tensor | None) -> torch.Tensor | None:
    if array is None or isinstance(array, torch.Tensor):
        return array
    return torch.from_numpy(np.ascontiguousarray(array))


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of N(mu, exp(log_std)^2) per dimension: 0.5 * log(2 pi e) + log_std."""
    return 0.5 * math.log(2 * math.pi * math.e) + log_std


def build_mlp_policy(options: Mapping[str, Any], device: torch.device) -> MLPPolicy:
    """Registry builder: seeded init without touching the global RNG."""
    config = MLPPolicyConfig.from_options(options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = MLPPolicy(config)
    return policy.to(device)


POLICIES.register("mlp", build_mlp_policy)
