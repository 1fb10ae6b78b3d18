"""MLP policy: a small state / image / instruction encoder with a Gaussian or discrete head.

Implements ``embodied_rl.interfaces.EmbodiedPolicy``. One observation gives a chunk of ``C``
actions of ``A`` dimensions, ``K = C * A`` outputs per step, chunk-major (output ``A s + d``
is dimension ``d`` of chunk step ``s``); ``C = 1`` by default.

Outputs live in normalised units ([-1, 1]); ``act`` maps them to env actions with the
policy's :class:`policies.normalization.Normalizer` (q01/q99 statistics and the gripper
convention, identity until statistics are set), which also normalises the proprio input.

Temperature: discrete logits are divided by it; the Gaussian standard deviation is multiplied
by it. ``act`` and ``evaluate`` apply it identically, so a stored sample scores the same.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from torch import nn

from embodied_rl import keys as K
from embodied_rl.interfaces import ActOutput
from embodied_rl.registry import POLICIES
from policies.folder_layout import (
    CONFIG_FILE,
    STATISTICS_FILE,
    WEIGHTS_FILE,
    is_statistics_buffer,
)
from policies.mlp.configuration import MLPPolicyConfig
from policies.normalization import Normalizer, select_statistics
from policies.observation import (
    as_tensor,
    image_encoder,
    observation_features,
    step_features,
)

MODEL_TYPE = "embodied_rl_mlp"  # config.json's model_type
STATISTICS_NAME = "demonstrations"  # the dataset name the statistics are saved under


class MLPPolicy(nn.Module):
    """The fast policy for CPU runs. See the module docstring for the action semantics.

    Attributes:
        chunk: C; tokens_per_step: K = C * A.
        image_encoder / instruction / trunk: the observation features
            (``policies/observation.py``).
        normalizer: the action / proprio statistics and gripper convention (buffers).
        instruction: the hashed bag-of-words ``EmbeddingBag``, or ``None``.
    """

    NAME = "mlp"

    def __init__(self, config: MLPPolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.chunk = config.chunk
        self.tokens_per_step = config.chunk * config.action_dim
        features = config.state_dim if config.state_dim > 0 else 0
        self.image_encoder = None
        if config.image_size > 0:
            self.image_encoder, image_features = image_encoder(config.image_size)
            features += image_features
        if config.instruction_buckets > 0:
            features += config.instruction_dim
        layers: list[nn.Module] = []
        for width in config.hidden:
            layers += [nn.Linear(features, width), nn.Tanh()]
            features = width
        self.trunk = nn.Sequential(*layers)
        outputs = self.tokens_per_step * (config.num_bins if config.head == "discrete" else 1)
        self.head = nn.Linear(features, outputs)
        nn.init.zeros_(self.head.bias)
        self.head.weight.data.mul_(0.01)  # start near-uniform / near-zero mean
        self.log_std = nn.Parameter(torch.full((config.action_dim,), config.init_log_std))
        self.value = nn.Linear(features, 1) if config.value_head else None
        centres = torch.linspace(-1.0, 1.0, config.num_bins)
        self.register_buffer("bin_centres", centres, persistent=False)
        self.normalizer = Normalizer(
            config.action_dim, max(config.state_dim, 0), config.gripper_convention
        )
        # Built last: options without it draw the same initial weights as before it existed.
        self.instruction = None
        if config.instruction_buckets > 0:
            self.instruction = nn.EmbeddingBag(
                config.instruction_buckets, config.instruction_dim, mode="mean"
            )
        self.bucket_cache: dict[str, list[int]] = {}  # instruction -> word buckets

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def set_statistics(self, statistics: Mapping[str, Any]) -> None:
        """Set the normalisation statistics (a ``norm_stats`` entry, e.g. from demos)."""
        self.normalizer.set_statistics(statistics)

    def _distribution(
        self, features: torch.Tensor, temperature: float
    ) -> torch.distributions.Distribution:
        """Over the K outputs of each of N steps: logits (N, K, bins) or Normal (N, K)."""
        if self.config.head == "discrete":
            logits = self.head(features).view(-1, self.tokens_per_step, self.config.num_bins)
            return torch.distributions.Categorical(logits=logits / temperature)
        std = torch.exp(self.log_std).repeat(self.chunk) * temperature
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
        """Sample (or take the mode of) one chunk of C actions per observation.

        Returns:
            ActOutput with actions (N, C, A) float32 in env units, logprobs (N, K) and tokens
            (N, K) bin ids (discrete) or raw_actions (N, K) normalised samples (Gaussian).
        """
        features = observation_features(self, as_tensor(images), as_tensor(states), instructions)
        dist = self._distribution(features, temperature)
        if self.config.head == "discrete":
            tokens = dist.sample() if do_sample else dist.logits.argmax(-1)
            normalized = self.bin_centres[tokens]
            raw, logprobs = None, dist.log_prob(tokens)
        else:
            raw = dist.sample() if do_sample else dist.mean
            normalized, tokens, logprobs = raw.clamp(-1.0, 1.0), None, dist.log_prob(raw)
        values = self.value(features).squeeze(-1) if self.value is not None else None
        n = features.shape[0]
        return ActOutput(
            actions=self.normalizer.to_env(normalized.view(n, self.chunk, -1)),
            tokens=None if tokens is None else tokens.cpu(),
            raw_actions=None if raw is None else raw.float().cpu(),
            logprobs=logprobs.float().cpu(),
            values=None if values is None else values.float().cpu(),
        )

    def evaluate(
        self, batch: TensorDict, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropy (B, T*K) of the stored actions, step-major, 0 on masked steps."""
        features, mask = step_features(self, batch)
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

    def bin_logprobs(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-softmax (B, T*K, bins) at temperature 1 and the stored ACTION_TOKENS bin ids
        (B, T*K), 0 on masked steps (:class:`embodied_rl.interfaces.BinnedActionPolicy`)."""
        if self.config.head != "discrete":
            raise ValueError(
                "the mlp policy's Gaussian head has no action bins; bin-smoothed targets need "
                "head: discrete"
            )
        features, mask = step_features(self, batch)
        b, t = mask.shape
        logprobs = self._distribution(features, 1.0).logits  # normalised: (b * t, K, bins)
        taken = batch[K.ACTION_TOKENS].reshape(b * t, -1).to(self.device).long()
        keep = mask.to(self.device).reshape(b * t, 1)
        return (
            (logprobs * keep.unsqueeze(-1)).reshape(b, -1, self.config.num_bins),
            (taken * keep.long()).reshape(b, -1),
        )

    def action_mode(self, batch: TensorDict) -> torch.Tensor:
        """Most likely output of every step (B, T*K), 0 on masked steps: the Gaussian mean
        (normalised units, differentiable) or the most likely bin id (float)."""
        features, mask = step_features(self, batch)
        b, t = mask.shape
        if self.config.head == "discrete":
            mode = self._distribution(features, 1.0).logits.argmax(-1).float()
        else:
            mode = self.head(features)
        keep = mask.to(self.device).unsqueeze(-1)
        return (mode.view(b, t, -1) * keep).reshape(b, -1)

    def action_targets(self, actions: torch.Tensor) -> tuple[str, torch.Tensor]:
        """What ``evaluate`` scores for env actions (N, C, A): RAW_ACTIONS (N, K), the
        normalised actions (Gaussian), or ACTION_TOKENS (N, K), their nearest bins."""
        wanted = (self.chunk, self.config.action_dim)
        if tuple(actions.shape[1:]) != wanted:
            raise ValueError(
                f"the mlp policy takes chunks of {wanted[0]} x {wanted[1]} actions, got actions "
                f"of shape {tuple(actions.shape)}; set the demonstrations' chunk to {self.chunk}"
            )
        normalized = self.normalizer.from_env(actions).reshape(len(actions), -1)
        if self.config.head == "gaussian":
            return K.RAW_ACTIONS, normalized
        scaled = (normalized + 1.0) * 0.5 * (self.config.num_bins - 1)
        return K.ACTION_TOKENS, scaled.round().long().clamp(0, self.config.num_bins - 1)

    def values(self, batch: TensorDict) -> torch.Tensor:
        """Value of every step's observation (B, T), 0 on masked steps (needs value_head)."""
        if self.value is None:
            raise ValueError("this MLP policy has no value head; set value_head: true")
        features, mask = step_features(self, batch)
        return self.value(features).view(mask.shape) * mask.to(self.device)

    def save_pretrained(self, folder: str | os.PathLike[str]) -> Path:
        """Write the policy in the Hugging Face layout :meth:`from_pretrained` reads.

        ``config.json`` (the options, ``model_type`` ``embodied_rl_mlp``), ``model.safetensors``
        (the weights) and, when statistics are set, ``dataset_statistics.json`` (OpenVLA's
        ``norm_stats`` format, as the VLA policies write it); the statistics buffers are not
        in the weights file, as in the published OpenVLA layout.
        """
        out = Path(folder).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        weights = {
            name: tensor.detach().cpu().contiguous()
            for name, tensor in self.state_dict().items()
            if not is_statistics_buffer(name)
        }
        save_file(weights, str(out / WEIGHTS_FILE))
        config = {"model_type": MODEL_TYPE, **dataclasses.asdict(self.config)}
        (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        statistics = self.normalizer.statistics()
        if statistics is not None:
            text = json.dumps({STATISTICS_NAME: statistics}, indent=2)
            (out / STATISTICS_FILE).write_text(text + "\n")
        return out

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike[str], device: torch.device | str = "cpu"
    ) -> MLPPolicy:
        """Load a folder written by :meth:`save_pretrained` (no run folder needed)."""
        folder = Path(folder).expanduser()
        if not (folder / CONFIG_FILE).is_file():
            raise FileNotFoundError(
                f"{folder} has no {CONFIG_FILE}; point at a folder written by "
                "MLPPolicy.save_pretrained (embodied-rl export of an mlp run)"
            )
        options = json.loads((folder / CONFIG_FILE).read_text())
        if options.pop("model_type", None) != MODEL_TYPE:
            raise ValueError(f"{folder / CONFIG_FILE} is not an embodied_rl mlp policy's config")
        policy = build_mlp_policy(options, torch.device("cpu"))
        expected = {k for k in policy.state_dict() if not is_statistics_buffer(k)}
        weights = load_file(str(folder / WEIGHTS_FILE))
        if set(weights) != expected:
            raise ValueError(
                f"{folder / WEIGHTS_FILE} does not match its config.json: missing "
                f"{sorted(expected - set(weights))}, unexpected {sorted(set(weights) - expected)}"
            )
        policy.load_state_dict(weights, strict=False)  # the statistics come from their file
        if (folder / STATISTICS_FILE).is_file():
            norm_stats = json.loads((folder / STATISTICS_FILE).read_text())
            _, entry = select_statistics(norm_stats, None)
            policy.set_statistics(entry)
        return policy.to(device)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of N(mu, exp(log_std)^2) per dimension: 0.5 * log(2 pi e) + log_std."""
    return 0.5 * math.log(2 * math.pi * math.e) + log_std


@POLICIES.register("mlp")
def build_mlp_policy(options: Mapping[str, Any], device: torch.device) -> MLPPolicy:
    """Registry builder: seeded init without touching the global RNG."""
    config = MLPPolicyConfig.from_options(options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy = MLPPolicy(config)
    return policy.to(device)


# What an ``init_from`` checkpoint must agree on (embodied_rl/interfaces.py, PolicyBuilder).
build_mlp_policy.architecture_options = MLPPolicyConfig.architecture_options
build_mlp_policy.state_size = MLPPolicyConfig.state_size_of
