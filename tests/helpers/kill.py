"""SIGKILL just before the k-th filesystem step of an operation, in a forked child.

The kill comes from a test-only audit hook (``sys.addaudithook``): it counts the operations that
change the filesystem (mkdir, open for writing, chmod, rename/replace, unlink, rmdir) and kills the
process before the k-th one. Production code has no hook.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MUTATING = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.chmod", "os.truncate", "os.symlink", "os.link"}


def is_step(event: str, args: tuple) -> bool:
    if event in _MUTATING:
        return True
    if event == "open":  # (path, mode, flags): only opens that may write
        mode, flags = args[1], args[2]
        return (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
    return False


def run_killed_at(op: Callable[[Path], None], root: Path, k: int) -> bool:
    """Run ``op(root)`` in a forked child killed just before its k-th filesystem step; True when
    the kill happened, False when ``op`` finished first (k is past its last step)."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            seen = [0]

            def hook(event, args):
                if is_step(event, args):
                    seen[0] += 1
                    if seen[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)

            sys.addaudithook(hook)
            op(root)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - report any failure as exit 1
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, f"the operation failed (exit {os.WEXITSTATUS(status)}) before step {k}"
    return False
