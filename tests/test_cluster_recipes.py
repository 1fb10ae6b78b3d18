"""The launch recipes for clusters users already have (scripts/cluster/), checked statically.

No Slurm and no Kubernetes here: the batch script must pass ``bash -n`` and the RayJob must
have the fields KubeRay's ray.io/v1 API requires; the ``embodied-rl train`` command each one
runs must compose and validate, and its worker count must match the GPUs the recipe asks for.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import yaml

from embodied_rl.runtime.config import compose, validate_config

RECIPES = Path(__file__).resolve().parents[1] / "scripts" / "cluster"
SLURM = RECIPES / "slurm_ray.sbatch"
RAYJOB = RECIPES / "kuberay_rayjob.yaml"


def _train_overrides(argv: list[str]) -> tuple[str, list[str]]:
    """(config name, overrides) of an ``embodied-rl train`` command line."""
    assert argv[:2] == ["embodied-rl", "train"], argv
    args = [a for a in argv[2:] if a != "--no-progress"]
    name = args[args.index("--config-name") + 1]
    overrides = [a for a in args if "=" in a]
    return name, overrides


def test_slurm_script_is_valid_bash_and_starts_head_workers_and_the_job():
    assert subprocess.run(["bash", "-n", str(SLURM)], capture_output=True).returncode == 0
    text = SLURM.read_text()
    directives = dict(
        re.match(r"#SBATCH --([\w-]+)(?:=(.*))?", line).groups()
        for line in text.splitlines()
        if line.startswith("#SBATCH")
    )
    assert int(directives["nodes"]) >= 2 and directives["ntasks-per-node"] == "1"
    assert "gpus-per-node" in directives
    # The head, then the workers joining it, each as a blocking srun step.
    head = text.index("ray start --head")
    join = text.index('ray start --address="$address"')
    train = text.index("\nembodied-rl train")  # the command, not the usage comment
    assert head < join < train
    assert text.count("--block") == 2
    assert 'ray.address="$address"' in text[train:]
    assert "workers.num_workers=$((num_nodes * gpus_per_node))" in text[train:]
    # Preemption: SIGTERM to the script 120 s before the end, and the job may be requeued.
    assert directives["signal"] == "B:TERM@120" and "requeue" in directives


def _train_command(text: str) -> str:
    """The script's ``embodied-rl train`` command, its continuation lines joined."""
    start = text.index("\nembodied-rl train")  # the command, not the usage comment
    return text[start : text.index(" &\n", start)].replace("\\\n", " ")


def test_slurm_job_command_validates_for_a_two_node_allocation():
    """The script's last command, as bash expands it for 2 nodes x 8 GPUs and the usage line."""
    expanded = (
        _train_command(SLURM.read_text())
        .replace('"$@"', "--config-name grpo_llm trainer.total_steps=200")
        .replace('"$address"', "10.0.0.1:6379")
        .replace("$((num_nodes * gpus_per_node))", str(2 * 8))
        .replace('"$run_dir"', "/shared/outputs/slurm-42")
        .replace('"$attempt"', "resume=true")
    )
    name, overrides = _train_overrides(shlex.split(expanded))
    assert "$" not in " ".join(overrides), overrides  # every variable was expanded above
    cfg = compose(name, overrides)
    dag = validate_config(cfg)
    assert dag.num_workers == 16
    assert cfg.resume is True and cfg.run_dir == "/shared/outputs/slurm-42"


# The part of the script after the Ray cluster is up, run by bash with the commands it calls
# (the driver and Slurm's scontrol) replaced by functions that record what they were given.
# The driver stand-in behaves as the real one does on SIGTERM: it finishes, then exits 143.
_STANDINS = """
set -euo pipefail
embodied-rl() {
    echo "$*" >> "$LOG"
    sleep 60 &
    local work=$!
    trap 'echo driver-got-TERM >> "$LOG"; kill "$work"; sleep 1; exit 143' TERM
    echo started >> "$LOG"
    wait "$work"
}
scontrol() { echo "scontrol $*" >> "$LOG"; }
"""


