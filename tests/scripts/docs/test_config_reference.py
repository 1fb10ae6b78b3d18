"""scripts/docs/config_reference.py: the committed docs/reference/configuration.md is what the
code gives; field descriptions come from the code's own conventions and nothing else."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from embodied_rl.checks import options_dataclass
from embodied_rl.runtime.config_sections import TrainerConfig

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "docs" / "config_reference.py"


def _load_script():
    """The script as a module (registered first: its dataclass looks its module up)."""
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ref = _load_script()


@pytest.fixture(scope="module")
def page() -> str:
    return ref.render()


def test_committed_reference_equals_a_fresh_generation():
    """In a fresh interpreter: in the test process, other tests' modules have registered
    components of their own (a test node type, a test policy), which the page would list."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{ref.OUTPUT} is stale: run {ref.COMMAND}\n{result.stderr}"


def test_trainer_total_steps_is_listed_with_its_real_default(page):
    trainer = page.split("### `trainer`\n", 1)[1].split("\n### ", 1)[0]
    default = TrainerConfig().total_steps
    assert f"| `total_steps` | an int | `{default}` |" in trainer
    # Every registry's components have a heading of their own.
    for name in ("`actor.train`", "`advantage.grpo`", "`mlp`", "`causal_lm`", "`reach`"):
        assert f"\n### {name}\n" in page
    assert "| `lr` | a number | `0.0001` |" in page  # models.<name>.optimizer, nested


def test_check_mode_exits_1_naming_the_command_when_the_page_differs(tmp_path, page, capsys):
    out = tmp_path / "configuration.md"
    assert ref.main(["--check", "--output", str(out)]) == 1  # missing
    assert ref.COMMAND in capsys.readouterr().err
    out.write_text(page.replace("`10`", "`11`", 1), encoding="utf-8")
    assert ref.main(["--check", "--output", str(out)]) == 1
    assert f"regenerate it with: {ref.COMMAND}" in capsys.readouterr().err
    assert ref.main(["--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == page
    assert ref.main(["--check", "--output", str(out)]) == 0


def test_the_script_loads_no_model_library_and_its_check_passes_on_the_repository():
    probe = textwrap.dedent(
        f"""
        import json, runpy, sys
        sys.argv = ["config_reference.py", "--check"]
        try:
            runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
        except SystemExit as stop:
            code = stop.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "timm"))
        print(json.dumps({{"code": code, "heavy": heavy}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "heavy": []}, result.stderr[-3000:]


# --- the description parsers on classes whose answer is known ------------------------------


@dataclass
class _Base:
    """Options of a base.

    ``gamma``: from a paragraph of the base.

    Attributes:
        alpha / beta: one entry for two fields,
            continued on a second line.
        delta: documented here and by a comment: the docstring wins.
    """

    alpha: int = 1
    beta: str | None = None
    gamma: float = 0.5
    delta: bool = True  # loses to the docstring


@dataclass
class _Child(_Base):
    """Options of a child.

    ``epsilon`` ends a paragraph that names it first, kept whole.

    Attributes:
        alpha: the child's own words win over the base's.
    """

    epsilon: list[int] = field(default_factory=lambda: [1, 2])
    # a comment above,
    # over two lines
    zeta: str = "a|b"
    eta: int = 0


def test_field_docs_follow_the_code_conventions_subclass_first():
    docs = ref.field_docs(_Child)
    assert docs == {
        "alpha": "the child's own words win over the base's.",
        "beta": "one entry for two fields, continued on a second line.",
        "gamma": "from a paragraph of the base.",
        "delta": "documented here and by a comment: the docstring wins.",
        "epsilon": "``epsilon`` ends a paragraph that names it first, kept whole.",
        "zeta": "a comment above, over two lines",
        "eta": "",
    }
    assert ref.field_comments(_Base) == {"delta": "loses to the docstring"}


def test_option_rows_render_types_defaults_and_escape_table_cells():
    rows, nested = ref.option_rows(_Child, "x")
    assert nested == []
    assert rows[2] == "| `alpha` | an int | `1` | the child's own words win over the base's. |"
    assert rows[3].startswith("| `beta` | a string or null | `null` |")
    assert rows[6].startswith("| `epsilon` | a list of int | `[1, 2]` |")
    assert (
        rows[7] == "| `zeta` | a string | <code>a&#124;b</code> | a comment above, over two lines |"
    )
    assert rows[8] == "| `eta` | an int | `0` |  |"


def test_to_markdown_converts_rest_and_escapes_outside_code():
    text = "see :class:`~a.b.Cls` and :mod:`a.b`, ``x | y``, a | b * c <name>"
    expected = r"see `Cls` and `a.b`, <code>x &#124; y</code>, a \| b \* c &lt;name>"
    assert ref.to_markdown(text) == expected
    assert ref.yaml_value("\n") == '"\\n"'
    assert ref.yaml_value((0.9, None, True)) == "[0.9, null, true]"


@dataclass
class _Options:
    size: int = 1

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> _Options:
        return cls(**options)


def _from_options_builder(options, device):
    return _Options.from_options(options)


def _options_dataclass_builder(options, device):
    return options_dataclass(_Options, options, "test")


def _builder_without_options(options, device):
    return dict(options)


def test_options_class_is_the_one_the_builder_parses_with():
    assert ref.options_class(_from_options_builder) is _Options
    assert ref.options_class(_options_dataclass_builder) is _Options
    with pytest.raises(LookupError, match="_builder_without_options"):
        ref.options_class(_builder_without_options)
