"""Fast argsort of a string column (example ids) by a 64-bit integer prefix key.

Sorting millions of ids with string comparisons is the most expensive step of writing a clean
manifest. Ids share a prefix (``cc:``) and then differ early (hashes, numbers), so the 8 bytes that
follow the common prefix, read as a big-endian integer, order almost every pair; numpy sorts those
integers quickly and only runs of equal keys are ordered by the full strings. The result is the
same permutation as ``pyarrow.compute.sort_indices`` (byte order, which for UTF-8 is code point
order), checked in tests/pipeline/test_decontaminate.py.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# above this share of rows in tied runs the prefix key does not pay: sort by full strings
_MAX_TIED_SHARE = 0.05


def _common_prefix_len(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _prefix_keys(ids: pa.Array, skip: int) -> np.ndarray:
    """uint64 [n]: bytes skip..skip+8 of every string, big-endian, zero-padded past the end."""
    offsets_type = np.int64 if pa.types.is_large_string(ids.type) else np.int32
    offsets = np.frombuffer(ids.buffers()[1], dtype=offsets_type)[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8) if ids.buffers()[2] is not None else np.zeros(0, np.uint8)
    if len(data) == 0:  # every string empty
        data = np.zeros(1, np.uint8)
    starts = offsets[:-1].astype(np.int64) + skip
    lengths = offsets[1:].astype(np.int64) - starts
    keys = np.zeros(len(ids), dtype=np.uint64)
    last = max(len(data) - 1, 0)
    for j in range(8):
        byte = np.where(lengths > j, data[np.minimum(starts + j, last)], 0).astype(np.uint64)
        keys |= byte << np.uint64(56 - 8 * j)
    return keys


def sort_indices(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """int64 [n] permutation that sorts ``ids`` ascending (strings, no nulls; ties keep input order)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    n = len(ids)
    if n < 2 or ids.null_count or not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
        return pc.sort_indices(ids).to_numpy()
    bounds = pc.min_max(ids)
    skip = _common_prefix_len(bounds["min"].as_py().encode(), bounds["max"].as_py().encode())
    keys = _prefix_keys(ids, skip)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    tied = np.zeros(n, dtype=bool)
    same = sorted_keys[1:] == sorted_keys[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if not tied.any():
        return order
    if tied.mean() > _MAX_TIED_SHARE:
        return pc.sort_indices(ids).to_numpy()
    # order each run of equal keys by the full strings (runs stay where they are)
    positions = np.flatnonzero(tied)
    run = np.cumsum(np.concatenate([[True], ~same])[positions])  # a new run wherever the key changes
    rows = order[positions]
    table = pa.table({"run": run, "id": ids.take(pa.array(rows)), "row": rows})
    resolved = table.sort_by([("run", "ascending"), ("id", "ascending"), ("row", "ascending")])
    order[positions] = resolved.column("row").to_numpy()
    return order


def take_sorted(table: pa.Table, column: str, *, workers: int = 1) -> pa.Table:
    """``table`` sorted by ``column`` (skipped when already sorted); columns gathered on ``workers`` threads."""
    ids = table.column(column)
    if table.num_rows < 2 or pc.all(pc.less(ids.slice(0, len(ids) - 1), ids.slice(1))).as_py():
        return table
    order = pa.array(sort_indices(ids))
    if workers <= 1:
        return table.take(order)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(workers, os.cpu_count() or 1, table.num_columns)) as pool:
        columns = list(pool.map(lambda col: col.take(order), table.columns))
    return pa.Table.from_arrays(columns, schema=table.schema)
