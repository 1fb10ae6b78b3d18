"""The SFT checkpoint the main job starts from: ``assets/checkpoints/openvla_oft_libero_object_task0``.

Issue 24, item 3: a shipped checkpoint records the commands, commit and checksum that made it
(PROVENANCE.md beside it), the main job (``srpo_oft_libero``) starts from it, and it does what
its record says: replays the demonstrated init state to success.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest
import torch

from embodied_rl import checkpoint
from embodied_rl.cli import main
from embodied_rl.runtime.config import REPO_ROOT, compose, validate_config
from embodied_rl.runtime.init_from import load_init_state
from embodied_rl.runtime.models import ModelStore
from tests.simulators.libero_common import requires_libero

SHIPPED = REPO_ROOT / "assets" / "checkpoints" / "openvla_oft_libero_object_task0"
# the same one-demo SFT from the LIBERO-90 pretrained policy (issue 51, item 5)
SHIPPED_PRETRAINED = SHIPPED.with_name(SHIPPED.name + "_pretrain90")


@pytest.mark.parametrize("run", [SHIPPED, SHIPPED_PRETRAINED], ids=["scratch", "pretrained"])
def test_the_shard_is_the_one_its_provenance_and_manifest_name(run):
    step = run / "checkpoints" / "step_000600"
    recorded = re.findall(r"`([0-9a-f]{64})`", (run / "PROVENANCE.md").read_text())
    shard = step / checkpoint.shard_name(0)
    actual = hashlib.sha256(shard.read_bytes()).hexdigest()
    manifest = json.loads((step / checkpoint.MANIFEST).read_text())
    assert recorded == [actual]
    assert manifest["files"] == {shard.name: {"sha256": actual, "size": shard.stat().st_size}}


def test_the_main_job_builds_its_policy_from_it(monkeypatch, tmp_path):
    """From any working directory (init_from is relative to the repository root)."""
    monkeypatch.chdir(tmp_path)
    cfg = compose("srpo_oft_libero", [])
    validate_config(cfg)
    assert cfg.models.actor.options.preset == "tiny_libero"
    policy = ModelStore({"actor": cfg.models.actor}, torch.device("cpu"))["actor"]
    shipped = load_init_state(str(cfg.models.actor.init_from), "actor")
    assert all(torch.equal(v, shipped[k]) for k, v in policy.state_dict().items())
    assert sum(p.numel() for p in policy.parameters()) == 392_346  # as PROVENANCE.md says


@pytest.mark.ray
@pytest.mark.libero
@requires_libero
def test_it_replays_the_demonstrated_init_state_to_success(tmp_path):
    """Greedy, on libero_object task 0 init state 0 (the demo's), through ``embodied-rl eval``
    with the SFT run's own config, on a copy (an eval writes its folder into the run)."""
    run = tmp_path / "shipped"
    shutil.copytree(SHIPPED, run)
    overrides = ["policy=openvla_oft_libero", "simulator.options.suite=libero_object"]
    overrides += ["simulator.options.max_steps=160", "simulator.num_init_states=1"]
    overrides += ["data.heldout_every=9", "data.tasks=[0]", "workers.num_workers=1"]
    overrides += ["eval.split=train", "eval.batch_size=1", "eval.max_videos=1", f"run_dir={run}"]
    assert main(["eval", "--config-name", "sft_libero", "--no-progress", *overrides]) == 0
    (own,) = run.glob("eval_2*")
    (result,) = [json.loads(x) for x in (own / "eval" / "results.jsonl").read_text().splitlines()]
    assert (result["episodes"], result["successes"]) == (1, 1)
    assert [v.name for v in (own / "eval").glob("*/*.mp4")] == ["task0_init0_success_r0.mp4"]
