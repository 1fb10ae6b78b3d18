"""scripts/docs/hooks.py in a real ``mkdocs build --strict`` of small repositories: the root
pages join the site, links are resolved in the repository, and a broken link or a page the nav
leaves out still fails the build."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HOOKS = ROOT / "scripts" / "docs" / "hooks.py"

pytest.importorskip("material", reason="the dev extra's mkdocs-material builds the site")


def _load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", HOOKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()

# The repository's settings that the hook relies on (mkdocs.yml), on a small nav.
CONFIG = f"""
site_name: test
docs_dir: docs
theme:
  name: material
  font: false
hooks:
  - {HOOKS}
markdown_extensions:
  - toc:
      slugify: !!python/object/apply:pymdownx.slugs.slugify {{kwds: {{case: lower}}}}
validation:
  nav: {{omitted_files: warn, not_found: warn, absolute_links: warn}}
  links: {{not_found: warn, anchors: warn, absolute_links: warn, unrecognized_links: warn}}
nav:
  - Home: index.md
  - Guides: guides/*.md
  - Empty: empty/*.md
"""

GOOD = {
    "README.md": """
        # Home

        See [the first guide](docs/guides/a.md#a-part), [`src/mod.py`](src/mod.py),
        [the module](src/mod.py#L3) and `[not a link](nowhere.md)` in code.

        ```
        [fenced](nowhere.md)
        ```
        """,
    "src/mod.py": "x = 1\n",
    "docs/guides/a.md": "# A\n\n## A part\n\nBack [home](../../README.md), [code](../../src/mod.py).\n",
    "docs/guides/b.md": "# B\n\n[A's part](a.md#a-part)\n",
}


def _repo(root: Path, files: Mapping[str, str], config: str = CONFIG) -> Path:
    for rel, text in {"mkdocs.yml": config, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def _build(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml")]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_a_clean_tree_builds_with_root_pages_and_rewritten_links(tmp_path):
    root = _repo(tmp_path, GOOD)
    result = _build(root)
    assert result.returncode == 0, result.stderr
    home = (root / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="guides/a/#a-part"' in home  # docs/guides/a.md -> the page's place in the site
    assert "See the first guide" not in home  # the link kept its text and stayed a link
    assert "<code>src/mod.py</code>" in home and 'href="src/mod.py' not in home
    assert "the module (<code>src/mod.py</code>)" in home
    assert "[not a link](nowhere.md)" in home and "[fenced](nowhere.md)" in home
    guide = (root / "site" / "guides" / "a" / "index.html").read_text(encoding="utf-8")
    assert 'href="../.."' in guide and "<code>src/mod.py</code>" in guide
    assert not (root / "site" / "empty").exists()


@pytest.mark.parametrize(
    ("page", "link", "named"),
    [
        ("docs/guides/b.md", "[gone](missing.md)", "docs/guides/missing.md"),
        ("README.md", "[gone](docs/guides/missing.md)", "docs/guides/missing.md"),
        ("README.md", "[gone](src/gone.py)", "src/gone.py does not exist"),
        ("docs/guides/b.md", "[gone](a.md#no-such-part)", "no-such-part"),
    ],
)
def test_one_broken_link_fails_the_strict_build(tmp_path, page, link, named):
    files = dict(GOOD)
    files[page] = textwrap.dedent(files[page]) + f"\n{link}\n"
    result = _build(_repo(tmp_path, files))
    assert result.returncode != 0
    assert named in result.stderr


def test_a_page_left_out_of_the_nav_fails_the_strict_build(tmp_path):
    result = _build(_repo(tmp_path, {**GOOD, "docs/orphan.md": "# Orphan\n"}))
    assert result.returncode != 0
    assert "orphan.md" in result.stderr


def test_with_repo_url_outside_files_link_to_the_repository(tmp_path):
    config = CONFIG + "repo_url: https://example.invalid/org/repo\n"
    root = _repo(tmp_path, GOOD, config)
    result = _build(root)
    assert result.returncode == 0, result.stderr
    home = (root / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="https://example.invalid/org/repo/blob/main/src/mod.py#L3"' in home


def test_nav_globs_expand_sorted_and_empty_sections_are_dropped(tmp_path):
    for rel in ("b/z.md", "b/a.md", "b/deep/c.md", "b/skip.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("# x\n")
    nav = ["index.md", {"B": "b/*.md"}, {"All": ["x.md", "b/**/*.md"]}, {"None": "c/*.md"}]
    assert hooks.expand_nav(nav, tmp_path) == [
        "index.md",
        {"B": ["b/a.md", "b/z.md"]},
        {"All": ["x.md", "b/a.md", "b/deep/c.md", "b/z.md"]},
    ]
