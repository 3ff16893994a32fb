"""Test hook: the disk fills (ENOSPC) at one chosen output, without a small filesystem.

A tmpfs of a few KiB needs root; this hook needs nothing. It patches, for the test only, the two
places where the pipeline's bytes reach the disk: the parquet writer's close and ``os.fsync``
(every atomically written file, the LMDB writer's sync aside)."""

from __future__ import annotations

import errno
import os

import pyarrow.parquet as pq


def full() -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fill_disk_at(monkeypatch, marker: str) -> None:
    """From now on (in ``monkeypatch``'s scope), finishing a file whose path contains ``marker``
    raises ENOSPC: at the parquet writer's close, or at the fsync of an atomic write."""
    import pipeline.ingest.manifest as manifest_module

    real_fsync = os.fsync

    class Writer(pq.ParquetWriter):
        def __init__(self, where, *args, **kwargs):
            self.target = str(where)
            super().__init__(where, *args, **kwargs)

        def close(self):
            super().close()
            if marker in self.target:
                full()

    def fsync(fd):
        if marker in os.readlink(f"/proc/self/fd/{fd}"):
            full()
        return real_fsync(fd)

    monkeypatch.setattr(manifest_module.pq, "ParquetWriter", Writer)
    monkeypatch.setattr(os, "fsync", fsync)
