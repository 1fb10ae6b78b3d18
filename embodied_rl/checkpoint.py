"""Atomic, verifiable, per-rank checkpoints.

Layout under a checkpoint root (usually ``<run_dir>/checkpoints``)::

    step_000010/
        rank_00000.pt      one shard per rank (torch.save of a plain dict)
        rank_00001.pt
        manifest.json      step, world_size, created time, size and sha256 of every shard

Protocol (the caller owns the barrier, so this module needs no process group):

1. every rank calls :func:`write_rank_shard`, which writes into ``step_000010.tmp/`` (each file
   goes to a temporary name, is fsynced, then ``os.replace``-d into place);
2. the caller runs a barrier over all ranks;
3. rank 0 calls :func:`finalize`, which checksums the shards, writes ``manifest.json`` and
   renames ``step_000010.tmp`` to ``step_000010`` with ``os.replace``.

A crash at any point leaves either no ``step_000010`` or a complete one. :func:`latest_checkpoint`
returns the newest checkpoint whose manifest verifies and skips (with a warning) corrupt ones.

A value that only one rank holds (the full state of an FSDP-sharded model, kept by the first
rank of its group) is written by that rank; the others write :func:`shard_reference` in its
place, and :func:`load_rank_shard` replaces each reference by the value at the same place in the
named rank's shard, so every rank loads the full value (checkpoints need a file system that
every rank reads, as ``finalize`` already does).

Shards are loaded with ``torch.load(weights_only=True)``, so a shard may contain only tensors
and plain Python values: dicts, lists, tuples, str, int, float, bool, None (plus torch dtypes,
devices and sizes). :func:`write_rank_shard` checks this before writing, so a bad state fails
at save time, not at resume time. :func:`embodied_rl.rng_state.capture_rng_state` returns the RNG states in that form.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied_rl.checks import check_range

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_HASH_CHUNK = 1 << 22
_SAFE_LEAVES = (torch.Tensor, str, bytes, int, float, bool, type(None), torch.dtype, torch.device)


_REFERENCE = "__in_shard_of_rank__"


def shard_reference(rank: int) -> dict[str, int]:
    """Stands in for a value that rank ``rank``'s shard holds at the same place."""
    return {_REFERENCE: int(rank)}


def _reference_rank(value: Any) -> int | None:
    if isinstance(value, Mapping) and set(value) == {_REFERENCE}:
        return int(value[_REFERENCE])
    return None


def _resolve_references(state: Any, load_shard: Any, path: tuple[Any, ...] = ()) -> Any:
    """``state`` with every :func:`shard_reference` replaced from the shard it names.

    Args:
        load_shard: ``rank -> that rank's loaded shard`` (cached by the caller).
        path: the keys leading to ``state`` from the shard's root.
    """
    rank = _reference_rank(state)
    if rank is not None:
        value: Any = load_shard(rank)
        for key in path:
            value = value[key]
        if _reference_rank(value) is not None:
            raise ValueError(f"shard of rank {rank} holds a reference at {list(path)}, not data")
        return value
    if isinstance(state, dict):
        return {k: _resolve_references(v, load_shard, (*path, k)) for k, v in state.items()}
    return state


def step_dir_name(step: int) -> str:
    """``step_000010`` for step 10."""
    return f"step_{step:06d}"


def shard_name(rank: int) -> str:
    """``rank_00003.pt`` for rank 3."""
    return f"rank_{rank:05d}.pt"


def _tmp_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f"{step_dir_name(step)}.tmp"


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable (no-op where dirs cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not support fsync on directories
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Any) -> None:
    """Write a file under a temporary name, fsync it, then move it into place."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)  # a full disk gets back what the failed write took
        raise
    os.replace(partial, path)
    _fsync_dir(path.parent)


class CheckpointWriteError(RuntimeError):
    """Writing a checkpoint failed (disk full, quota, permissions): the message names the
    folder, the step being saved, the newest complete checkpoint and how to go on."""


def write_failure(ckpt_root: Path, step: int, err: OSError) -> CheckpointWriteError:
    """The error for a failed write of step ``step``'s checkpoint under ``ckpt_root``."""
    latest = latest_checkpoint(ckpt_root, checksums=False)
    reason = err.strerror or type(err).__name__
    where = f" ({err.filename})" if err.filename else ""
    if latest is None:
        kept = "there is no earlier checkpoint; the run starts again from step 0"
    else:
        kept = f"the newest complete checkpoint, {latest.name}, is intact and resume=true continues from it"
    return CheckpointWriteError(
        f"writing the checkpoint of step {step} into {ckpt_root} failed: {reason}{where}; "
        f"{kept}. Fix: free space on that disk (or point run_dir elsewhere), then run the same "
        "command with resume=true"
    )


