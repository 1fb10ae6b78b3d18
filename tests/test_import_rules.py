"""Import rules (docs/ARCHITECTURE.md, "Packages and import rules"), packaging, torchvision fix.

- ``embodied_rl`` never imports ``policies``, ``simulators`` or ``rollout`` (they register
  into its registries and are loaded by module name);
- ``policies`` and ``simulators`` never import each other, and ``policies`` never imports
  ``rollout`` (models, video encoders included, know nothing of the rollouts that drive them);
- ``rollout`` imports neither ``simulators`` nor ``policies`` (interfaces only).

Every ``import`` / ``from ... import`` statement counts, wherever it is (function bodies,
``if TYPE_CHECKING:`` blocks); loading by module-name string is the allowed route.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("embodied_rl", "policies", "simulators", "rollout")
FORBIDDEN: dict[str, frozenset[str]] = {
    "embodied_rl": frozenset({"policies", "simulators", "rollout"}),
    "policies": frozenset({"simulators", "rollout"}),
    "simulators": frozenset({"policies"}),
    "rollout": frozenset({"simulators", "policies"}),
}


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    """Dotted module name of ``path`` and whether it is a package ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _imports(tree: ast.AST, module: str, is_package: bool):
    """Yield ``(line, statement text, absolute imported module)`` for every import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, ast.unparse(node), alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                target = node.module or ""
            else:
                package = module.split(".") if is_package else module.split(".")[:-1]
                up = node.level - 1
                if up >= len(package):
                    continue  # beyond the top-level package: fails at import time anyway
                base = package[: len(package) - up]
                target = ".".join(base + ([node.module] if node.module else []))
            yield node.lineno, ast.unparse(node), target


def find_violations(root: Path, packages=PACKAGES, forbidden=FORBIDDEN) -> tuple[list[str], int]:
    """Return the import-rule violations under ``root`` and how many files were checked."""
    violations: list[str] = []
    checked = 0
    for package in packages:
        folder = root / package
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            checked += 1
            rel = path.relative_to(root).as_posix()
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            except SyntaxError as exc:
                violations.append(f"{rel}:{exc.lineno}: cannot parse ({exc.msg})")
                continue
            module, is_package = _module_name(root, path)
            for line, statement, target in _imports(tree, module, is_package):
                top = target.split(".")[0]
                if top in forbidden[package]:
                    violations.append(
                        f"{rel}:{line}: {statement}  ({package} must not import {top})"
                    )
    return violations, checked


def test_packages_respect_import_rules():
    violations, checked = find_violations(ROOT)
    assert checked > 0 and (ROOT / "embodied_rl" / "__init__.py").is_file(), (
        f"no Python files found under {ROOT}; the walk is broken"
    )
    assert not violations, (
        "import rule violations (docs/ARCHITECTURE.md, 'Packages and import rules'):\n"
        + "\n".join(violations)
    )


def test_checker_reports_each_forbidden_import(tmp_path):
    """The checker itself catches every form of forbidden import and nothing allowed."""
    files = {
        "embodied_rl/__init__.py": "import os\nfrom . import registry\n",
        "embodied_rl/registry.py": (
            "import importlib\n"
            "def load():\n"
            "    importlib.import_module('policies')\n"  # allowed: by name
            "    import policies.mlp\n"  # line 4: forbidden, inside a function
        ),
        "embodied_rl/sub/__init__.py": "from .. import registry\nfrom ..registry import load\n",
        "policies/__init__.py": "from embodied_rl.registry import load\n",
        "policies/mlp.py": "import numpy\nfrom simulators.libero import Env\n",  # line 2
        "policies/encoders.py": (
            "from embodied_rl.data.episode_videos import sample_frame_indices\n"
            "def build():\n"
            "    from rollout.env import EnvRolloutConfig\n"  # line 3: forbidden
            "    return EnvRolloutConfig\n"
        ),
        "simulators/__init__.py": "import os, policies as p\n",  # line 1
        "simulators/libero.py": "from .vec import VecEnv\n",
        "rollout/__init__.py": "from embodied_rl import keys\n",
        "rollout/env.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from policies import Policy\n"  # line 3
            "class A:\n"
            "    def f(self):\n"
            "        from simulators import libero as L\n"  # line 6
        ),
    }
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))

    violations, checked = find_violations(tmp_path)

    assert checked == len(files)
    found = {v.split(": ")[0] for v in violations}
    assert found == {
        "embodied_rl/registry.py:4",
        "policies/mlp.py:2",
        "policies/encoders.py:3",
        "simulators/__init__.py:1",
        "rollout/env.py:3",
        "rollout/env.py:6",
    }, violations
    assert any("from simulators import libero as L" in v for v in violations)
    assert any("(policies must not import rollout)" in v for v in violations)


def _setuptools_packages() -> object:
    with open(ROOT / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)
    return data["tool"]["setuptools"]["packages"]


def _walk_packages(root: Path) -> list[str]:
    """Dotted names of regular packages under ``root``, the way setuptools' find walks."""
    found: list[str] = []

    def visit(folder: Path, prefix: str) -> None:
        for child in sorted(folder.iterdir()):
            if not child.is_dir() or child.name.startswith(".") or "." in child.name:
                continue
            if not (child / "__init__.py").is_file():
                continue  # not a package: setuptools does not descend
            name = f"{prefix}{child.name}"
            found.append(name)
            visit(child, name + ".")

    visit(root, "")
    return found