def _run_job_tail(tmp_path: Path, checkpoints: list[str], restarts: int = 0) -> tuple[int, str]:
    """Run the script's job part in bash; send it SIGTERM once the driver started."""
    text = SLURM.read_text()
    tail = text[text.index("\n# One run folder per job") :]
    run_dir = tmp_path / "run"
    for name in checkpoints:
        (run_dir / "checkpoints" / name).mkdir(parents=True)
    log = tmp_path / "log"
    env = {
        "PATH": os.environ["PATH"],
        "LOG": str(log),
        "SLURM_JOB_ID": "42",
        "SLURM_RESTART_COUNT": str(restarts),
        "EMBODIED_RL_RUN_DIR": str(run_dir),
    }
    script = _STANDINS + "address=10.0.0.1:6379 num_nodes=2 gpus_per_node=8\n" + tail
    job = subprocess.Popen(["bash", "-c", script, "sbatch"], env=env)
    deadline = time.monotonic() + 30
    while not (log.exists() and "started" in log.read_text()):
        assert time.monotonic() < deadline and job.poll() is None
        time.sleep(0.05)
    time.sleep(0.2)  # the script has recorded the driver's pid (the line after its start)
    job.send_signal(signal.SIGTERM)  # as Slurm signals the batch script (B:)
    return job.wait(timeout=30), log.read_text()


def test_slurm_job_passes_sigterm_to_the_driver_and_requeues_on_143(tmp_path):
    code, log = _run_job_tail(tmp_path, [])
    assert code == 143, log
    lines = log.splitlines()
    assert f"run_dir={tmp_path / 'run'} resume=false" in lines[0]  # no checkpoint yet
    assert "driver-got-TERM" in lines
    assert lines[-1] == "scontrol requeue 42"  # after the driver ended, not before


def test_requeued_slurm_job_resumes_its_run_folder(tmp_path):
    code, log = _run_job_tail(tmp_path, ["step_000010"])
    assert code == 143
    assert f"run_dir={tmp_path / 'run'} resume=true" in log.splitlines()[0]


def test_requeued_slurm_job_without_a_checkpoint_starts_its_own_run_again(tmp_path):
    code, log = _run_job_tail(tmp_path, [], restarts=1)
    assert code == 143
    assert f"run_dir={tmp_path / 'run'} overwrite=true" in log.splitlines()[0]


def test_rayjob_has_the_fields_kuberay_requires():
    job = yaml.safe_load(RAYJOB.read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"])  # DNS-1123
    spec = job["spec"]
    assert isinstance(spec["entrypoint"], str) and spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        containers = group["template"]["spec"]["containers"]
        assert containers and all(c["name"] and c["image"] for c in containers)
        # rayStartParams values are strings in the CRD (map[string]string).
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        mounts = {m["name"] for c in containers for m in c.get("volumeMounts", [])}
        volumes = {v["name"] for v in group["template"]["spec"].get("volumes", [])}
        assert mounts <= volumes, f"mounted volumes not declared: {mounts - volumes}"
    for workers in cluster["workerGroupSpecs"]:
        assert workers["groupName"]
        assert workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"]
        limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == workers["rayStartParams"]["num-gpus"]
        mounts = workers["template"]["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts  # the databuffer's shm


def test_rayjob_entrypoint_validates_and_uses_every_worker_gpu():
    job = yaml.safe_load(RAYJOB.read_text())
    name, overrides = _train_overrides(shlex.split(job["spec"]["entrypoint"]))
    assert "ray.address=auto" in overrides and "device=cuda" in overrides
    dag = validate_config(compose(name, overrides))
    groups = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    gpus = sum(g["replicas"] * int(g["rayStartParams"]["num-gpus"]) for g in groups)
    assert dag.num_workers == gpus
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    assert head["num-gpus"] == "0"  # the head runs the driver only
