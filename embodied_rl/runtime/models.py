"""Models of one worker, built lazily from ``cfg.models`` through the policy registry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from embodied_rl.registry import POLICIES


@dataclass
class OptimizerConfig:
    """AdamW options of a trainable model (``models.<name>.optimizer``)."""

    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    eps: float = 1e-8
    grad_clip: float | None = 1.0

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if self.lr <= 0:
            raise ValueError(f"optimizer.lr must be > 0, got {self.lr}")


@dataclass
class ModelSpec:
    """One entry of ``cfg.models``: which policy, its options, and whether it trains.

    A reference model is a non-trainable entry with the same options as the actor: policies
    build deterministically from their options (seeded init or the same local weights), so
    it starts identical to the actor.
    """

    policy: str
    options: dict[str, Any] = field(default_factory=dict)
    trainable: bool = True
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    @classmethod
    def from_mapping(cls, name: str, raw: Mapping[str, Any]) -> ModelSpec:
        allowed = {"policy", "options", "trainable", "optimizer"}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(
                f"models.{name}: unknown key(s) {unknown}; valid keys: {sorted(allowed)}"
            )
        if "policy" not in raw:
            raise ValueError(f"models.{name}: missing 'policy' (one of {POLICIES.names()})")
        optim = dict(raw.get("optimizer") or {})
        bad = sorted(set(optim) - set(OptimizerConfig.__dataclass_fields__))
        if bad:
            raise ValueError(
                f"models.{name}.optimizer: unknown key(s) {bad}; valid keys: "
                f"{sorted(OptimizerConfig.__dataclass_fields__)}"
            )
        return cls(
            policy=str(raw["policy"]),
            options=dict(raw.get("options") or {}),
            trainable=bool(raw.get("trainable", True)),
            optimizer=OptimizerConfig(**optim),
        )


class ModelStore:
    """Builds each model on first use and owns the optimizers of trainable ones."""

    def __init__(self, specs: Mapping[str, Mapping[str, Any]], device: torch.device) -> None:
        self.specs = {name: ModelSpec.from_mapping(name, raw) for name, raw in specs.items()}
        self.device = device
        self._models: dict[str, torch.nn.Module] = {}
        self._optimizers: dict[str, torch.optim.Optimizer] = {}

    def __getitem__(self, name: str) -> torch.nn.Module:
        if name not in self._models:
            self._models[name] = self._build(name)
        return self._models[name]

    def _build(self, name: str) -> torch.nn.Module:
        if name not in self.specs:
            raise KeyError(f"model {name!r} is not configured; add models.{name} to the config")
        spec = self.specs[name]
        model = POLICIES.get(spec.policy)(spec.options, self.device)
        if not spec.trainable:
            model.eval()
            model.requires_grad_(False)
        return model

    def optimizer(self, name: str) -> torch.optim.Optimizer:
        if not self.specs[name].trainable:
            raise ValueError(f"model {name!r} has trainable: false; it cannot be optimised")
        if name not in self._optimizers:
            opt = self.specs[name].optimizer
            params = [p for p in self[name].parameters() if p.requires_grad]
            self._optimizers[name] = torch.optim.AdamW(
                params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay, eps=opt.eps
            )
        return self._optimizers[name]

    def grad_clip(self, name: str) -> float | None:
        return self.specs[name].optimizer.grad_clip

    def built(self) -> list[str]:
        return sorted(self._models)

    def state_dict(self) -> dict[str, Any]:
        """Weights of trainable models and optimizer states (frozen models rebuild as-is)."""
        state: dict[str, Any] = {}
        for name in self.built():
            if self.specs[name].trainable:
                state[f"model/{name}"] = self._models[name].state_dict()
                state[f"optim/{name}"] = self.optimizer(name).state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key, value in state.items():
            kind, name = key.split("/", 1)
            if kind == "model":
                self[name].load_state_dict(value)
            else:
                self.optimizer(name).load_state_dict(value)
