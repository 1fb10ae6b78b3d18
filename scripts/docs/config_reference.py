"""Write docs/reference/configuration.md: every option of a run config, read from the code.

    .venv/bin/python scripts/docs/config_reference.py          # write the page
    .venv/bin/python scripts/docs/config_reference.py --check  # exit 1 when the page is stale

The options are the config dataclasses: the sections of a run config
(``embodied_rl/runtime/config_sections.py``), a ``models`` entry
(``embodied_rl/runtime/models.py``), and the options of every registered node type, policy,
video encoder and simulator, found through the registries (``embodied_rl/registry.py``) once
``load_all_plugins`` has imported the packages that fill them (no model library is loaded).

A field's description is the one its class already gives, in this order: its entry under
``Attributes:`` in the class docstring (``a / b: ...`` describes both), a docstring paragraph
that starts with ````name``:``, or the comment on the field's line or on the lines just above
it. A subclass's docstring is searched before its bases'. A field with none of these is shown
with an empty description: the generator never writes one of its own.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import html
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the packages are beside scripts/
    sys.path.insert(0, str(ROOT))

# The packages are imported below the path fix (E402); _describe: the validator's words.
from embodied_rl.dag.node_type import _describe  # noqa: E402
from embodied_rl.registry import NODE_TYPES, POLICIES, SIMULATORS, VIDEO_ENCODERS  # noqa: E402
from embodied_rl.runtime.config import load_all_plugins  # noqa: E402
from embodied_rl.runtime.config_sections import SECTIONS, RunOptions  # noqa: E402
from embodied_rl.runtime.models import ModelSpec  # noqa: E402

OUTPUT = ROOT / "docs" / "reference" / "configuration.md"
COMMAND = ".venv/bin/python scripts/docs/config_reference.py"
HEADER = f"""# Configuration reference

Every option of a run config, generated from the config dataclasses by
`scripts/docs/config_reference.py`; do not edit it by hand: after changing an option, run
`{COMMAND}` (CI checks that this page is current). A type reads as in the
validator's messages; *required* options have no default. Defaults are YAML values.
"""


@dataclasses.dataclass(frozen=True)
class Block:
    """One table of the page: a config dataclass and where its options go in a run config.

    Attributes:
        title: the heading (a section name, a registered component's name).
        key: the YAML path of the options (``trainer``, ``models.<name>.options``).
        cls: the dataclass; ``None`` for a component that takes no options.
        summary: what the component is, in a sentence from its own docstring.
        code: where it is implemented, as ``path::name``.
    """

    title: str
    key: str
    cls: type | None
    summary: str = ""
    code: str = ""


# --- what the page lists ------------------------------------------------------------------


def chapters() -> list[tuple[str, str, list[Block]]]:
    """``(heading, intro, blocks)`` for each chapter of the page, registries read by name."""
    load_all_plugins({})  # the node types, policies and simulators register themselves
    run = [_class_block("top level", "", RunOptions)]
    run += [_class_block(f"`{name}`", name, cls) for name, cls in SECTIONS.items()]
    nodes = [_node_block(name, NODE_TYPES.get(name)) for name in NODE_TYPES.names()]
    models = [_builder_block(name, POLICIES.get(name)) for name in POLICIES.names()]
    encoders = [_builder_block(name, VIDEO_ENCODERS.get(name)) for name in VIDEO_ENCODERS.names()]
    sims = [_simulator_block(name, SIMULATORS.get(name)) for name in SIMULATORS.names()]
    return [
        ("Run config", "The top-level keys and sections of a run config.", run),
        (
            "Models",
            "An entry `models.<name>` of a run config: a policy or video encoder to build.",
            [_class_block("`models.<name>`", "models.<name>", ModelSpec)],
        ),
        ("Node types", "The `config:` block of a DAG node, by its `type:`.", nodes),
        ("Policies", "`models.<name>.options` of a model whose `policy:` is a policy.", models),
        (
            "Video encoders",
            "`models.<name>.options` of a model whose `policy:` is a video encoder.",
            encoders,
        ),
        ("Simulators", "`simulator_options` of `rollout.env`, by its `simulator:`.", sims),
    ]


def _class_block(title: str, key: str, cls: type) -> Block:
    return Block(title, key, cls, _summary(cls), _where(cls))


def _node_block(name: str, node: Any) -> Block:
    """A node type: what its function does, and its ``config_cls`` (``None``: no options)."""
    return Block(f"`{name}`", "config", node.config_cls, _summary(node.fn), _where(node.fn))


def _builder_block(name: str, builder: Callable[..., Any]) -> Block:
    """A policy or video encoder: the options dataclass its registered builder parses."""
    cls = options_class(builder)
    return Block(f"`{name}`", "models.<name>.options", cls, _summary(cls), _where(cls))


def _simulator_block(name: str, simulator: Any) -> Block:
    cls = simulator.config_cls
    where = _where(cls) if cls is not None else _where(simulator.build)
    return Block(f"`{name}`", "simulator_options", cls, _summary(cls or simulator.build), where)


def options_class(builder: Callable[..., Any]) -> type:
    """The options dataclass a registry builder parses its ``options`` with.

    Every builder turns its options into a dataclass first, with ``Cls.from_options(...)``
    (``policies/options.py``) or ``options_dataclass(Cls, ...)`` (``embodied_rl/checks.py``);
    that call in its body names the class.

    Raises:
        LookupError: the builder makes neither call (then say here how it reads options).
    """
    source = textwrap.dedent(inspect.getsource(builder))
    for node in ast.walk(ast.parse(source)):
        name = _parsed_class_name(node)
        if name is not None and dataclasses.is_dataclass(builder.__globals__.get(name)):
            return builder.__globals__[name]
    raise LookupError(
        f"{builder.__module__}.{builder.__qualname__} calls neither Cls.from_options(options) "
        "nor options_dataclass(Cls, options): the reference cannot find its options class"
    )


def _parsed_class_name(node: ast.AST) -> str | None:
    """``Cls`` of a ``Cls.from_options(...)`` or ``options_dataclass(Cls, ...)`` call."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "from_options":
        return func.value.id if isinstance(func.value, ast.Name) else None
    if isinstance(func, ast.Name) and func.id == "options_dataclass" and node.args:
        first = node.args[0]
        return first.id if isinstance(first, ast.Name) else None
    return None


def _where(obj: Any) -> str:
    """``path/to/module.py::Name`` of a class or function, relative to the repository."""
    path = Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT)
    return f"{path.as_posix()}::{obj.__qualname__}"


