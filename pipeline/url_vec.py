"""Vectorized :func:`pipeline.urls.canonical_url` and :func:`~pipeline.urls.flickr_photo_id`.

Millions of CC/SBU URLs make a per-row Python parse the bottleneck of decontamination. Most real
URLs are already canonical except for the case of scheme and host: ``scheme://host/path`` with
only plain ASCII path characters, no port, query, fragment, escapes or dot segments. Those are
canonicalized with Arrow string kernels (lower-case the ``scheme://host`` prefix, ``/`` for an empty
path); every other URL goes through the scalar function, once per distinct value. The fast path is
deliberately narrow so that the results are identical to the scalar functions on every input
(tests/pipeline/test_urls.py checks this property with hypothesis; bench/decontaminate.py asserts
it on a sample).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.urls import (
    FLICKR_PAGE_PATTERN,
    FLICKR_SHORT_PATTERN,
    FLICKR_STATIC_PATTERN,
    canonical_url,
    flickr_photo_id_from_url,
)

# Already canonical up to the case of the prefix: every path character is one canonical_url
# keeps literally, and there is no '%', '?', '#', ':port', userinfo or surrounding whitespace.
_SIMPLE = r"^(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9.\-]+)(?P<path>/[A-Za-z0-9\-._~!$&'()*+,;=:@/]*)?$"
# a "." or ".." path segment (may also fire inside odd hosts; those just take the slow path)
_DOT_SEGMENT = r"/\.\.?(?:/|$)"


def _as_array(values: pa.Array | pa.ChunkedArray | list) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.large_string())
    if not pa.types.is_large_string(values.type):
        values = values.cast(pa.large_string())
    return values


def _merge(mask: np.ndarray, fast: pa.Array, slow_values: list[str | None]) -> pa.Array:
    """Rows where ``mask`` is True take ``fast`` (already filtered), the others ``slow_values`` in order."""
    fast_idx = np.flatnonzero(mask)
    slow_idx = np.flatnonzero(~mask)
    combined = pa.concat_arrays([fast, pa.array(slow_values, type=pa.large_string())])
    position = np.empty(len(mask), dtype=np.int64)
    position[np.concatenate([fast_idx, slow_idx])] = np.arange(len(mask), dtype=np.int64)
    return combined.take(pa.array(position))


def _apply_unique(func, values: list[str | None]) -> list[str | None]:
    """``func`` over values, computed once per distinct value; None stays None."""
    cache: dict[str, str | None] = {}
    out: list[str | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        r = cache.get(v, cache)
        if r is cache:
            r = cache[v] = func(v)
        out.append(r)
    return out


def canonical_urls(urls: pa.Array | pa.ChunkedArray | list) -> pa.Array:
    """``canonical_url`` of every element (nulls stay null) as a large_string array of equal length."""
    arr = _as_array(urls)
    simple = pc.and_(
        pc.fill_null(pc.match_substring_regex(arr, _SIMPLE), False),
        pc.invert(pc.fill_null(pc.match_substring_regex(arr, _DOT_SEGMENT), False)),
    )
    mask = simple.to_numpy(zero_copy_only=False)
    parts = pc.extract_regex(arr.filter(simple), _SIMPLE)
    path = parts.field("path")
    path = pc.if_else(pc.equal(path, ""), "/", path)
    fast = pc.binary_join_element_wise(pc.utf8_lower(parts.field("pre")), path, pa.scalar("", pa.large_string()))
    slow = _apply_unique(canonical_url, arr.filter(pc.invert(simple)).to_pylist())
    return _merge(mask, fast.cast(pa.large_string()), slow)


def flickr_photo_ids_from_canonical(canon: pa.Array) -> pa.Array:
    """Flickr photo ids (or null) of already canonical URLs, as a large_string array."""
    canon = _as_array(canon)
    ids = pc.struct_field(pc.extract_regex(canon, FLICKR_STATIC_PATTERN), "id")
    pages = pc.struct_field(pc.extract_regex(canon, FLICKR_PAGE_PATTERN), "id")
    ids = pc.coalesce(ids, pages)
    short = pc.fill_null(pc.match_substring_regex(canon, FLICKR_SHORT_PATTERN), False)
    if pc.any(short).as_py():
        mask = pc.invert(short).to_numpy(zero_copy_only=False)
        decoded = _apply_unique(flickr_photo_id_from_url, canon.filter(short).to_pylist())
        ids = _merge(mask, ids.filter(pc.invert(short)).cast(pa.large_string()), decoded)
    return ids.cast(pa.large_string())


def url_keys(urls: pa.Array | pa.ChunkedArray | list) -> tuple[pa.Array, pa.Array]:
    """(canonical URL, Flickr photo id) of every URL; both large_string, null where none."""
    canon = canonical_urls(urls)
    return canon, flickr_photo_ids_from_canonical(canon)
