"""Shared-memory segments named after their creating process, and the removal of orphans.

The databuffer's shared-memory transport (``erl-db-<pid>-...``) and the simulator process pool
(``erl_sim_<pid>_...``) put the creating process's pid right after a fixed prefix. A process
killed with SIGKILL cannot unlink its segments, so whoever creates new ones first removes
those whose creator is gone (:func:`remove_orphans`).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_SHM_ROOT = Path("/dev/shm")


def shm_dir() -> Path:
    """Where segments live: tmpfs ``/dev/shm`` on Linux, else the temp dir (page cache)."""
    return _SHM_ROOT if _SHM_ROOT.is_dir() else Path(tempfile.gettempdir())


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def remove_orphans(prefix: str) -> list[Path]:
    """Delete ``<shm_dir>/<prefix><pid>...`` segments whose creating process is gone."""
    removed = []
    for path in shm_dir().glob(f"{prefix}*"):
        match = re.match(r"\d+", path.name[len(prefix) :])
        if match and not pid_alive(int(match.group())):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
