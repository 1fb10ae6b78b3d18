"""The LIBERO-90 pretrained checkpoints shipped under ``assets/checkpoints/*_pretrain90``.

Issue 51, item 3: each records the commands, commit and checksum that made it (PROVENANCE.md
beside it); a file that does not match its checksum is refused; one-demo SFT on each of the
four evaluation suites can start from it, and a policy of another preset cannot; and it does
what its record says: the L1 policy solves a held-out LIBERO-90 init state greedily.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil

import pytest

from embodied_rl import checkpoint
from embodied_rl.cli import main
from embodied_rl.runtime.config import REPO_ROOT, compose, validate_config
from tests.embodied_rl.synthetic_demos import write_synthetic_demos
from tests.simulators.libero_common import requires_libero

ASSETS = REPO_ROOT / "assets" / "checkpoints"
# policy config -> the shipped run folder
SHIPPED = {
    "openvla_oft_libero": ASSETS / "openvla_oft_libero_pretrain90",
    "openvla_oft_libero_tokens": ASSETS / "openvla_oft_libero_tokens_pretrain90",
    "openvla_libero": ASSETS / "openvla_libero_pretrain90",
}
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


def _step_dir(run):
    (step,) = sorted((run / "checkpoints").iterdir())
    return step


@pytest.mark.parametrize("policy", SHIPPED)
def test_the_shard_is_the_one_its_provenance_and_manifest_name(policy):
    run = SHIPPED[policy]
    recorded = re.findall(r"`([0-9a-f]{64})`", (run / "PROVENANCE.md").read_text())
    shard = _step_dir(run) / checkpoint.shard_name(0)
    actual = hashlib.sha256(shard.read_bytes()).hexdigest()
    manifest = json.loads((_step_dir(run) / checkpoint.MANIFEST).read_text())
    assert recorded == [actual]
    assert manifest["files"] == {shard.name: {"sha256": actual, "size": shard.stat().st_size}}
    assert shard.stat().st_size < 8_000_000  # a few MB: small enough for the repository


def _one_demo_sft(tmp_path, policy: str, suite: str, init_from) -> list[str]:
    """The overrides of scripts/bench/pretrained_starts.py's pretrained SFT command."""
    demos = tmp_path / suite
    if not demos.exists():
        write_synthetic_demos(demos, size=64, suite=suite)
    return [
        f"policy={policy}", f"simulator.options.suite={suite}", f"data.paths=['{demos}']",
        "data.max_demos_per_task=1", f"models.actor.init_from={init_from}",
        "data.statistics=checkpoint",
    ]  # fmt: skip


@pytest.mark.parametrize("suite", SUITES)
def test_one_demo_sft_on_each_evaluation_suite_starts_from_it(tmp_path, suite):
    """Same architecture and observation options (64 px agentview), statistics present."""
    for policy, run in SHIPPED.items():
        validate_config(compose("sft_libero", _one_demo_sft(tmp_path, policy, suite, run)))


def test_a_checkpoint_of_another_preset_is_refused_naming_both_sides(tmp_path):
    overrides = _one_demo_sft(
        tmp_path, "openvla_oft_libero_tokens", "libero_object", SHIPPED["openvla_oft_libero"]
    )
    with pytest.raises(ValueError, match=r"use_continuous_head=True there, False here"):
        validate_config(compose("sft_libero", overrides))
    overrides = _one_demo_sft(
        tmp_path, "openvla_oft_libero", "libero_goal", SHIPPED["openvla_oft_libero"]
    )
    cfg = compose("sft_libero", [*overrides, "simulator.options.image_size=128"])
    with pytest.raises(ValueError, match=r"image_size"):
        validate_config(cfg)


def test_an_edited_shard_is_refused_before_any_worker_starts(tmp_path, capsys):
    copy = tmp_path / "pretrained"
    shutil.copytree(SHIPPED["openvla_oft_libero"], copy)
    shard = _step_dir(copy) / checkpoint.shard_name(0)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    shard.write_bytes(bytes(data))
    overrides = _one_demo_sft(tmp_path, "openvla_oft_libero", "libero_object", copy)
    code = main(["train", "--config-name", "sft_libero", f"run_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err
    assert code == 2 and "sha256" in err and "git checkout -- assets/checkpoints" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.ray
@pytest.mark.libero
@requires_libero
def test_the_l1_policy_solves_a_held_out_libero90_state_it_was_recorded_solving(tmp_path):
    """Greedy, through ``embodied-rl eval`` with the pretraining run's own config, on one
    validation init state (never trained on) of a task its record lists as solved there."""
    run = tmp_path / "pretrained"
    shutil.copytree(SHIPPED["openvla_oft_libero"], run)
    task, init_state = SOLVED_HELD_OUT
    overrides = [f"++eval.tasks=[{task}]", "simulator.num_init_states=5", "eval.batch_size=1"]
    overrides += ["eval.max_videos=1", "rollout.processes=0", "rollout.num_envs=1"]
    assert init_state == 4  # the validation state of init states 0-4 (heldout_every 5)
    argv = ["eval", "--config-name", "pretrain_libero90", "--no-progress", f"run_dir={run}"]
    assert main([*argv, *overrides]) == 0
    (own,) = run.glob("eval_2*")
    (result,) = [json.loads(x) for x in (own / "eval" / "results.jsonl").read_text().splitlines()]
    assert (result["task"], result["episodes"], result["successes"]) == (task, 1, 1)


# (task, validation init state) the shipped L1 run's own evaluation solved; PROVENANCE.md
SOLVED_HELD_OUT = (36, 4)
