"""Keep freed memory in a stage process for reuse, instead of handing it back to the kernel (glibc).

A training step frees and allocates the same large buffers every step: the word-embedding gradient
alone is [30522, 384] fp32, 47 MB, and torch's embedding backward zero-fills a fresh one each step.
glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and
unmaps it on ``free``, and gives the top of its heap back once more than 128 KiB are free there. So
each step the kernel maps those pages again and faults every one of them in on first touch: that
zero-fill took 25 ms of a ~300 ms pretraining step (docs/decisions.md#malloc-keep-freed). With
``mmap`` off (``M_MMAP_MAX`` 0) and trimming off (``M_TRIM_THRESHOLD`` 1 GiB), a freed block stays
in the heap and the next step reuses its pages.

What it costs: the process's resident memory stays at its peak instead of shrinking after it. What
it does not change: any number (torch aligns its CPU tensors itself, to 64 bytes, either way).
Like the OpenMP wait (:mod:`pipeline.common.openmp`), a user's choice wins: with ``glibc.malloc``
tunables in ``GLIBC_TUNABLES``, or ``UNITER_MALLOC=system``, nothing is set, and with another
allocator preloaded (jemalloc, tcmalloc) glibc's settings change nothing that allocator does.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

TUNABLES_ENV, CHOICE_ENV = "GLIBC_TUNABLES", "UNITER_MALLOC"  # UNITER_MALLOC: keep (default) | system
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt() parameters, from glibc's <malloc.h>
TRIM_THRESHOLD = 1 << 30  # bytes free at the heap's top before glibc gives them back


def glibc_version() -> str | None:
    """``"2.36"`` when this process runs on glibc, else None (musl, macOS, Windows)."""
    try:
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return None
    return version if name == "glibc" else None


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> bool:
    """Turn off glibc's ``mmap`` for large blocks and its heap trimming in this process; returns
    whether it did (False off glibc, with ``UNITER_MALLOC=system`` or the user's ``glibc.malloc``
    tunables). Any other value of ``UNITER_MALLOC`` than keep or system is an error."""
    choice = environ.get(CHOICE_ENV, "keep")
    if choice not in ("keep", "system"):
        raise ValueError(f"{CHOICE_ENV}={choice!r}: expected keep or system")
    if choice == "system" or "glibc.malloc." in environ.get(TUNABLES_ENV, "") or glibc_version() is None:
        return False
    libc = ctypes.CDLL(None)
    # mallopt returns 1 on success; both or neither matter (mmap off alone still trims the heap)
    return libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
