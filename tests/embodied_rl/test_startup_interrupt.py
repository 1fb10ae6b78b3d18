"""Ctrl-C or SIGTERM to ``embodied-rl`` while it imports, and Ctrl-C while it validates: one
``error:`` line and the shell's exit status, no traceback (a Ctrl-C during the imports printed
55 lines of one).

The console script runs in a subprocess (its ``sys.argv[0]`` is what enables the start-up
handler); the signal goes at several moments, so whichever phase it lands in, the answer is
the same line.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.embodied_rl.runtime.run_helpers import CLI_SCRIPT


@pytest.mark.skipif(not CLI_SCRIPT.exists(), reason="the console script is not installed")
@pytest.mark.parametrize(
    "signum, delay_s, code",
    [
        (signal.SIGINT, 0.3, 130),  # importing torch
        (signal.SIGTERM, 0.3, 143),
        (signal.SIGINT, 1.0, 130),  # later in the imports (the plugins, the parser)
    ],
)
def test_an_interrupt_while_starting_is_one_line(signum, delay_s, code):
    process = subprocess.Popen(
        [str(CLI_SCRIPT), "validate", "--config-name", "grpo_llm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)
    if process.poll() is not None:
        pytest.fail(f"validate ended before the signal: {process.communicate()}")
    process.send_signal(signum)
    out, err = process.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == code, err
    assert len(lines) == 1 and lines[0].startswith(
        ("error: interrupted", "error: stopped by SIGTERM")
    ), err
    assert "Traceback" not in err and "OK:" not in out
