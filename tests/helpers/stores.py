"""Writing a whole LMDB store in one call (the stages drive :class:`LmdbWriter` themselves)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from pipeline.stores.lmdb_store import LmdbWriter


def write_lmdb(out_dir: Path, items: Iterable[tuple[str, bytes]], *, commit_every: int) -> LmdbWriter:
    """Write sorted ``(key, encoded value)`` items as ``out_dir/data.mdb``; returns the writer (stats).
    A failure aborts the writer (its partial DB is discarded) and re-raises."""
    writer = LmdbWriter(Path(out_dir) / ".work", commit_every=commit_every)
    try:
        for key, value in items:
            writer.put(key, value)
        writer.finish(out_dir)
    except BaseException:
        writer.abort()
        raise
    return writer