# --- field descriptions from the code ------------------------------------------------------


_ENTRY = re.compile(r"^(?P<names>\w+(?:\s*(?:/|,)\s*\w+)*):\s*(?P<text>.*)$")
_PARAGRAPH = re.compile(
    r"^(?P<names>``\w+``(?:\s*(?:/|,|and)\s*``\w+``)*)(?P<colon>:?)\s+(?P<text>.*)$"
)


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its description, from ``cls`` and its dataclass bases (module doc)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        if not dataclasses.is_dataclass(klass):
            continue
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        sources = (attribute_entries(doc), paragraph_entries(doc), field_comments(klass))
        for entries in sources:
            for name, text in entries.items():
                if name in names and name not in found:
                    found[name] = text
    return {name: found.get(name, "") for name in names}


def attribute_entries(doc: str) -> dict[str, str]:
    """The entries of a Google-style ``Attributes:`` section: name -> text on one line."""
    entries: dict[str, list[str]] = {}
    current: list[str] = []
    for line in _section_lines(doc, "Attributes:"):
        match = _ENTRY.match(line[4:]) if line.startswith("    ") and line[4:5] != " " else None
        if match:
            current = [match["text"]]  # shared by every name of the entry
            for name in re.split(r"\s*[/,]\s*", match["names"]):
                entries[name] = current
        elif current and line.strip():
            current.append(line.strip())
    return {name: " ".join(parts) for name, parts in entries.items()}


def _section_lines(doc: str, header: str) -> Iterator[str]:
    """The lines of a docstring section, from below its header to the next unindented line."""
    lines = iter(doc.splitlines())
    for line in lines:
        if line.strip() == header and not line.startswith(" "):
            break
    for line in lines:
        if line.strip() and not line.startswith(" "):
            return
        yield line


def paragraph_entries(doc: str) -> dict[str, str]:
    """Docstring paragraphs that start with a field's name: ````name``: text`` gives the text,
    ````name`` does ...`` the whole paragraph (````a`` / ``b``:`` describes both)."""
    entries: dict[str, str] = {}
    for paragraph in re.split(r"\n\s*\n", doc):
        paragraph = " ".join(paragraph.split())
        match = _PARAGRAPH.match(paragraph)
        if match:
            text = match["text"] if match["colon"] else paragraph
            for name in re.findall(r"``(\w+)``", match["names"]):
                entries[name] = text
    return entries


