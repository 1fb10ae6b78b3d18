"""Size and layering rules of the library (docs/ARCHITECTURE.md, "Packages and import rules").

- no library module is longer than ``MAX_MODULE_LINES`` lines;
- no import cycle among library modules: the module graph, built from every ``import``
  statement (function bodies and ``TYPE_CHECKING`` blocks included, as in
  ``test_import_rules.py``), has no strongly connected component of two or more modules;
- no cycle among the subpackages of ``embodied_rl`` either (``runtime`` and ``trackers``
  importing each other is a cycle even when no two modules do);
- every path that docs/ARCHITECTURE.md names in inline code exists (``path::name`` also needs
  ``name`` to be defined there), and every library package is described there.

Each checker is a pure function of a folder, tested on a small tree it must judge exactly.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.test_import_rules import PACKAGES, _imports, _module_name

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"


def library_modules(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the library packages under ``root``."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                modules[_module_name(root, path)[0]] = path
    return modules


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """``path: N lines`` for every library module over ``limit`` lines."""
    found = []
    for path in library_modules(root).values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root).as_posix()}: {lines} lines")
    return found


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the library modules it imports.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``;
    a name that is no library module is resolved to its nearest library ancestor (``import
    a.b.x`` where ``x`` is a class or a third-party module below ``a.b``). The implicit import
    of a package's ``__init__`` by its submodules is no edge: otherwise every package whose
    ``__init__`` re-exports a submodule would be a cycle.
    """
    modules = library_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for target in _import_targets(tree, name, is_package, modules):
            if target != name:
                graph[name].add(target)
    return graph


