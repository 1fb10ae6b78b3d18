"""The C allocator settings of worker processes and giving freed heap pages back to the OS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from embodied_rl.runtime import memory
from embodied_rl.runtime.memory import WORKER_ALLOCATOR_ENV, worker_process_env


def test_worker_processes_get_two_malloc_arenas_unless_the_caller_chose(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert worker_process_env() == {"MALLOC_ARENA_MAX": "2"} == WORKER_ALLOCATOR_ENV
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert worker_process_env() == {"MALLOC_ARENA_MAX": "8"}
    monkeypatch.setenv("MALLOC_ARENA_MAX", "")  # set but empty: glibc would ignore it
    assert worker_process_env() == {"MALLOC_ARENA_MAX": "2"}


# 300 blocks of 1 MiB written through (resident), all freed but the last: they sit below a
# live block, so free() cannot shrink the heap and glibc keeps them resident until trimmed.
# The mmap threshold is raised so that the blocks come from the heap (as MuJoCo's and
# robosuite's do once glibc's adaptive threshold has grown), and free() is kept from
# trimming the top by itself.
_FRAGMENTED_HEAP = """
import ctypes, sys
import psutil
sys.path.insert(0, {root!r})
from embodied_rl.runtime.memory import release_free_heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-3, 64 * 2**20)  # M_MMAP_THRESHOLD: blocks come from the heap, not mmap
libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD: free() itself never trims
rss = lambda: psutil.Process().memory_info().rss / 2**20
start = rss()
blocks = [libc.malloc(2**20) for _ in range(300)]
for block in blocks:
    ctypes.memset(block, 1, 2**20)
for block in blocks[:-1]:
    libc.free(block)
held = rss()
released = release_free_heap()
print(start, held, rss(), released)
"""


@pytest.mark.skipif(memory._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_release_free_heap_gives_freed_blocks_back():
    root = str(Path(__file__).resolve().parents[3])
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENTED_HEAP.format(root=root)],
        capture_output=True,
        text=True,
        check=True,
    )
    start, held, after, released = out.stdout.split()
    start, held, after = float(start), float(held), float(after)
    assert held - start > 250.0  # the freed blocks were still resident (the setup works)
    assert released == "True"
    assert held - after > 250.0  # and the call gave them back
