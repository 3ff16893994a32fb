"""Where a downloaded web image (CC, SBU) lies: the two layouts of ``sources.<cc|sbu>.image_layout``.

- ``img2dataset``: img2dataset's ``files`` output (the ``download@`` stage runs it). Shard N is a
  folder ``NNNNN/`` of ``<key>.jpg`` (+ ``<key>.json``, ``<key>.txt``) and a table ``NNNNN.parquet``
  with one row per URL given to img2dataset: ``url``, ``key``, ``status`` (``success``,
  ``failed_to_download``, ``failed_to_resize``) and ``error_message``, plus ``NNNNN_stats.json``
  once the shard is finished. A failed download has a parquet row and no image.
- ``sha1``: one folder of ``<sha1(url utf-8) hex>.jpg``.

Millions of rows are matched to their shard rows without a Python dict: :class:`ShardIndex` hashes
the shards' URLs once (two independent 64-bit SipHashes, ``pandas.util.hash_array``) into sorted
numpy arrays, and each batch of reader rows is hashed the same way and looked up with
``searchsorted``. Two URLs are taken as equal when both hashes agree (a false match among N rows
and M shard URLs has probability about N*M/2**128).
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.common.source_records import MISSING_IMAGE, Reject, Row, SourceFormatError

log = logging.getLogger(__name__)

SUCCESS = "success"
# the columns of a shard parquet this reader needs (img2dataset writes more: caption, width, height, ...)
SHARD_COLUMNS = ("url", "key", "status", "error_message")
SHARD_RE = re.compile(r"\d+")  # shard names: the shard id, zero-padded (oom_shard_count digits)
IMAGE_EXT = "jpg"  # img2dataset's encode_format (its default; the download@ stage's)
BATCH_ROWS = 1 << 16
_HASH_KEYS = ("uniter-web-img-1", "uniter-web-img-2")  # SipHash keys (16 bytes): any two different ones


def url_key(url: str) -> str:
    """The image id of a URL: sha1 of its UTF-8 bytes, hex (the file stem in the sha1 layout)."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()


def url_hashes(urls: np.ndarray | list) -> tuple[np.ndarray, np.ndarray]:
    """Two independent uint64 hashes of each URL string (the join key of :class:`ShardIndex`)."""
    values = np.asarray(urls, dtype=object)
    return tuple(pd.util.hash_array(values, hash_key=k, categorize=False) for k in _HASH_KEYS)  # type: ignore


def finished_shards(root: Path) -> list[Path]:
    """The shard parquet files of ``root`` whose shard img2dataset finished (``NNNNN_stats.json``
    exists), in shard order. An unfinished shard's parquet may lack its footer (the writer was killed)."""
    return sorted(p for p in Path(root).glob("*.parquet")
                  if SHARD_RE.fullmatch(p.stem) and (p.parent / f"{p.stem}_stats.json").exists())


