"""``models.<name>.parallel``: validation, strategy choice, and the model-level building blocks.

The 2-rank FSDP-vs-DDP runs and the CUDA-only mixed precision + CPU offload + gradient
checkpointing run are in ``test_fsdp.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from embodied_rl.data.layout import Layout
from embodied_rl.runtime.fsdp import (
    autocast_methods,
    enable_gradient_checkpointing,
    transformer_blocks,
)
from embodied_rl.runtime.models import ModelSpec, ModelStore, ModelUse, ParallelConfig, model_uses

MLP = {"policy": "mlp", "options": {"state_dim": 4, "action_dim": 2, "hidden": [8]}}


def _spec(**parallel):
    return ModelSpec.from_mapping("actor", {**MLP, "parallel": parallel})


def test_parallel_defaults_to_the_device_choice():
    assert _spec().parallel == ParallelConfig("auto", False, False, "auto")


def test_unknown_parallel_key_names_the_valid_ones():
    with pytest.raises(ValueError) as info:
        _spec(strategy="fsdp", offload=True)
    message = str(info.value)
    assert "models.actor.parallel.offload" in message
    for key in ("cpu_offload", "gradient_checkpointing", "mixed_precision", "strategy"):
        assert key in message


@pytest.mark.parametrize(
    ("parallel", "match"),
    [
        ({"strategy": "zero3"}, r"strategy must be one of \('auto', 'ddp', 'fsdp'\)"),
        ({"mixed_precision": "fp8"}, "mixed_precision must be one of"),
        ({"strategy": "ddp", "cpu_offload": True}, "cpu_offload needs strategy fsdp"),
        ({"cpu_offload": "yes"}, "cpu_offload must be true or false"),
    ],
)
def test_bad_parallel_values_are_errors(parallel, match):
    with pytest.raises(ValueError, match=match):
        _spec(**parallel)


def test_parallel_on_a_frozen_model_is_an_error():
    with pytest.raises(ValueError, match="trainable models only"):
        ModelSpec.from_mapping("ref", {**MLP, "trainable": False, "parallel": {"strategy": "ddp"}})


def test_strategy_and_dtype_follow_the_device_unless_set():
    specs = {"auto": MLP, "fp32": {**MLP, "parallel": {"mixed_precision": "float32"}}}
    cpu = ModelStore(specs, torch.device("cpu"))
    assert (cpu.strategy("auto"), cpu.compute_dtype("auto")) == ("ddp", None)
    # Building nothing, so a cuda store can be asked on a CPU-only machine.
    cuda = ModelStore(specs, torch.device("cuda"))
    assert cuda.compute_dtype("auto") == torch.bfloat16
    assert cuda.compute_dtype("fp32") is None
    # auto is fsdp on cuda, but a single process (no process group) has nothing to shard over
    assert cuda.strategy("auto") == "ddp"


def test_explicit_fsdp_without_a_process_group_is_an_error():
    store = ModelStore({"actor": {**MLP, "parallel": {"strategy": "fsdp"}}}, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="not initialised.*use strategy auto or ddp"):
        store["actor"]


def test_full_weights_of_a_replicated_model_are_its_state_dict():
    import policies  # noqa: F401  registers the mlp policy

    store = ModelStore({"actor": MLP}, torch.device("cpu"))
    expected = store["actor"].state_dict()
    got = dict(store.full_weights("actor"))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value)


def test_model_uses_collects_the_nodes_that_name_each_model():
    node = lambda i, model, ranks: SimpleNamespace(  # noqa: E731
        id=i, config=SimpleNamespace(model=model) if model else None, layout=Layout(ranks)
    )
    train = SimpleNamespace(nodes=[node("train", "actor", (0, 1)), node("data", None, (0,))])
    evaluation = SimpleNamespace(nodes=[node("eval", "actor", (0,))])
    assert model_uses([train, evaluation]) == {
        "actor": [ModelUse("train", Layout((0, 1))), ModelUse("eval", Layout((0,)))]
    }


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 2)
        self.layers = nn.ModuleList(Block() for _ in range(4))
        self.mixed = nn.ModuleList([nn.Linear(2, 2), nn.ReLU()])
        self.single = nn.ModuleList([nn.Linear(2, 2)])

    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        return self.embed(x)


def test_transformer_blocks_are_the_outermost_repeated_module_list_children():
    net = Net()
    # Not the experts inside each block, not a mixed or one-element list.
    assert transformer_blocks(net) == list(net.layers)


def test_gradient_checkpointing_prefers_the_policy_then_transformers_then_fails():
    calls = []

    class Policy(Net):
        def enable_gradient_checkpointing(self) -> None:
            calls.append("policy")

    class HFModel(nn.Module):
        def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
            calls.append(activation_checkpointing_kwargs)

    enable_gradient_checkpointing(Policy(), "actor")
    wrapper = Net()
    wrapper.lm = HFModel()
    enable_gradient_checkpointing(wrapper, "actor")
    assert calls == ["policy", {"use_reentrant": False}]
    with pytest.raises(ValueError, match="models.actor.parallel.gradient_checkpointing.*false"):
        enable_gradient_checkpointing(Net(), "actor")


def test_ddp_mixed_precision_runs_the_policy_methods_under_autocast():
    net = Net()
    x = torch.randn(3, 2)
    assert net.evaluate(x).dtype == torch.float32
    autocast_methods(net, "cpu", torch.bfloat16)
    out = net.evaluate(x)
    assert out.dtype == torch.bfloat16  # a linear layer under CPU autocast
    assert net.embed.weight.dtype == torch.float32  # master weights stay float32