def test_package_discovery_lists_exactly_the_four_packages():
    spec = _setuptools_packages()
    if isinstance(spec, list):
        listed_top = {name.split(".")[0] for name in spec}

        def included(name: str) -> bool:
            return name in spec
    else:
        find = spec["find"]
        assert find.get("where", ["."]) == ["."], f"unexpected find.where: {find.get('where')}"
        include = find.get("include", ["*"])
        exclude = find.get("exclude", [])
        listed_top = {pattern.split(".")[0].rstrip("*") for pattern in include}

        def included(name: str) -> bool:
            return any(fnmatch.fnmatchcase(name, p) for p in include) and not any(
                fnmatch.fnmatchcase(name, p) for p in exclude
            )

    assert listed_top == set(PACKAGES), f"pyproject.toml lists {sorted(listed_top)}"

    packages = _walk_packages(ROOT)
    discovered = [name for name in packages if included(name)]
    # Nothing else ships (tests, configs, scripts, ...) ...
    assert {name.split(".")[0] for name in discovered} <= set(PACKAGES), discovered
    # ... and each of the four that has code is found (the other test catches a folder
    # with modules but no __init__.py, which find would skip silently).
    with_code = {p for p in PACKAGES if any((ROOT / p).rglob("*.py"))}
    assert with_code <= set(discovered), f"not discovered: {sorted(with_code - set(discovered))}"
    # Every subpackage of the four ships (a pattern without '*' would drop them).
    missed = [
        name for name in packages if name.split(".")[0] in PACKAGES and name not in discovered
    ]
    assert not missed, f"subpackages left out of the distribution: {missed}"


def test_every_source_folder_is_a_regular_package():
    """A folder with modules but no __init__.py is silently left out of wheels."""
    missing = []
    for package in PACKAGES:
        for folder, dirs, files in os.walk(ROOT / package):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            if any(f.endswith(".py") for f in files) and "__init__.py" not in files:
                missing.append(Path(folder).relative_to(ROOT).as_posix())
    assert not missing, f"folders with modules but no __init__.py: {missing}"


def test_torchvision_and_timm_import_after_embodied_rl():
    """The registry's CUDA torchvision must import next to CPU torch once embodied_rl is in."""
    code = textwrap.dedent(
        """
        import embodied_rl
        import torchvision
        import timm
        import torch

        assert torch._C._jit_get_schemas_for_operator("torchvision::nms")
        model = timm.create_model("resnet18", pretrained=False, num_classes=3)
        with torch.no_grad():
            out = model.eval()(torch.zeros(1, 3, 32, 32))
        assert tuple(out.shape) == (1, 3), out.shape
        print("ok", torch.__version__, torchvision.__version__, timm.__version__)
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and "ok" in result.stdout, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-4000:]}"
    )


def test_ensure_torchvision_ops_is_idempotent():
    torch = pytest.importorskip("torch")
    from embodied_rl import _compat

    _compat.ensure_torchvision_ops()  # embodied_rl/__init__ ran it already; make sure
    library = _compat._library
    schemas = len(torch._C._jit_get_schemas_for_operator("torchvision::nms"))
    if importlib.util.find_spec("torchvision") is not None:
        assert schemas == 1, "torchvision::nms is not defined after ensure_torchvision_ops()"

    _compat.ensure_torchvision_ops()
    _compat.ensure_torchvision_ops()

    assert _compat._library is library
    assert len(torch._C._jit_get_schemas_for_operator("torchvision::nms")) == schemas


def import_closure(root: Path, start: list[str]) -> set[str]:
    """Every module of the four packages that importing ``start`` may import, found by
    following every import statement (in function bodies too, so it over-approximates), plus
    the outside modules they name (``wandb``, ``torch``, ...).

    ``from a import b`` counts ``a`` and, where it is a module, ``a.b``; a module also
    imports its parent packages.
    """
    files = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            if "__pycache__" not in path.parts:
                name, is_package = _module_name(root, path)
                files[name] = (path, is_package)
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        if module not in files:
            continue
        path, is_package = files[module]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = next(t for _, _, t in _imports(ast.Module([node], []), module, is_package))
                todo += [base] + [
                    f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files
                ]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
    return seen


def test_workers_never_import_the_trackers():
    """Only the driver talks to W&B and MLflow (embodied_rl/trackers/): nothing a DAG worker
    imports (its module, the core's nodes and tasks, the plugin packages) reaches a tracker,
    the driver (``embodied_rl/launch/``) or the tracker packages, not even their
    ``__init__``. (timm, which the policies import, imports the ``wandb`` module when it is
    installed, for its own optional logging; it starts no run.)"""
    start = ["embodied_rl.runtime.worker", "embodied_rl.nodes", "embodied_rl.tasks", *PACKAGES]
    reached = import_closure(ROOT, start)
    assert "embodied_rl.runtime.worker" in reached and "policies.mlp.modeling" in reached
    driver = ("embodied_rl.launch", "embodied_rl.trackers")
    forbidden = {"wandb", "mlflow", "embodied_rl.cli", *driver}
    forbidden |= {m for m in reached if m.startswith(tuple(f"{p}." for p in driver))}
    assert not sorted(forbidden & reached)