def _import_targets(
    tree: ast.AST, module: str, is_package: bool, modules: Mapping[str, Path]
) -> Iterable[str]:
    """The library modules ``tree``'s imports reach (``test_import_rules._imports`` resolves
    relative imports; here ``from m import n`` also tries the submodule ``m.n``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom | ast.Import):
            continue
        single = ast.Module(body=[node], type_ignores=[])
        for _, _, target in _imports(single, module, is_package):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [""]
            for name in names:
                resolved = _nearest_module(f"{target}.{name}" if name else target, modules)
                if resolved is not None:
                    yield resolved


def _nearest_module(name: str, modules: Mapping[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def subpackage_graph(root: Path, graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The module graph folded onto ``embodied_rl``'s subpackages (``embodied_rl.runtime``);
    the core's top-level modules stay nodes of their own, other packages are left out."""

    def unit(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != "embodied_rl":
            return None
        if len(parts) > 2 or (root / "embodied_rl" / parts[-1]).is_dir():
            return ".".join(parts[:2])
        return module

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = unit(module)
        if source is None:
            continue
        folded.setdefault(source, set())
        for target in targets:
            dest = unit(target)
            if dest is not None and dest != source:
                folded[source].add(dest)
    return folded


# Inline code spans outside fenced blocks that name a repository path: anything below a
# top-level folder of the repository (``embodied_rl/runtime/``), or a bare file name with a
# source suffix (``planner.py``: which one? a path must say), optionally followed by
# ``::name`` (a function, class or ``Class.method`` defined there). Metric prefixes such as
# ``eval/`` or metric names such as ``rollout/success_rate``, and run-folder files written as ``<run_dir>/config.yaml`` are no repository paths.
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_TOP = "embodied_rl|policies|simulators|rollout|configs|scripts|tests|docs|assets"
_PATH = re.compile(
    rf"^(({_TOP})/([\w./-]*/|[\w./-]*\.\w+)?|[\w.-]+\.(py|yaml|md|toml|sh))(::[\w.]+)?$"
)


def named_paths(text: str) -> list[str]:
    """The inline-code paths of a Markdown text, in order (fenced blocks left out)."""
    prose = _FENCE.sub("", text)
    return [span for span in _CODE_SPAN.findall(prose) if _PATH.match(span)]


def missing_paths(root: Path, text: str) -> list[str]:
    """The named paths that do not exist under ``root`` (or whose ``::name`` is undefined)."""
    missing = []
    for span in named_paths(text):
        path, _, name = span.partition("::")
        file = root / path
        if not file.exists():
            missing.append(f"{span}: no such path")
        elif name and not _defines(file, name):
            missing.append(f"{span}: {path} defines no {name}")
    return missing


def _defines(file: Path, dotted: str) -> bool:
    """Whether ``file`` defines ``dotted`` (``f``, ``Class`` or ``Class.method``) at top level."""
    body: list[ast.stmt] = ast.parse(file.read_text(encoding="utf-8")).body
    for part in dotted.split("."):
        match = next((node for node in body if part in _defined_names(node)), None)
        if match is None:
            return False
        body = getattr(match, "body", [])
    return True


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def undescribed_packages(root: Path, text: str) -> list[str]:
    """Library packages (folders with ``__init__.py``) that the text names nowhere as
    ``<path>/`` in inline code."""
    named = {span.partition("::")[0] for span in named_paths(text)}
    packages = sorted(
        init.parent.relative_to(root).as_posix() + "/"
        for package in PACKAGES
        for init in (root / package).rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    return [p for p in packages if p not in named]


# --- the rules on the repository ---------------------------------------------------------


def test_no_library_module_is_longer_than_the_limit():
    assert len(library_modules(ROOT)) > 100, "the module walk found too few files: broken"
    assert not long_modules(ROOT), (
        f"modules over {MAX_MODULE_LINES} lines (split them by concept; docs/ARCHITECTURE.md):\n"
        + "\n".join(long_modules(ROOT))
    )


def test_no_import_cycle_among_library_modules():
    graph = module_graph(ROOT)
    assert sum(len(t) for t in graph.values()) > 200, "too few import edges: the walk is broken"
    found = cycles(graph)
    assert not found, "import cycles among library modules:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_import_cycle_among_the_core_subpackages():
    folded = subpackage_graph(ROOT, module_graph(ROOT))
    assert {"embodied_rl.runtime", "embodied_rl.dag", "embodied_rl.data"} <= set(folded)
    found = cycles(folded)
    assert not found, (
        "subpackages of embodied_rl that import each other (place the importer above):\n"
        + "\n".join(" <-> ".join(c) for c in found)
    )


def test_architecture_names_only_paths_that_exist():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert len(named_paths(text)) > 50, "docs/ARCHITECTURE.md names too few paths: parser broken"
    missing = missing_paths(ROOT, text)
    assert not missing, "docs/ARCHITECTURE.md names paths that do not exist:\n" + "\n".join(missing)


def test_architecture_describes_every_library_package():
    missing = undescribed_packages(ROOT, ARCHITECTURE.read_text(encoding="utf-8"))
    assert not missing, (
        "library packages docs/ARCHITECTURE.md does not describe (name them as `path/`):\n"
        + "\n".join(missing)
    )


# --- the checkers on trees whose answer is known ------------------------------------------


def _tree(root: Path, files: Mapping[str, str]) -> Path:
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return root


def test_cycle_checker_finds_each_cycle_and_nothing_else(tmp_path):
    root = _tree(
        tmp_path,
        {
            "embodied_rl/__init__.py": "from embodied_rl import a\n",  # re-export: no cycle
            "embodied_rl/a.py": "import os\nfrom embodied_rl.b import f\n",
            "embodied_rl/b.py": "def f():\n    from . import a\n",  # a <-> b, inside a function
            "embodied_rl/c.py": "from embodied_rl.a import Thing\n",  # a name, not a module
            "embodied_rl/run/__init__.py": "",
            "embodied_rl/run/x.py": "from embodied_rl.log.y import g\n",
            "embodied_rl/log/__init__.py": "",
            "embodied_rl/log/y.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from embodied_rl.run import z\n",
            "embodied_rl/run/z.py": "import numpy\n",
            "policies/__init__.py": "from policies import p\n",
            "policies/p.py": "import policies.q.Model\n",  # resolves to policies.q
            "policies/q.py": "from .p import x\n",  # p <-> q
        },
    )
    graph = module_graph(root)
    assert graph["embodied_rl.c"] == {"embodied_rl.a"}
    assert graph["policies.p"] == {"policies.q"}
    assert cycles(graph) == [["embodied_rl.a", "embodied_rl.b"], ["policies.p", "policies.q"]]
    # run.x -> log.y -> run.z: no module cycle, but run and log import each other (the
    # core's top-level modules stay themselves: a <-> b is still there).
    folded = subpackage_graph(root, graph)
    assert cycles(folded) == [
        ["embodied_rl.a", "embodied_rl.b"],
        ["embodied_rl.log", "embodied_rl.run"],
    ]
    assert "policies.p" not in folded


def test_size_checker_reports_modules_over_the_limit(tmp_path):
    root = _tree(tmp_path, {"rollout/__init__.py": "", "rollout/big.py": "x = 1\n" * 6})
    assert long_modules(root, limit=5) == ["rollout/big.py: 6 lines"]
    assert long_modules(root, limit=6) == []


def test_architecture_checkers_judge_paths_and_names(tmp_path):
    root = _tree(
        tmp_path,
        {
            "embodied_rl/__init__.py": "",
            "embodied_rl/core.py": "class A:\n    def run(self): ...\nLIMIT = 3\n",
            "embodied_rl/sub/__init__.py": "",
            "rollout/__init__.py": "",
        },
    )
    text = textwrap.dedent(
        """
        `embodied_rl/` holds `embodied_rl/core.py::A.run` and `embodied_rl/core.py::LIMIT`;
        `embodied_rl/core.py::A.stop` and `embodied_rl/gone.py` do not exist, nor does a bare
        `gone.py`; `a + b`, `ray.init`, `eval/`, `rollout/success_rate` and `<run_dir>/config.yaml` are no
        paths.

        ```
        embodied_rl/fenced.py  (fenced blocks are pictures, not checked)
        ```
        """
    )
    assert named_paths(text) == [
        "embodied_rl/",
        "embodied_rl/core.py::A.run",
        "embodied_rl/core.py::LIMIT",
        "embodied_rl/core.py::A.stop",
        "embodied_rl/gone.py",
        "gone.py",
    ]
    assert missing_paths(root, text) == [
        "embodied_rl/core.py::A.stop: embodied_rl/core.py defines no A.stop",
        "embodied_rl/gone.py: no such path",
        "gone.py: no such path",
    ]
    assert undescribed_packages(root, text) == ["embodied_rl/sub/", "rollout/"]
