"""Importing ``policies`` registers every component without the heavy model libraries.

Every DAG worker process and every ``embodied-rl`` CLI call imports the plugin packages;
transformers (about 5 s), timm (about 1 s, and wandb through it) load only when a policy
that needs them is built. The check runs in a fresh interpreter: this test process has
imported them long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "timm", "wandb")

# Registered today; a new component may add names, none of these may go missing.
POLICY_NAMES = {
    "causal_lm",
    "causal_lm_critic",
    "flow_vla",
    "mlp",
    "openvla",
    "openvla_oft",
    "world_model.vjepa2",
}
ENCODER_NAMES = {"video_encoder.cheap", "video_encoder.vjepa2"}
EXPORTER_NAMES = {
    "causal_lm",
    "causal_lm_critic",
    "mlp",
    "openvla",
    "openvla_oft",
    "world_model.vjepa2",
}

# After ``import policies``: which heavy modules are loaded and what the registries hold; then
# the same registries once every module of the package is imported (the lazily imported ones
# included, which must register nothing of their own).
PROBE = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys

    import policies
    from embodied_rl.registry import EXPORTERS, POLICIES, VIDEO_ENCODERS

    def names():
        return {r: sorted(reg.names()) for r, reg in
                [("policies", POLICIES), ("encoders", VIDEO_ENCODERS), ("exporters", EXPORTERS)]}

    heavy = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[1:])
    light = names()
    for info in pkgutil.walk_packages(policies.__path__, "policies."):
        importlib.import_module(info.name)
    print(json.dumps({"heavy": heavy, "light": light, "full": names()}))
    """
)


def _probe() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *HEAVY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_policies_loads_no_heavy_library_and_registers_everything():
    report = _probe()

    assert report["heavy"] == [], f"import policies loaded {report['heavy'][:10]}"
    # Nothing registers only when a deferred module is imported.
    assert report["light"] == report["full"]
    assert POLICY_NAMES <= set(report["light"]["policies"])
    assert ENCODER_NAMES <= set(report["light"]["encoders"])
    assert EXPORTER_NAMES <= set(report["light"]["exporters"])
