"""Security defaults: safe weight loading, no remote code, no dashboard, no eval of model text.

Source rules are checked on the syntax tree of every module of the project's packages (and
``scripts/``), so a new call site that breaks a rule fails here with its file and line; the
behaviour behind each default is then checked on real objects.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import psutil
import pytest
import torch

import embodied_rl.nodes  # noqa: F401  (registers reward.arithmetic)
from embodied_rl import keys as K
from embodied_rl.data.batch import make_batch
from embodied_rl.launch.ray_setup import ray_init_kwargs
from embodied_rl.registry import NODE_TYPES
from embodied_rl.runtime.config import compose
from embodied_rl.runtime.context import NodeContext
from embodied_rl.tasks.arithmetic import ArithmeticRewardConfig, score

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("embodied_rl", "policies", "rollout", "simulators", "scripts")
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))


@functools.cache
def _modules() -> tuple[tuple[str, ast.Module], ...]:
    """``(path relative to the repository, syntax tree)`` of every scanned module."""
    return tuple(
        (str(path.relative_to(ROOT)), ast.parse(path.read_text(), filename=str(path)))
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
    )


def _calls(attribute: str) -> list[tuple[str, ast.Call]]:
    """Every call ``<something>.<attribute>(...)`` in the scanned code, with ``file:line``."""
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == attribute
            ):
                found.append((f"{name}:{node.lineno}", node))
    return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _is_true(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Constant) and value.value is True


def _receiver(call: ast.Call) -> str:
    """``AutoTokenizer`` for ``AutoTokenizer.from_pretrained(...)``."""
    return ast.unparse(call.func.value)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- weights
def test_every_torch_load_passes_weights_only_true():
    loads = [
        (where, call)
        for where, call in _calls("load")
        if isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"  # type: ignore[attr-defined]
    ]
    assert loads, "the checkpoint loader's torch.load was not found: is the scan broken?"
    unsafe = [where for where, call in loads if not _is_true(_keyword(call, "weights_only"))]
    assert not unsafe, f"torch.load without weights_only=True (unpickling runs code): {unsafe}"
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "torch":
                names = {alias.name for alias in node.names}
                assert "load" not in names, f"{name}:{node.lineno} imports torch.load bare"


def test_checkpoint_shards_refuse_pickled_code(tmp_path: Path):
    """A shard whose pickle would call a function is refused by the real loader."""
    from embodied_rl.checkpoint import finalize, load_rank_shard, write_rank_shard

    write_rank_shard(tmp_path, 1, 0, {"w": torch.ones(2)})
    # Replace the shard by one holding an arbitrary object; keep the manifest consistent,
    # so only weights_only stands between the file and the unpickler.
    shard = tmp_path / "step_000001.tmp" / "rank_00000.pt"
    torch.save({"w": torch.ones(2), "payload": _Payload()}, shard)
    final = finalize(tmp_path, 1, world_size=1)
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        load_rank_shard(final, 0, world_size=1)
    assert not _Payload.ran


class _Payload:
    """Unpickling this calls ``_Payload._run`` (what a malicious checkpoint would do)."""

    ran = False

    def __reduce__(self):
        return (_Payload._run, ())

    @staticmethod
    def _run() -> None:
        _Payload.ran = True


def test_model_from_pretrained_reads_local_safetensors_only():
    """Models load with ``use_safetensors=True`` and nothing is fetched over the network."""
    calls = _calls("from_pretrained")
    assert len(calls) >= 3, calls  # causal LM, its tokenizers, the V-JEPA 2 encoder
    for where, call in calls:
        assert _is_true(_keyword(call, "local_files_only")), f"{where}: may download"
        if not _receiver(call).endswith(("Tokenizer", "Processor")):
            assert _is_true(_keyword(call, "use_safetensors")), f"{where}: may unpickle"


def _local_checkpoint(folder: Path, config: dict) -> None:
    """A local HF checkpoint directory: ``config.json`` and the Qwen2.5 tokenizer files."""
    from policies.causal_lm.tokenizer import build_qwen2_tokenizer

    (folder / "config.json").write_text(json.dumps(config))
    build_qwen2_tokenizer().save_pretrained(folder)


def test_causal_lm_refuses_a_pickled_checkpoint(tmp_path: Path):
    from policies.causal_lm.modeling import build_causal_lm

    _local_checkpoint(tmp_path, {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})
    torch.save({"lm_head.weight": torch.zeros(1, 1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="only safetensors are loaded"):
        build_causal_lm({"preset": None, "path": str(tmp_path)}, torch.device("cpu"))


# ------------------------------------------------------------------------ remote code
def test_trust_remote_code_is_never_hard_coded_on():
    for where, call in _calls("from_pretrained"):
        assert not any(kw.arg is None for kw in call.keywords), f"{where}: **kwargs may hide it"
        assert not _is_true(_keyword(call, "trust_remote_code")), where


@pytest.mark.parametrize("config_name", CONFIGS)
def test_configs_keep_trust_remote_code_off(config_name: str):
    from policies.causal_lm.configuration import CausalLMConfig

    assert CausalLMConfig().trust_remote_code is False
    models = compose(config_name, []).models
    for name, spec in models.items():
        options = spec.get("options") or {}
        assert options.get("trust_remote_code", False) is False, f"{config_name}: {name}"


def test_checkpoint_with_custom_code_is_refused_by_default(tmp_path: Path):
    """A checkpoint whose config points at its own Python code: the code never runs."""
    from policies.causal_lm.modeling import build_causal_lm

    marker = tmp_path / "code_ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    auto_map = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilLM"}
    config = {"model_type": "evil_lm", "architectures": ["EvilLM"], "auto_map": auto_map}
    _local_checkpoint(tmp_path, config)
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the config fails first
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        build_causal_lm({"preset": None, "path": str(tmp_path)}, torch.device("cpu"))
    assert not marker.exists()


# ---------------------------------------------------------------------------- ray
def test_embedded_ray_starts_without_dashboard_and_joining_keeps_the_cluster_settings():
    cfg = compose("grpo_llm", [])
    kwargs = ray_init_kwargs(cfg, num_workers=2, cpus_per_worker=1)
    assert kwargs["include_dashboard"] is False
    assert kwargs["dashboard_host"] == "127.0.0.1"
    assert kwargs["num_cpus"] >= 2
    joined = ray_init_kwargs(compose("grpo_llm", ["ray.address=auto"]), 2, 1)
    assert joined == {"address": "auto", "log_to_driver": True}


@pytest.mark.ray
@pytest.mark.own_ray_cluster
def test_embedded_ray_cluster_serves_no_dashboard():
    """Started with the launcher's arguments, Ray runs no dashboard web server.

    Ray still starts its ``dashboard.py`` head process for internal services; it must run
    with the web frontend disabled, on 127.0.0.1, and listen on none of the dashboard ports.
    """
    import ray

    ctx = ray.init(**{**ray_init_kwargs(compose("grpo_llm", []), 1, 0.5), "num_cpus": 1})
    try:
        assert not ctx.dashboard_url
        heads = [
            proc
            for proc in psutil.Process().children(recursive=True)
            if any(arg.endswith("dashboard/dashboard.py") for arg in _cmdline(proc))
        ]
        for proc in heads:
            args = proc.cmdline()
            assert "--disable-frontend" in args and "--host=127.0.0.1" in args, args
            first = int(next(a for a in args if a.startswith("--port=")).split("=", 1)[1])
            retries = int(next(a for a in args if a.startswith("--port-retries=")).split("=")[1])
            listening = {
                conn.laddr.port
                for conn in proc.net_connections(kind="inet")
                if conn.status == psutil.CONN_LISTEN
            }
            assert not listening & set(range(first, first + retries + 1)), listening
    finally:
        ray.shutdown()


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


# --------------------------------------------------------------------- eval / exec
def test_no_eval_or_exec_anywhere():
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            bare = isinstance(func, ast.Name) and func.id in ("eval", "exec")
            via_builtins = (
                isinstance(func, ast.Attribute)
                and func.attr in ("eval", "exec")
                and isinstance(func.value, ast.Name)
                and func.value.id in ("builtins", "__builtins__")
            )
            if bare or via_builtins:
                found.append(f"{name}:{node.lineno}")
    assert not found, f"eval/exec calls: {found}"


def test_arithmetic_reward_never_runs_model_output(tmp_path: Path):
    """Responses that are code, or arithmetic that evaluates to the answer, earn 0."""
    marker = tmp_path / "pwned"
    attacks = [
        f"__import__('os').system('touch {marker}')",
        f"__import__('pathlib').Path({str(marker)!r}).write_text('x') or 19",
        "1+18",  # equals the answer only if the text were evaluated
        "0x13",  # 19 in Python's integer syntax
        "19 if True else 0",
    ]
    for attack in attacks:
        assert score(attack, "19") == 0.0, attack
    node = NODE_TYPES.get("reward.arithmetic")
    batch = make_batch(
        {K.RESPONSE_TEXT: [*attacks, "19"], K.ANSWER_TEXT: ["19"] * (len(attacks) + 1)}
    )
    ctx = NodeContext.single_process("reward", ArithmeticRewardConfig(), run_dir=tmp_path)
    rewards = node.fn(ctx, batch)[K.REWARDS].tolist()
    assert rewards == [0.0] * len(attacks) + [1.0]
    assert not marker.exists()
