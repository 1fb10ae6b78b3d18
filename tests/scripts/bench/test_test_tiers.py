"""scripts/bench/test_tiers.py: a real pytest run's junit report read back as outcomes and
times, and a summary that says FAILED for a run with a failure or with no test."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.scripts.bench.test_world_model_latents import _import_bench

tiers = _import_bench("test_tiers")


def test_a_real_run_is_read_back_test_by_test(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import time
            import pytest

            def test_ok():
                time.sleep(0.2)

            def test_bad():
                assert 1 == 2

            @pytest.mark.skip(reason="not here")
            def test_skipped():
                pass

            class TestGroup:
                def test_in_class(self):
                    pass
            """
        )
    )
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
         "-o", "addopts=", "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    rows = {r.test.rsplit("::", 1)[1]: r for r in tiers.read_junit(junit)}
    assert {name: r.outcome for name, r in rows.items()} == {
        "test_ok": "passed", "test_bad": "failed", "test_skipped": "skipped",
        "test_in_class": "passed",
    }  # fmt: skip
    assert rows["test_ok"].seconds >= 0.2 and rows["test_bad"].seconds < rows["test_ok"].seconds
    assert "TestGroup" in rows["test_in_class"].test

    summary = tiers.summarise(list(rows.values()), run.returncode, wall_s=90.0)
    assert summary["passed"] is False and summary["wall_minutes"] == 1.5
    assert summary["counts"] == {"failed": 1, "passed": 2, "skipped": 1}
    page = tiers.markdown("default", "pytest", summary, list(rows.values()))
    assert page.startswith("# The default test tier: FAILED") and "test_bad` (failed)" in page


def test_a_run_that_collected_nothing_or_exited_badly_never_passes():
    ok = [tiers.TestRow("tests/a.py::test_x", "passed", 1.0)]
    assert tiers.summarise(ok, 0, 60.0)["passed"] is True
    assert tiers.summarise([], 5, 1.0)["passed"] is False  # pytest's "no tests collected"
    assert tiers.summarise(ok, 2, 60.0)["passed"] is False  # interrupted, usage error
    skipped = [tiers.TestRow("tests/a.py::test_x", "skipped", 0.0)]
    assert tiers.summarise(skipped, 0, 1.0)["passed"] is False


def test_summary_files_carry_the_command_and_every_row(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "OUT_DIR", tmp_path)
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.test_configs" name="test_a" '
        'time="61.5"/><testcase classname="tests.test_configs" name="test_b" time="2">'
        '<error message="boom"/></testcase></testsuite></testsuites>'
    )
    tiers.write_summary("slow", ".venv/bin/python -m pytest -m slow", 1, 120.0, junit)
    body = json.loads((tmp_path / "slow_tier.json").read_text())
    assert body["command"] == ".venv/bin/python -m pytest -m slow" and body["passed"] is False
    assert [r["test"] for r in body["tests"]] == [
        "tests/test_configs.py::test_a", "tests/test_configs.py::test_b",
    ]  # fmt: skip
    assert body["tests"][1]["outcome"] == "error" and body["machine"]["date"]
    page = (tmp_path / "slow_tier.md").read_text()
    assert "| tests/test_configs.py | 2     | 1.06    |" in page, page
