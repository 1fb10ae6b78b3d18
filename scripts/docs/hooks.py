"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

- The front pages live at the repository root, outside ``docs/``: README.md becomes the
  site's home page, BENCHMARKS.md and RELIABILITY.md pages of their own (:data:`ROOT_PAGES`).
- Links are written for a reader of the repository: relative to the file they are in. Each one
  is resolved in the repository. A link to a page or file of the site is rewritten relative to
  the page's place in the site (mkdocs then checks it, its anchor included). A link to an
  existing repository file outside the site (source code, a script) becomes that path in code,
  or a link to it under ``repo_url`` when mkdocs.yml sets one. A link to no file at all is a
  warning, which fails ``mkdocs build --strict``.
- A nav entry with a glob (``benchmarks/*.md``) expands to the matching pages, sorted by path;
  a section whose globs match nothing is left out. With ``validation.nav.omitted_files: warn``
  a page that no nav entry names fails the strict build.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# Warnings of a logger under "mkdocs." count for --strict.
log = logging.getLogger("mkdocs.plugins.embodied_rl_docs")

# Repository file -> its page in the site (a path below docs_dir).
ROOT_PAGES = {
    "README.md": "index.md",
    "BENCHMARKS.md": "BENCHMARKS.md",
    "RELIABILITY.md": "RELIABILITY.md",
}
# Where ``repo_url`` shows a file: ``<repo_url>/<SOURCE_URI><path>``; extra.source_uri overrides.
SOURCE_URI = "blob/main/"

# An inline code span, or a Markdown link / image whose text may hold code spans.
_TOKEN = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<link>(?P<bang>!?)\[(?P<text>(?:[^\]`\n]|`[^`\n]*`)*)\]"
    r"\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\))"
)
_FENCE = re.compile(r"^\s*(```|~~~)")
_EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")


def repo_root(config: MkDocsConfig) -> Path:
    """The repository: the folder of mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


# --- nav -----------------------------------------------------------------------------------


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Expand the nav's glob entries against the pages in docs_dir."""
    if config.nav is not None:
        config.nav = expand_nav(config.nav, Path(config.docs_dir))
    return config


def expand_nav(items: list[Any], docs_dir: Path) -> list[Any]:
    """The nav with each glob replaced by its matches; empty sections dropped."""
    expanded: list[Any] = []
    for item in items:
        if isinstance(item, str):
            expanded += _matches(item, docs_dir) if _is_glob(item) else [item]
            continue
        ((title, value),) = item.items()
        if isinstance(value, list):
            children = expand_nav(value, docs_dir)
        elif _is_glob(value):
            children = _matches(value, docs_dir)
        else:
            expanded.append(item)
            continue
        if children:
            expanded.append({title: children})
    return expanded


def _is_glob(entry: str) -> bool:
    return any(c in entry for c in "*?[")


def _matches(pattern: str, docs_dir: Path) -> list[str]:
    return sorted(p.relative_to(docs_dir).as_posix() for p in docs_dir.glob(pattern) if p.is_file())


# --- the root pages --------------------------------------------------------------------------


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the root pages (:data:`ROOT_PAGES`) that exist, read from the repository root."""
    root = repo_root(config)
    for source, uri in ROOT_PAGES.items():
        path = root / source
        if not path.is_file():
            continue
        if files.get_file_from_path(uri) is not None:
            raise ValueError(f"docs/{uri} would hide {source}, whose page it is: rename it")
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# --- links -----------------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Rewrite the page's links (module doc), leaving code blocks and code spans alone."""
    root = repo_root(config)
    source = _repo_path(page.file, root, Path(config.docs_dir))
    context = _LinkContext(root, source, page.file.src_uri, files, config)
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced or _FENCE.match(line) else _TOKEN.sub(context.rewrite, line))
    return "\n".join(lines)


def _repo_path(file: File, root: Path, docs_dir: Path) -> str:
    """The page's file as a repository path (``docs/x.md``, ``README.md``)."""
    path = Path(file.abs_src_path) if file.abs_src_path else docs_dir / file.src_uri
    return path.resolve().relative_to(root).as_posix()


class _LinkContext:
    """What a link of one page is resolved against."""

    def __init__(
        self, root: Path, source: str, page_uri: str, files: Files, config: MkDocsConfig
    ) -> None:
        self.root, self.source, self.page_uri, self.files = root, source, page_uri, files
        self.docs = Path(config.docs_dir).resolve().relative_to(root).as_posix()
        self.repo_url = (config.repo_url or "").rstrip("/")
        self.source_uri = config.extra.get("source_uri", SOURCE_URI)

    def rewrite(self, match: re.Match) -> str:
        """One token of :data:`_TOKEN`: code unchanged, a link resolved (module doc)."""
        if match["code"] or _EXTERNAL.match(match["target"]):
            return match[0]
        path, hash_, anchor = match["target"].partition("#")
        target = posixpath.normpath(posixpath.join(posixpath.dirname(self.source), unquote(path)))
        site_uri = self.site_uri(target)
        if site_uri is not None:
            if self.files.get_file_from_path(site_uri) is None:
                self.warn(match, f"{target} is in no page or file of the site")
                return match[0]
            relative = posixpath.relpath(site_uri, posixpath.dirname(self.page_uri) or ".")
            new_target = relative + hash_ + anchor
            return f"{match['bang']}[{match['text']}]({new_target}{match['title'] or ''})"
        if target.startswith("../") or not (self.root / target).exists():
            self.warn(match, f"{target} does not exist in the repository")
            return match[0]
        return self.outside_site(match, target, hash_ + anchor)

    def site_uri(self, target: str) -> str | None:
        """The site path of a repository path, ``None`` when it lies outside the site."""
        if target in ROOT_PAGES:
            return ROOT_PAGES[target]
        prefix = self.docs + "/"
        return target[len(prefix) :] if target.startswith(prefix) else None

    def outside_site(self, match: re.Match, target: str, anchor: str) -> str:
        """A repository file outside the site: a ``repo_url`` link, else its path in code."""
        text = match["text"]
        if self.repo_url:
            url = f"{self.repo_url}/{self.source_uri}{target}{anchor}"
            return f"[{text}]({url})"
        if text.strip("`") in (target, match["target"], posixpath.basename(target), ""):
            return f"`{target}`"
        return f"{text} (`{target}`)"

    def warn(self, match: re.Match, problem: str) -> None:
        log.warning(f"{self.source}: the link {match[0]!r} is broken: {problem}")