def check_weights_only_safe(obj: Any, where: str = "state") -> None:
    """Raise ``TypeError`` naming the first value ``torch.load(weights_only=True)`` would refuse.

    Args:
        obj: the state to be saved.
        where: the path of ``obj`` in the state, used in the message.
    """
    if isinstance(obj, _SAFE_LEAVES) or isinstance(obj, torch.Size):
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{where} has a key of type {type(key).__name__}; use str keys")
            check_weights_only_safe(value, f"{where}[{key!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            check_weights_only_safe(value, f"{where}[{i}]")
        return
    hint = " (use torch.from_numpy)" if isinstance(obj, (np.ndarray, np.generic)) else ""
    raise TypeError(
        f"{where} is a {type(obj).__module__}.{type(obj).__name__}, which a weights_only "
        f"checkpoint cannot hold; convert it to tensors or plain Python values{hint}"
    )


def write_rank_shard(ckpt_root: str | Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    """Write this rank's shard of the checkpoint of ``step`` into the pending directory.

    Args:
        ckpt_root: the checkpoint root directory (created if missing).
        step: the training step the state belongs to.
        rank: this worker's global rank.
        state: tensors and plain Python values only (see the module docstring).

    Returns:
        The shard's path inside ``step_XXXXXX.tmp/``.
    """
    check_weights_only_safe(state)
    tmp = _tmp_dir(Path(ckpt_root), step)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / shard_name(rank)
    _atomic_write(path, lambda f: _save_to(state, f))
    return path


class _WriteRecorder:
    """A file object that keeps the ``OSError`` of a failed write: torch.save reports a
    failed write (a full disk) as a ``RuntimeError`` of its zip writer, without the cause."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def _save_to(state: dict[str, Any], file: Any) -> None:
    """``torch.save(state, file)``; a failed write raises its ``OSError``."""
    recorder = _WriteRecorder(file)
    try:
        torch.save(state, recorder)
    except RuntimeError:
        if recorder.error is not None:
            raise recorder.error from None
        raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _collect_shards(tmp: Path, world_size: int) -> dict[str, dict[str, Any]]:
    """Checksums of ranks ``0..world_size-1``; stale shards of other ranks are removed."""
    expected = {shard_name(r) for r in range(world_size)}
    missing = sorted(expected - {p.name for p in tmp.glob("rank_*.pt")})
    if missing:
        raise FileNotFoundError(
            f"{tmp} lacks shards {missing}; every rank must call write_rank_shard before "
            "the barrier that precedes finalize"
        )
    for stale in tmp.glob("rank_*.pt"):
        if stale.name not in expected:  # left by an earlier attempt with more ranks
            logger.warning("removing stale shard %s (world_size is %d)", stale, world_size)
            stale.unlink()
    return {
        name: {"size": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
        for name in sorted(expected)
    }


def finalize(
    ckpt_root: str | Path, step: int, world_size: int, keep_last: int | None = None
) -> Path:
    """Seal the checkpoint of ``step``: write its manifest and rename it into place.

    Called by rank 0 only, after a barrier that follows every rank's ``write_rank_shard``.

    Args:
        ckpt_root: the checkpoint root directory.
        step: the step the shards were written for.
        world_size: the number of ranks that wrote shards.
        keep_last: when set, delete all but the newest ``keep_last`` complete checkpoints.

    Returns:
        The final checkpoint directory.
    """
    root = Path(ckpt_root)
    tmp, final = _tmp_dir(root, step), root / step_dir_name(step)
    manifest = {
        "format": _FORMAT,
        "step": step,
        "world_size": world_size,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "files": _collect_shards(tmp, world_size),
    }
    text = json.dumps(manifest, indent=2, sort_keys=True).encode()
    _atomic_write(tmp / MANIFEST, lambda f: f.write(text))
    if final.exists():
        # A checkpoint of this step exists (e.g. a corrupt one the run resumed past): move it
        # aside first, because a directory cannot be replaced by a rename while non-empty.
        stale = root / f"{final.name}.stale"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        shutil.rmtree(stale)
    os.replace(tmp, final)
    _fsync_dir(root)
    if keep_last is not None:
        prune(root, keep_last)
    return final


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(step, dir)`` of every sealed checkpoint directory, newest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / MANIFEST).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def prune(ckpt_root: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` sealed checkpoints; returns the deleted dirs."""
    check_range("keep_last", keep_last, 1)
    doomed = [path for _, path in _complete_checkpoints(Path(ckpt_root))[keep_last:]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def read_manifest(ckpt_dir: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of a sealed checkpoint directory."""
    return json.loads((Path(ckpt_dir) / MANIFEST).read_text())


def _file_problem(path: Path, entry: Mapping[str, Any], checksum: bool) -> str | None:
    if not path.is_file():
        return f"{path.name} is missing"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"{path.name} has {size} bytes, the manifest says {entry['size']}"
    if checksum and _sha256(path) != entry["sha256"]:
        return f"{path.name} does not match its sha256 in the manifest"
    return None


def _is_count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _manifest_problem(manifest: Any) -> str | None:
    """What is wrong with the shape of a parsed manifest (what :func:`finalize` writes), or
    ``None``: a JSON object with int ``step`` and ``world_size`` and ``files`` mapping each
    shard name to its int ``size`` and str ``sha256``."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, expected an object"
    if not _is_count(manifest.get("step"), 0) or not _is_count(manifest.get("world_size"), 1):
        return "step and world_size must be integers (world_size >= 1)"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "files must map each shard to its size and sha256"
    for name, entry in files.items():
        fits = isinstance(entry, dict) and _is_count(entry.get("size"), 0)
        if not fits or not isinstance(entry.get("sha256"), str):
            return f"files[{name!r}] must hold an integer size and a sha256 string"
    return None


def verify_checkpoint(ckpt_dir: str | Path, checksums: bool = True) -> str | None:
    """Why a sealed checkpoint is unusable, or ``None`` when every shard verifies.

    Args:
        ckpt_dir: a ``step_XXXXXX`` directory.
        checksums: also compare sha256 (reads every shard); sizes are always compared.
    """
    ckpt_dir = Path(ckpt_dir)
    try:
        manifest = read_manifest(ckpt_dir)
    except (OSError, ValueError) as err:
        return f"its manifest is unreadable ({err!r})"
    problem = _manifest_problem(manifest)
    if problem is not None:  # a manifest of the wrong shape is as unusable as a bad checksum
        return f"its manifest is malformed ({problem})"
    files = manifest["files"]
    expected = {shard_name(r) for r in range(manifest["world_size"])}
    if set(files) != expected:
        return f"its manifest lists {sorted(files)}, expected {sorted(expected)}"
    for name, entry in sorted(files.items()):
        problem = _file_problem(ckpt_dir / name, entry, checksums)
        if problem:
            return problem
    return None


def latest_checkpoint(ckpt_root: str | Path, checksums: bool = True) -> Path | None:
    """The newest sealed checkpoint that verifies, or ``None`` when there is none.

    Pending ``.tmp`` directories are ignored; a newer checkpoint that fails verification is
    skipped with a warning naming it and the problem, and the previous one is tried.
    """
    for _, path in _complete_checkpoints(Path(ckpt_root)):
        problem = verify_checkpoint(path, checksums=checksums)
        if problem is None:
            return path
        logger.warning("skipping corrupt checkpoint %s: %s", path, problem)
    return None


def load_rank_shard(
    ckpt_dir: str | Path, rank: int, *, world_size: int, map_location: Any = "cpu"
) -> dict[str, Any]:
    """Load this rank's shard of a sealed checkpoint (``weights_only=True``).

    Args:
        ckpt_dir: a ``step_XXXXXX`` directory, e.g. from :func:`latest_checkpoint`.
        rank: this worker's global rank.
        world_size: the current number of ranks; a checkpoint written by another number of
            ranks is refused, since per-rank shards cannot be re-split here.
        map_location: passed to ``torch.load``.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    saved = int(manifest["world_size"])
    if saved != world_size:
        raise ValueError(
            f"checkpoint {ckpt_dir} was written by world_size={saved} ranks but this run has "
            f"world_size={world_size}; resume with {saved} workers or start a fresh run"
        )
    shards: dict[int, dict[str, Any]] = {}

    def load_shard(r: int) -> dict[str, Any]:
        if r not in shards:
            shards[r] = _load_verified_shard(ckpt_dir, manifest, r, map_location)
        return shards[r]

    return _resolve_references(load_shard(rank), load_shard)


class CorruptCheckpointError(ValueError):
    """A shard read for loading differs from the manifest (missing, size or sha256)."""


def load_entry(ckpt_dir: str | Path, key: str, *, rank: int = 0) -> Any:
    """``state[key]`` of one rank's shard of a sealed checkpoint, whatever its world size.

    A :func:`shard_reference` is followed to the shard that holds the value (FSDP models), so
    this reads e.g. a model's full weights (``key="models"`` then ``["model/actor"]``) from a
    run with any number of ranks. The shards read are verified against the manifest.
    """
    ckpt_dir = Path(ckpt_dir)
    manifest = read_manifest(ckpt_dir)
    shards: dict[int, dict[str, Any]] = {}

    def load_shard(r: int) -> dict[str, Any]:
        if r not in shards:
            shards[r] = _load_verified_shard(ckpt_dir, manifest, r, "cpu")
        return shards[r]

    return _resolve_references(load_shard(rank)[key], load_shard, (key,))


def _load_verified_shard(
    ckpt_dir: Path, manifest: Mapping[str, Any], rank: int, map_location: Any
) -> dict[str, Any]:
    name = shard_name(rank)
    if name not in manifest["files"]:
        raise ValueError(f"checkpoint {ckpt_dir} has no shard for rank {rank}")
    # Each rank re-checks only the shards it reads, so the check is spread over the ranks.
    problem = _file_problem(ckpt_dir / name, manifest["files"][name], checksum=True)
    if problem:
        raise CorruptCheckpointError(f"checkpoint {ckpt_dir} is corrupt: {problem}")
    return torch.load(ckpt_dir / name, map_location=map_location, weights_only=True)