def field_comments(cls: type) -> dict[str, str]:
    """Field -> the comment on its line, else the comment lines right above it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = _comments_by_line(source)
    class_node = ast.parse(source).body[0]
    entries: dict[str, str] = {}
    for node in getattr(class_node, "body", []):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            trailing = comments.get(node.end_lineno, ("", False))
            entries[node.target.id] = trailing[0] if trailing[1] else _above(comments, node)
    return {name: text for name, text in entries.items() if text}


def _comments_by_line(source: str) -> dict[int, tuple[str, bool]]:
    """Line -> (comment text, whether code precedes it on that line)."""
    found: dict[int, tuple[str, bool]] = {}
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            text = token.string.lstrip("#").strip()
            found[row] = (text, bool(lines[row - 1][:col].strip()))
    return found


def _above(comments: dict[int, tuple[str, bool]], node: ast.AST) -> str:
    """The run of whole-line comments ending on the line just above ``node``."""
    parts: list[str] = []
    row = node.lineno - 1
    while row in comments and not comments[row][1]:
        parts.insert(0, comments[row][0])
        row -= 1
    return " ".join(parts)


def _summary(obj: Any) -> str:
    """The first paragraph of an object's own docstring, on one line."""
    doc = inspect.cleandoc(getattr(obj, "__doc__", None) or "")
    return " ".join(doc.split("\n\n")[0].split())


# --- Markdown -----------------------------------------------------------------------------


_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj):`(~?)([^`]+)`")
_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def to_markdown(text: str) -> str:
    """A docstring's reST on one Markdown line: ````x```` and ``:class:`x``` become ```x```;
    outside code, ``|``, ``*`` and ``<`` are escaped (a table cell, no emphasis, no HTML)."""
    text = _ROLE.sub(_role_text, " ".join(text.split()))
    parts = []
    for i, part in enumerate(_SPAN.split(text)):
        if i % 2:
            parts.append(code(part.strip("`")))
        else:
            parts.append(part.replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;"))
    return "".join(parts)


def code(text: str) -> str:
    """``text`` as inline code in a table cell. A ``|`` would end the cell on GitHub even in a
    code span, and ``\\|`` shows its backslash in Python-Markdown's code: such text is written
    as ``<code>`` with ``&#124;``, which both render as ``|``."""
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def _role_text(match: re.Match) -> str:
    """``:class:`a.B``` -> ```a.B```; ``:class:`~a.B``` -> ```B``` (reST's short form)."""
    target = match[2].rsplit(".", 1)[-1] if match[1] else match[2]
    return f"`{target}`"


def yaml_value(value: Any) -> str:
    """A default as it would be written in YAML (``null``, ``true``, ``[a, b]``); a value
    that YAML would spread over lines (a string with a newline) in JSON, a YAML subset."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    text = text.removesuffix("...").strip()
    return json.dumps(value) if "\n" in text else text


def default_cell(spec: dataclasses.Field, hint: Any, key: str) -> str:
    """The default of a field: a YAML value, *required*, or the nested block's heading."""
    if dataclasses.is_dataclass(hint):
        return f"see `{key}.{spec.name}`"
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return "*required*"
    return code(yaml_value(value))


def option_rows(cls: type, key: str) -> tuple[list[str], list[tuple[str, type]]]:
    """The table of a dataclass and its nested dataclass fields as ``(key, class)``."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    rows = ["| option | type | default | description |", "|---|---|---|---|"]
    nested = []
    for spec in (f for f in dataclasses.fields(cls) if f.init):
        hint = hints[spec.name]
        kind = to_markdown(_describe(hint))
        default = default_cell(spec, hint, key)
        rows.append(f"| `{spec.name}` | {kind} | {default} | {to_markdown(docs[spec.name])} |")
        if dataclasses.is_dataclass(hint):
            nested.append((f"{key}.{spec.name}" if key else spec.name, hint))
    return rows, nested


def block_lines(block: Block, level: int = 3) -> list[str]:
    """A block's heading, summary, source and table, then one block per nested dataclass."""
    lines = [f"{'#' * level} {block.title}", ""]
    if block.summary:
        lines += [to_markdown(block.summary), ""]
    if block.code:
        lines += [f"Code: `{block.code}`", ""]
    if block.cls is None:
        return lines + ["Takes no options.", ""]
    rows, nested = option_rows(block.cls, block.key)
    lines += [*rows, ""]
    for key, cls in nested:
        lines += block_lines(_class_block(f"`{key}`", key, cls), level + 1)
    return lines


def render() -> str:
    """The whole page."""
    lines = [HEADER]
    for heading, intro, blocks in chapters():
        lines += [f"## {heading}", "", intro, ""]
        for block in blocks:
            lines += block_lines(block)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the page, or with ``--check`` exit 1 (naming the command) when it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"default: {OUTPUT}")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if current != text:
            state = "is missing" if current is None else "differs from the config dataclasses"
            print(f"{args.output} {state}; regenerate it with: {COMMAND}", file=sys.stderr)
            return 1
        print(f"{args.output} is current")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