class ShardIndex:
    """url -> (shard, key, status, error_message) over every finished shard below ``root``.

    Memory per shard row: two uint64 hashes, the shard number and an int64 key (~28 bytes), plus
    the ``status: error_message`` text of failed rows in an Arrow array.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.shards = finished_shards(self.root)
        h1, h2, shard, keys, ok, errors = [], [], [], [], [], []
        self.key_width: list[int] = []  # digits of a shard's keys (oom_shard_count + oom_sample_per_shard)
        for i, path in enumerate(self.shards):
            table = self._read(path)
            urls = table.column("url").to_numpy(zero_copy_only=False)
            a, b = url_hashes(urls)
            h1.append(a)
            h2.append(b)
            shard.append(np.full(len(urls), i, dtype=np.int32))
            shard_keys, width = self._keys(table, path)
            keys.append(shard_keys)
            self.key_width.append(width)
            status = table.column("status")
            success = pc.fill_null(pc.equal(status, SUCCESS), False)
            ok.append(success.to_numpy(zero_copy_only=False))
            message = pc.binary_join_element_wise(pc.fill_null(status, "null"), pc.fill_null(
                table.column("error_message"), "no error message"), ": ")
            errors.append(pc.if_else(success, pa.scalar(None, pa.string()), message))  # kept for failures only
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.empty(0, dt))  # noqa: E731
        h1, h2, ok = cat(h1, np.uint64), cat(h2, np.uint64), cat(ok, bool)
        shard, keys = cat(shard, np.int32), cat(keys, np.int64)
        # a URL given to img2dataset twice: its first successful copy wins, else its first failure
        order = np.lexsort((keys, shard, ~ok, h2, h1))
        self.h1, self.h2, self.shard, self.key, self.ok = h1[order], h2[order], shard[order], keys[order], ok[order]
        # "status: error_message" of failed rows (null for the others), in index order; Arrow strings
        self._errors = pa.chunked_array(errors, pa.string()).take(order)

    @staticmethod
    def _read(path: Path) -> pa.Table:
        try:
            table = pq.read_table(path, columns=list(SHARD_COLUMNS))
        except (OSError, pa.ArrowInvalid, KeyError) as err:
            raise SourceFormatError(f"{path}: not an img2dataset shard parquet with columns "
                                    f"{', '.join(SHARD_COLUMNS)}: {err}") from None
        for name in SHARD_COLUMNS:  # img2dataset writes text; an int key has lost its zero padding
            kind = table.schema.field(name).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
                raise SourceFormatError(f"{path}: column {name} should hold text (img2dataset writes strings), "
                                        f"got {kind}")
        return table

    @staticmethod
    def _keys(table: pa.Table, path: Path) -> tuple[np.ndarray, int]:
        """The shard's keys as int64 and their common width (the file names keep the zero padding)."""
        keys = table.column("key")
        if not len(keys):
            return np.empty(0, np.int64), 0
        digits = pc.fill_null(pc.match_substring_regex(keys, r"^\d+$"), False)
        widths = pc.min_max(pc.utf8_length(keys)).as_py()
        if not pc.all(digits).as_py() or widths["min"] != widths["max"]:
            bad = keys.filter(pc.invert(digits))[0] if not pc.all(digits).as_py() else widths
            raise SourceFormatError(f"{path}: column key should hold digit strings of one width "
                                    f"(img2dataset keys), got {bad}")
        return pc.cast(keys, pa.int64()).to_numpy(zero_copy_only=False), widths["max"]

    def __len__(self) -> int:
        return len(self.h1)

    def lookup(self, urls: list[str]) -> np.ndarray:
        """The index row of each URL (-1: in no finished shard), vectorised over the batch."""
        if not len(self) or not urls:
            return np.full(len(urls), -1, dtype=np.int64)
        a, b = url_hashes(urls)
        pos = np.minimum(np.searchsorted(self.h1, a), len(self) - 1)
        hit = (self.h1[pos] == a) & (self.h2[pos] == b)
        # equal h1 but not h2: another URL shares the first hash (~M**2/2**65); walk its run
        for i in np.flatnonzero(~hit & (self.h1[pos] == a)).tolist():
            j = int(pos[i])
            while j < len(self) and self.h1[j] == a[i] and self.h2[j] != b[i]:
                j += 1
            if j < len(self) and self.h1[j] == a[i]:
                pos[i], hit[i] = j, True
        return np.where(hit, pos, -1)

    def path(self, i: int) -> str:
        """The image file of index row ``i`` (``<root>/<shard>/<key>.jpg``, key zero-padded like img2dataset's)."""
        shard = int(self.shard[i])
        return f"{self.root}/{self.shards[shard].stem}/{int(self.key[i]):0{self.key_width[shard]}d}.{IMAGE_EXT}"

    def error(self, i: int) -> str:
        """``status: error_message`` of a failed index row."""
        return self._errors[i].as_py()


def resolve(items: Iterator[Row | Reject], root: Path, layout: str, *, ctx=None) -> Iterator[Row | Reject]:
    """Give each Row of ``items`` its ``image_path`` (and ``images``) under ``layout``; rows whose
    image img2dataset did not download become ``missing_image`` rejects. Order is kept."""
    root_text = str(root)
    if layout == "sha1":
        for item in items:
            if isinstance(item, Row):
                path = f"{root_text}/{item.values['image_id']}.jpg"
                item.values["image_path"], item.images = path, (path,)
            yield item
        return
    if layout != "img2dataset":
        raise ValueError(f"unknown image_layout {layout!r} (expected img2dataset or sha1)")
    index = ShardIndex(root)
    if not index.shards:
        log.warning("%s: no finished img2dataset shard (NNNNN.parquet + NNNNN_stats.json): every row will be "
                    "missing_image; run download@ or set image_layout: sha1", root)
    if ctx is not None:
        ctx.note("img2dataset_shards", len(index.shards))
    batch: list[Row | Reject] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH_ROWS:
            yield from _resolve_batch(batch, index)
            batch = []
    yield from _resolve_batch(batch, index)


def _resolve_batch(batch: list[Row | Reject], index: ShardIndex) -> Iterator[Row | Reject]:
    rows = [item for item in batch if isinstance(item, Row)]
    found = iter(index.lookup([r.values["url"] for r in rows]).tolist())
    ok = index.ok
    for item in batch:
        if isinstance(item, Row):
            i = next(found)
            if i < 0:
                yield Reject(MISSING_IMAGE, f"{item.values['url']}: in no finished img2dataset shard under "
                             f"{index.root} (not downloaded)", item.raw, item.source_file, item.locator)
                continue
            path = index.path(i)
            if not ok[i]:
                yield Reject(MISSING_IMAGE, f"{path}: not downloaded, img2dataset {index.error(i)}",
                             item.raw, item.source_file, item.locator)
                continue
            item.values["image_path"], item.images = path, (path,)
        yield item
