"""SIGTERM or Ctrl-C to ``embodied-rl train`` while its embedded Ray cluster starts: one line,
exit 143 / 130, and none of Ray's processes left (its dashboard and runtime-env agents, which
ignore SIGTERM, used to stay behind re-parented to init; SIGTERM ended in exit 134 or a silent
15). The signal goes when the raylet is up, the moment the orphans came from."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from tests.embodied_rl.runtime.run_helpers import CLI_SCRIPT, ray_processes, ray_strays


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.ray
@pytest.mark.own_ray_cluster  # the shared cluster, had it stayed up, starts workers of its own
@pytest.mark.skipif(not CLI_SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_ray_starts_ends_every_process(tmp_path, signum, code):
    args = ["train", "--config-name", "grpo_llm", "trainer.total_steps=1", f"run_dir={tmp_path}"]
    before = ray_processes()
    driver = subprocess.Popen([str(CLI_SCRIPT), *args], stderr=subprocess.PIPE, text=True)
    seen: dict[int, psutil.Process] = {}
    started = time.monotonic()
    while not any("raylet" in " ".join(p.cmdline()) for p in seen.values() if p.is_running()):
        assert driver.poll() is None and time.monotonic() - started < 90, "Ray never started"
        seen.update({p.pid: p for p in _tree(driver.pid)})
        time.sleep(0.05)
    driver.send_signal(signum)
    err = driver.communicate(timeout=90)[1]
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert driver.returncode == code, err
    assert len(lines) == 1 and ("SIGTERM" if code == 143 else "Ctrl-C") in lines[0], err
    assert "Traceback" not in err
    _, alive = psutil.wait_procs(list(seen.values()), timeout=15)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [" ".join(p.cmdline())[:80] for p in alive]
    assert not ray_strays(before)  # none re-parented away either
