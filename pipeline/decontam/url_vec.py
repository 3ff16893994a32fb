"""Vectorized :func:`pipeline.decontam.urls.canonical_url` and :func:`~pipeline.decontam.urls.flickr_photo_id_from_url`.

Millions of CC/SBU URLs make a per-row Python parse the bottleneck of decontamination. URLs are
sorted into three classes with capture-free regular expressions (which run as fast DFAs):

1. already canonical: lower-case ``scheme://host/path`` of plain path characters, no port, query,
   fragment, escapes or dot segments; the URL is its own canonical form (most real URLs);
2. simple up to case and query order: the same shape with upper case in the scheme or host, an
   empty path, or a plain query string; canonicalized with Arrow string kernels (lower-case the
   prefix, ``/`` for an empty path, query parameters split, sorted and joined);
3. everything else (escapes, ports, userinfo, fragments, dot segments, non-ASCII, whitespace):
   the scalar function, once per distinct value.

Flickr photo ids are cut out of canonical static-image URLs with string splits, after a
capture-free match confirms the shape; photo pages and flic.kr links (rare) use the scalar code.
Results are identical to the scalar functions on every input: tests/pipeline/decontam/test_urls.py checks
this with hypothesis, and bench/decontaminate.py on a sample of its rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.decontam.urls import FLICKR_STATIC_PATTERN, canonical_url, flickr_photo_id_from_url

# a path of plain characters without "." or ".." segments: every segment is empty, starts with a
# character other than '.', is '.' + such a character..., or '..' + at least one more character
_SEG_CHAR = r"[A-Za-z0-9\-._~!$&'()*+,;=:@]"
_SEG_FIRST = r"[A-Za-z0-9\-_~!$&'()*+,;=:@]"
_SEGMENT = rf"(?:{_SEG_FIRST}{_SEG_CHAR}*|\.{_SEG_FIRST}{_SEG_CHAR}*|\.\.{_SEG_CHAR}+)?"
_QUERY_CHARS = r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?]"
_CANONICAL = rf"^[a-z][a-z0-9+.\-]*://[a-z0-9.\-]+(?:/{_SEGMENT})+$"
_SIMPLE = (rf"^(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9.\-]+)(?P<path>(?:/{_SEGMENT})*)"
           rf"(?P<query>(?:\?{_QUERY_CHARS}*)?)$")
_FLICKR_STATIC_NOCAP = FLICKR_STATIC_PATTERN.replace("(?P<id>", "(?:")
_FLICKR_OTHER = r"^https?://(?:(?:www\.|m\.)?flickr\.com/photos/|(?:www\.)?flic\.kr/p/)"
# every URL any Flickr pattern can match starts like this (anchored: other hosts fail at once)
_FLICKR_ANY = r"^https?://[a-z0-9.]*(?:flickr\.com|flic\.kr)[:/]"
_STRING = pa.large_string()
_EMPTY = pa.scalar("", _STRING)


def _as_array(values: pa.Array | pa.ChunkedArray | list) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=_STRING)
    if values.type != _STRING:
        values = values.cast(_STRING)
    return values


def _mask(values: pa.Array, pattern: str) -> pa.Array:
    return pc.fill_null(pc.match_substring_regex(values, pattern), False)


def _scatter(n: int, parts: list[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """An array of length n where row idx[k] of part (idx, values) is values[k]; other rows null."""
    values = pa.concat_arrays([v.cast(_STRING) for _, v in parts] + [pa.nulls(1, _STRING)])
    position = np.full(n, len(values) - 1, dtype=np.int64)  # default: the trailing null
    start = 0
    for idx, v in parts:
        position[idx] = np.arange(start, start + len(v), dtype=np.int64)
        start += len(v)
    return values.take(pa.array(position))


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


def _sorted_queries(queries: pa.Array) -> pa.Array:
    """``?``-prefixed canonical query of each raw query (``""`` for none): params split on '&',
    empty ones dropped, sorted (byte order == code point order for these ASCII strings), joined."""
    params = pc.split_pattern(queries, "&")
    flat = params.flatten()
    parent = pc.list_parent_indices(params).to_numpy()
    keep = pc.not_equal(flat, "").to_numpy(zero_copy_only=False)
    flat, parent = flat.filter(pa.array(keep)), parent[keep]
    rank = pc.rank(flat, sort_keys="ascending", tiebreaker="first").to_numpy()
    order = np.lexsort((rank, parent))
    counts = np.bincount(parent, minlength=len(queries))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), flat.take(pa.array(order))), pa.scalar("&", _STRING))
    return pc.if_else(pc.equal(joined, ""), _EMPTY, pc.binary_join_element_wise(pa.scalar("?", _STRING), joined, _EMPTY))


def canonical_urls(urls: pa.Array | pa.ChunkedArray | list) -> pa.Array:
    """``canonical_url`` of every element (nulls stay null), as a large_string array of equal length."""
    arr = _as_array(urls)
    done = _mask(arr, _CANONICAL)  # the one pass over every row; what is left is a small remainder
    todo = pc.and_(pc.invert(done), pc.is_valid(arr))
    rest = arr.filter(todo)
    if len(rest) == 0:
        return arr
    parts = []
    pieces = pc.extract_regex(rest, _SIMPLE)  # null where the URL is not of the simple shape
    simple = pc.is_valid(pieces)
    if pc.any(simple).as_py():
        pieces = pieces.filter(simple)
        path = pieces.field("path")
        path = pc.if_else(pc.equal(path, ""), pa.scalar("/", _STRING), path)
        query = pc.utf8_slice_codeunits(pieces.field("query"), 1)  # without the '?'
        built = pc.binary_join_element_wise(pc.utf8_lower(pieces.field("pre")), path, _sorted_queries(query), _EMPTY)
        parts.append((np.flatnonzero(simple.to_numpy(zero_copy_only=False)), built))
    odd = pc.invert(simple)
    if pc.any(odd).as_py():
        slow = _apply_unique(canonical_url, rest.filter(odd).to_pylist())
        parts.append((np.flatnonzero(odd.to_numpy(zero_copy_only=False)), pa.array(slow, _STRING)))
    return pc.replace_with_mask(arr, todo, _scatter(len(rest), parts))


def flickr_photo_ids_from_canonical(canon: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Flickr photo ids (or null) of already canonical URLs, as a large_string array."""
    canon = _as_array(canon)
    flickr = _mask(canon, _FLICKR_ANY)
    if not pc.any(flickr).as_py():
        return pa.nulls(len(canon), _STRING)
    flickr_idx = np.flatnonzero(flickr.to_numpy(zero_copy_only=False))
    candidates = canon.filter(flickr)
    parts = []
    static = _mask(candidates, _FLICKR_STATIC_NOCAP)
    if pc.any(static).as_py():
        path = candidates.filter(static)
        if pc.any(pc.match_substring(path, "?")).as_py():  # drop queries (rare) before the last '/'
            path = pc.list_element(pc.split_pattern(path, "?", max_splits=1), 0)
        # the last segment is 0*<id>(_secret)(_size).ext: cut at the last '/', then at '_' and '.'
        name = pc.list_element(pc.split_pattern(path, "/", max_splits=1, reverse=True), 1)
        digits = pc.list_element(pc.split_pattern(name, "_", max_splits=1), 0)
        digits = pc.list_element(pc.split_pattern(digits, ".", max_splits=1), 0)
        digits = pc.utf8_ltrim(digits, characters="0")
        parts.append((flickr_idx[static.to_numpy(zero_copy_only=False)],
                      pc.if_else(pc.equal(digits, ""), pa.scalar("0", _STRING), digits)))
    # photo pages and flic.kr short links: rare, the scalar function decides
    other = pc.and_(pc.invert(static), _mask(candidates, _FLICKR_OTHER))
    if pc.any(other).as_py():
        ids = _apply_unique(flickr_photo_id_from_url, candidates.filter(other).to_pylist())
        parts.append((flickr_idx[other.to_numpy(zero_copy_only=False)], pa.array(ids, _STRING)))
    return _scatter(len(canon), parts)


def url_keys(urls: pa.Array | pa.ChunkedArray | list) -> tuple[pa.Array, pa.Array]:
    """(canonical URL, Flickr photo id) of every URL; both large_string, null where none."""
    canon = canonical_urls(urls)
    return canon, flickr_photo_ids_from_canonical(canon)
