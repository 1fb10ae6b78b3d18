"""One rule for every command that writes: its output never is, contains or lies inside a
path the command reads.

``export`` (its ``--out`` against the run it exports and the working directory),
``train`` (``run_dir`` against every input the config names: demonstration and video
folders, prompt files, ``init_from`` runs, local model folders), ``eval`` (its output folder
against those inputs) and ``demos`` (``--out`` against LIBERO's task files) call
:func:`check_apart` before they create or remove anything. An output inside an input would be
read back as data (a run folder inside the demos folder is scanned for ``*.hdf5``), one that
holds an input would be emptied by ``--force`` / ``overwrite=true`` (an export into
``RUN/checkpoints`` deleted the checkpoint it was exporting).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from embodied_rl.runtime.config_errors import ConfigError

# Config keys whose string values (or lists of them) name files or folders a run reads.
INPUT_KEYS = frozenset(
    {"paths", "path", "init_from", "tokenizer_path", "train_path", "test_path", "prompts_path"}
)


def relation(out: Path, read: Path) -> str | None:
    """How ``out`` sits against ``read`` (both resolved): ``is``, ``lies inside``,
    ``contains``, or ``None`` when they are apart."""
    out, read = out.resolve(), read.resolve()
    if out == read:
        return "is"
    if read in out.parents:
        return "lies inside"
    if out in read.parents:
        return "contains"
    return None


def check_apart(what: str, out: Path, reads: Mapping[str, Path], fix: str) -> None:
    """Refuse ``out`` (described as ``what``, e.g. ``export --out``) when it is, contains or
    lies inside any of ``reads`` (description -> path).

    Raises:
        ConfigError: naming both paths, how they overlap, and ``fix``.
    """
    for label, read in reads.items():
        how = relation(out, read)
        if how is not None:
            raise ConfigError(
                f"{what} {out} {how} {label} {read}, which the command reads; writing there "
                "would mix its output with its input or delete it",
                fix,
            )


def config_inputs(plain: Mapping[str, Any], repo_root: Path) -> dict[str, Path]:
    """The existing files and folders a resolved config names under :data:`INPUT_KEYS`
    (``<key path>`` -> path; a relative path as the data readers look it up: the working
    directory first, then ``repo_root``)."""
    # The DAG sections last: their node configs mostly interpolate the sections above, whose
    # names (data.paths, models.actor.init_from) are the ones a user sets.
    order = sorted(plain, key=lambda key: key in ("dag", "eval_dag"))
    found: dict[str, Path] = {}
    for where, value in _string_values({key: plain[key] for key in order}, ""):
        for candidate in (Path(value).expanduser(), repo_root / value):
            if candidate.exists():
                if candidate.resolve() not in found.values():
                    found[where] = candidate.resolve()
                break
    return found


def _string_values(node: Any, where: str) -> Iterator[tuple[str, str]]:
    """``(key path, value)`` of the strings under input keys, anywhere in ``node``."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key in INPUT_KEYS:
                values = value if isinstance(value, list | tuple) else [value]
                for i, item in enumerate(values):
                    if isinstance(item, str) and item:
                        yield (path if len(values) == 1 else f"{path}[{i}]"), item
            else:
                yield from _string_values(value, path)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            yield from _string_values(item, f"{where}[{i}]")
