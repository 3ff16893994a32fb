"""Perceptual hashes of image files (cached) and near-duplicate search by Hamming distance.

URL keys miss copies of an eval image re-hosted elsewhere or re-encoded. A 64-bit pHash
(``imagehash.phash``: DCT of the 32x32 greyscale image, low 8x8 frequencies against their median)
barely moves under re-encoding and resizing, so a pretraining image whose hash is within a small
Hamming distance of an eval image's hash is taken as a copy of it.

Search uses the pigeonhole principle: split the 64 bits into ``k + 1`` blocks; two hashes at
distance <= k agree exactly on at least one block. Candidates are pairs that share a block value
(found by sorting and binary search, no Python loop over pairs); each candidate's true distance
is then checked with a popcount.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import imagehash
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from pipeline.common.progress import track
from pipeline.common.runinfo import atomic_write_bytes
from pipeline.common.image_io import ImageRejected, decode_image

HASH_BITS = 64
_CACHE_SCHEMA = pa.schema(
    [("path", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("phash", pa.uint64())]
)


def phash_file(path: str) -> int | None:
    """The 64-bit pHash of an image file as an int, or None if the file is missing or unreadable."""
    try:
        pixels = decode_image(path)
    except ImageRejected:
        return None
    bits = imagehash.phash(Image.fromarray(pixels)).hash.reshape(-1)
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


class PhashCache:
    """pHashes of image files, remembered in a parquet file keyed by (path, size, mtime_ns).

    A changed file (other size or mtime) is hashed again; an unreadable one is stored as null so it
    is not retried on every run. Hashes depend only on file content, so the cache never changes
    results, only time.
    """

    def __init__(self, cache_file: Path | None, *, workers: int = 1) -> None:
        self.cache_file = cache_file
        self.workers = max(1, workers)
        self._entries: dict[str, tuple[int, int, int | None]] = {}
        self._dirty = False
        if cache_file is not None and cache_file.exists():
            table = pq.read_table(cache_file)
            for p, s, m, h in zip(*(table.column(c).to_pylist() for c in ("path", "size", "mtime_ns", "phash"))):
                self._entries[p] = (s, m, h)

    def hashes(self, paths: list[str], *, desc: str = "phash") -> list[int | None]:
        """pHash (or None when unreadable) of every path, hashing only files not cached yet."""
        stats = {p: _stat(p) for p in set(paths)}
        todo = sorted(p for p, st in stats.items() if st is not None and self._entries.get(p, (None, None))[:2] != st)
        if todo:
            if self.workers > 1 and len(todo) > 64:
                with ProcessPoolExecutor(self.workers) as pool:
                    computed = list(track(pool.map(phash_file, todo, chunksize=32), total=len(todo), desc=desc,
                                           unit="img"))
            else:
                computed = [phash_file(p) for p in track(todo, desc=desc, unit="img")]
            for p, h in zip(todo, computed):
                self._entries[p] = (*stats[p], h)
            self._dirty = True
        return [self._entries[p][2] if stats[p] is not None else None for p in paths]

    def save(self) -> None:
        """Write the cache (sorted by path, atomically) if anything was added."""
        if self.cache_file is None or not self._dirty:
            return
        items = sorted(self._entries.items())
        columns = [[k for k, _ in items]] + [[v[i] for _, v in items] for i in range(3)]
        table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, _CACHE_SCHEMA)],
                                     schema=_CACHE_SCHEMA)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        atomic_write_bytes(self.cache_file, sink.getvalue().to_pybytes())
        self._dirty = False


def _blocks(max_distance: int) -> list[tuple[int, int]]:
    """(shift, width) of ``max_distance + 1`` contiguous bit blocks covering 64 bits."""
    n = max_distance + 1
    widths = [HASH_BITS // n + (1 if i < HASH_BITS % n else 0) for i in range(n)]
    shifts = np.concatenate([[0], np.cumsum(widths)[:-1]]).tolist()
    return list(zip(shifts, widths))


def near_duplicate_pairs(
    query: np.ndarray, ref: np.ndarray, max_distance: int, *, chunk: int = 1 << 18
) -> tuple[np.ndarray, np.ndarray]:
    """All (i, j) with Hamming(query[i], ref[j]) <= max_distance.

    Args:
        query: uint64 [n] hashes (e.g. pretraining images).
        ref: uint64 [m] hashes (e.g. eval images).
        max_distance: 0..32 (beyond ~10 bits pHash matches mostly unrelated images anyway).
        chunk: queries processed at once, bounding the memory of candidate pairs.

    Returns:
        (query index int64 [p], ref index int64 [p]), sorted by (query, ref), without repeats.
    """
    if not 0 <= max_distance <= 32:
        raise ValueError(f"max_distance must be in 0..32, got {max_distance}")
    query = np.ascontiguousarray(query, dtype=np.uint64)
    ref = np.ascontiguousarray(ref, dtype=np.uint64)
    found_q: list[np.ndarray] = []
    found_r: list[np.ndarray] = []
    if len(query) == 0 or len(ref) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    for shift, width in _blocks(max_distance):
        mask = np.uint64((1 << width) - 1)
        ref_block = (ref >> np.uint64(shift)) & mask
        order = np.argsort(ref_block, kind="stable")
        ref_sorted = ref_block[order]
        for start in range(0, len(query), chunk):
            q = query[start : start + chunk]
            q_block = (q >> np.uint64(shift)) & mask
            lo = np.searchsorted(ref_sorted, q_block, side="left")
            hi = np.searchsorted(ref_sorted, q_block, side="right")
            counts = hi - lo
            total = int(counts.sum())
            if total == 0:
                continue
            qi = np.repeat(np.arange(len(q), dtype=np.int64), counts)
            # position inside each query's run of candidates, added to the run's start
            run_start = np.repeat(np.cumsum(counts) - counts, counts)
            ri = order[np.repeat(lo, counts) + (np.arange(total) - run_start)]
            close = np.bitwise_count(q[qi] ^ ref[ri]) <= max_distance
            found_q.append(qi[close] + start)
            found_r.append(ri[close])
    if not found_q:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([np.concatenate(found_q), np.concatenate(found_r).astype(np.int64)], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]
