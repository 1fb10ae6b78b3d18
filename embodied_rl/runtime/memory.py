"""Process memory: what a worker reads of its RSS, and the C allocator settings that keep it flat.

Why a DAG worker's RSS grew on LIBERO (issue 15, measured; numbers in
docs/benchmarks/worker_memory.md): not a leak of objects but glibc's malloc. glibc gives a
thread that allocates
its own arena (up to 8 per core), and an arena hands memory back to the OS only from its top.
A worker allocates from several threads: Ray runs actor calls in a thread pool, gloo and the
TensorBoard writer have threads of their own. Building a LIBERO scene allocates and frees
hundreds of MB (XML, compiled model, decoded meshes), and with a new task every step those
blocks land in whichever arena the thread has, between long-lived ones: the free space
fragments and RSS climbed with every task change (two ranks without Ray, one thread each;
flat on one rank with no other threads). Two remedies, both needed:

- Worker processes run with ``MALLOC_ARENA_MAX=2`` (:func:`worker_process_env`; Ray starts the
  actors with it, their simulator processes inherit it): few arenas, so freed blocks are
  reused. With it the same runs stayed flat.
- :func:`release_free_heap` after scenes are built or closed returns the free pages in the
  middle of the heap (``malloc_trim``), cheap next to building a scene.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

import psutil

_MB = 1024**2

# Set for worker processes unless the caller's environment already sets them.
WORKER_ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2"}


def memory_mb() -> tuple[float, float]:
    """Resident memory (MiB) of this process and of all its descendants together.

    A worker's descendants are its simulator processes (``rollout.processes > 0``) and the
    helpers multiprocessing starts for them; with in-process simulators the second value is
    about 0. Shared pages (e.g. torch libraries) count in every process that maps them, so
    the sum is an upper bound; its trend over a long run is what shows a leak.
    """
    me = psutil.Process()
    children = 0
    for child in me.children(recursive=True):
        try:
            children += child.memory_info().rss
        except psutil.NoSuchProcess:  # exited between the listing and the read
            pass
    return me.memory_info().rss / _MB, children / _MB


def worker_process_env() -> dict[str, str]:
    """Environment variables a worker process starts with: :data:`WORKER_ALLOCATOR_ENV`,
    each overridden by the caller's own non-empty value of it (``MALLOC_ARENA_MAX=8
    embodied-rl ...``).

    glibc reads them once, when the process starts, so they must be set by whoever starts it.
    Other C libraries ignore them.
    """
    return {name: os.environ.get(name) or value for name, value in WORKER_ALLOCATOR_ENV.items()}


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:
    """glibc's ``malloc_trim``, or ``None`` under another C library (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Return the C heap's free pages to the OS (``malloc_trim(0)``: every arena, also free
    pages between live blocks). Returns whether anything was released; ``False`` also where
    the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
