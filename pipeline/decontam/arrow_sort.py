"""Fast argsort and distinct count of a string column (ids) by a 64-bit integer prefix key.

Sorting millions of ids with string comparisons is the most expensive step of writing a clean
manifest. Ids share a prefix (``cc:``) and then differ early (hashes, numbers), so the 8 bytes that
follow the common prefix, read as a big-endian integer, order almost every pair; numpy sorts those
integers quickly and only runs of equal keys are ordered by the full strings. The result is the
same permutation as ``pyarrow.compute.sort_indices`` (byte order, which for UTF-8 is code point
order), checked in tests/pipeline/decontam/test_decontaminate.py.
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


def _prefix_keys(ids: pa.Array, skip: int, *, chunk: int = 1 << 20) -> np.ndarray:
    """uint64 [n]: bytes skip..skip+8 of every string, big-endian, zero-padded past the end."""
    offsets, data = _string_data(ids)
    offsets = offsets - offsets[0]
    if len(data) == 0:  # every string empty
        data = np.zeros(1, np.uint8)
    n = len(ids)
    lengths = np.diff(offsets)
    width = int(lengths[0]) if n else 0
    if n and width >= skip + 8 and (lengths == width).all():  # fixed width (hashes): a strided view, no gather
        return np.ascontiguousarray(data.reshape(n, width)[:, skip : skip + 8]).view(">u8").reshape(-1).astype(np.uint64)
    keys = np.empty(n, dtype=np.uint64)
    byte_pos = np.arange(8)
    for lo in range(0, n, chunk):  # one (rows x 8) gather per chunk bounds the index memory
        starts = offsets[lo : min(lo + chunk, n)] + skip
        lengths = offsets[lo + 1 : lo + chunk + 1] - starts
        gathered = data[np.minimum(starts[:, None] + byte_pos, len(data) - 1)]
        gathered[byte_pos >= lengths[:, None]] = 0
        keys[lo : lo + len(starts)] = np.ascontiguousarray(gathered).view(">u8").reshape(-1)
    return keys


def _keyable(ids: pa.Array) -> bool:
    return len(ids) > 0 and not ids.null_count and (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type))


def column_keys(ids: pa.Array) -> np.ndarray:
    """uint64 [n] prefix keys of a string column: the 8 bytes after the prefix all strings share."""
    bounds = pc.min_max(ids)
    skip = _common_prefix_len(bounds["min"].as_py().encode(), bounds["max"].as_py().encode())
    return _prefix_keys(ids, skip)


def sort_indices(ids: pa.Array | pa.ChunkedArray, rows: np.ndarray | None = None, *,
                 keys: np.ndarray | None = None) -> np.ndarray:
    """int64 permutation sorting ``ids`` ascending, or: ``rows`` (int64 positions) reordered so that
    ``ids[rows]`` ascends. Strings without nulls; equal strings keep their input order. ``keys``:
    :func:`column_keys` of ``ids`` if already computed."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    rows = np.arange(len(ids), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    n = len(rows)
    if n < 2 or not _keyable(ids):
        return rows if n < 2 else rows[pc.sort_indices(ids.take(pa.array(rows))).to_numpy()]
    keys = (column_keys(ids) if keys is None else keys)[rows]  # no string gather needed
    order = np.argsort(keys)  # unstable is fine: runs of equal keys are re-sorted by (string, row) below
    sorted_keys = keys[order]
    tied = np.zeros(n, dtype=bool)
    same = sorted_keys[1:] == sorted_keys[:-1]
    tied[1:] |= same
    tied[:-1] |= same
    if not tied.any():
        return rows[order]
    if tied.mean() > _MAX_TIED_SHARE:
        return rows[pc.sort_indices(ids.take(pa.array(rows))).to_numpy()]
    # order each run of equal keys by the full strings (runs stay where they are)
    positions = np.flatnonzero(tied)
    run = np.cumsum(np.concatenate([[True], ~same])[positions])  # a new run wherever the key changes
    tied_rows = rows[order[positions]]
    table = pa.table({"run": run, "id": ids.take(pa.array(tied_rows)), "row": tied_rows})
    resolved = table.sort_by([("run", "ascending"), ("id", "ascending"), ("row", "ascending")])
    out = rows[order]
    out[positions] = resolved.column("row").to_numpy()
    return out


def _string_data(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    offsets_type = np.int64 if pa.types.is_large_string(ids.type) else np.int32
    offsets = np.frombuffer(ids.buffers()[1], dtype=offsets_type)[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(ids.buffers()[2], dtype=np.uint8) if ids.buffers()[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data[offsets[0] : offsets[-1]]


def count_distinct(ids: pa.Array | pa.ChunkedArray) -> int:
    """Number of distinct strings (same as ``pc.count_distinct``), sorting 64-bit prefix keys.

    Hashing millions of strings is slow and cache-unfriendly; sorting integers is not. Equal keys
    are distinct strings only if the strings are longer than the key (or hold NUL bytes): those
    runs are counted exactly with Arrow.
    """
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if len(ids) < 2 or not _keyable(ids):
        return pc.count_distinct(ids).as_py()
    bounds = pc.min_max(ids)
    skip = _common_prefix_len(bounds["min"].as_py().encode(), bounds["max"].as_py().encode())
    keys = _prefix_keys(ids, skip)
    offsets, data = _string_data(ids)
    exact = int(np.diff(offsets).max()) - skip <= 8 and not (data == 0).any()
    if exact:  # every string is its prefix key
        return int(len(np.unique(keys)))
    sorted_keys = np.sort(keys)
    same = sorted_keys[1:] == sorted_keys[:-1]
    distinct = 1 + int(np.count_nonzero(~same))
    if not same.any():
        return distinct
    # rows whose key is shared: count their distinct strings per key exactly
    shared = np.isin(keys, np.unique(sorted_keys[1:][same]))
    rows = pa.table({"key": keys[shared], "id": ids.filter(pa.array(shared))})
    per_key = rows.group_by(["key"], use_threads=False).aggregate([("id", "count_distinct")])
    return distinct + int(pc.sum(per_key.column("id_count_distinct")).as_py()) - per_key.num_rows


def _ascending(ids: pa.Array, rows: np.ndarray, keys: np.ndarray | None) -> bool:
    """Whether ``ids[rows]`` strictly ascends (cheap integer test first; strings only if it passes)."""
    if keys is not None:
        sub = keys[rows]
        if not (sub[1:] >= sub[:-1]).all():
            return False
    chosen = ids.take(pa.array(rows))
    return pc.all(pc.less(chosen.slice(0, len(chosen) - 1), chosen.slice(1))).as_py()


def take_sorted(table: pa.Table, column: str, *, keep: pa.Array | None = None, workers: int = 1) -> pa.Table:
    """The rows of ``table`` where ``keep`` (default: all), sorted by ``column``, in one gather.

    Selecting and sorting together copies the table once instead of twice; an input already in
    order is only filtered. Columns are gathered on ``workers`` threads.
    """
    ids = table.column(column).combine_chunks()
    rows = np.arange(table.num_rows) if keep is None else np.flatnonzero(keep.to_numpy(zero_copy_only=False))
    keys = column_keys(ids) if _keyable(ids) else None
    if len(rows) >= 2 and not _ascending(ids, rows, keys):
        rows = sort_indices(ids, rows, keys=keys)
    elif keep is None:
        return table
    order = pa.array(rows)
    # column by column (measured ~1.4x cheaper than Table.take here), on threads when asked
    if workers <= 1:
        columns = [col.take(order) for col in table.columns]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, os.cpu_count() or 1, table.num_columns)) as pool:
            columns = list(pool.map(lambda col: col.take(order), table.columns))
    return pa.Table.from_arrays(columns, schema=table.schema)
