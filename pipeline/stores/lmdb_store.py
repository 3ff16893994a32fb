"""The LMDB store format: side-file names, the value codec and the atomic batched writer.

Values (docs/design.md §9) are msgpack maps compressed with lz4 (block format, size-prefixed) or
zstd. Arrays travel as ``{"data": raw bytes, "dtype": "float16", "shape": [n, D]}`` so dtypes survive exactly and a
reader rebuilds them with ``np.frombuffer`` (no parsing, no extra copy).

Writers (:class:`LmdbWriter`) insert keys in sorted order (MDB_APPEND), commit every
``commit_every`` records, double the map size on MDB_MAP_FULL (starting from a fixed size, so
the growth path and hence the bytes are a function of the inputs), then write a compacted copy
into a temporary directory that is renamed over the final path. The final directory holds only
``data.mdb`` plus side files; a killed build leaves nothing at the final path. The readers are
:mod:`pipeline.stores.readers`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import lmdb
import lz4.block
import msgpack
import numpy as np

IMG_DB_KIND = "image"
TXT_DB_KIND = "text"
META_FILE = "meta.json"
NBB_FILE = "nbb.json"
ID2LEN_FILE = "id2len.json"
TXT2IMG_FILE = "txt2img.json"
IMG2TXTS_FILE = "img2txts.json"
MAX_KEY_BYTES = 511  # LMDB's key size limit (its default build; lmdb.Environment.max_key_size())
INITIAL_MAP_SIZE = 64 << 20  # fixed start: the doubling path (and so the file bytes) depends only on the data

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


# --------------------------------------------------------------------------------------------
# value codec


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return {"data": arr.tobytes(), "dtype": arr.dtype.str, "shape": list(arr.shape)}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot store a value of type {type(obj).__name__} in an LMDB record")


_DTYPES: dict[str, np.dtype] = {}


def _unpack_hook(obj: dict) -> Any:
    # called for every msgpack map: keep it cheap (the read path's hot spot after lz4)
    if len(obj) == 3 and "shape" in obj and "data" in obj and "dtype" in obj:
        code = obj["dtype"]
        dtype = _DTYPES.get(code)
        if dtype is None:
            dtype = _DTYPES[code] = np.dtype(code)
        return np.frombuffer(obj["data"], dtype).reshape(obj["shape"])
    return obj


def _sorted_tree(obj: Any) -> Any:
    """Maps with sorted keys at every level, so equal records always pack to equal bytes."""
    if isinstance(obj, Mapping):
        return {k: _sorted_tree(obj[k]) for k in sorted(obj)}
    if isinstance(obj, (list, tuple)):
        return [_sorted_tree(v) for v in obj]
    return obj


def encode_value(record: Mapping[str, Any], compression: str = "lz4") -> bytes:
    """A record (str keys; values: numbers, strings, lists, dicts, numpy arrays) -> compressed bytes."""
    packed = msgpack.packb(_sorted_tree(record), default=_pack_default, use_bin_type=True)
    if compression == "lz4":
        # block format: ~1.6x faster to decompress than frames for values this size (bench/stores.py)
        return lz4.block.compress(packed, mode="default", store_size=True)
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(packed)
    raise ValueError(f"unknown compression {compression!r} (expected lz4 or zstd)")


_zstd_decompressor = None


def decode_value(buf: bytes | memoryview) -> dict[str, Any]:
    """Inverse of :func:`encode_value`.

    zstd values are recognised by their frame magic number; anything else is an lz4 block with
    its uncompressed size in the first 4 bytes (little endian; a size that large is impossible,
    so the two never collide). Arrays come back as read-only numpy views over the decompressed
    bytes, with the dtype and shape they were written with.
    """
    head = bytes(buf[:4])
    if head == _ZSTD_MAGIC:
        global _zstd_decompressor
        if _zstd_decompressor is None:
            import zstandard

            _zstd_decompressor = zstandard.ZstdDecompressor()
        raw = _zstd_decompressor.decompress(buf)
    else:
        try:
            raw = lz4.block.decompress(buf)
        except lz4.block.LZ4BlockError as err:
            raise ValueError(f"value is neither lz4 nor zstd compressed (starts with {head!r}): {err}") from None
    return msgpack.unpackb(raw, object_hook=_unpack_hook, raw=False)


# --------------------------------------------------------------------------------------------
# writer


class DiskFullError(OSError):
    """The filesystem an LMDB was being written to ran out of space (the message names the DB)."""


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


class LmdbWriter:
    """Write one LMDB into ``work_dir`` in sorted key order and finish with a compacted copy.

    ``name`` (default: ``work_dir``) names the DB in errors; running out of disk space raises
    :class:`DiskFullError` naming it. Callers ``abort()`` on any error, which removes the work dir.

    >>> with atomic_dir(final, stage="build_dbs") as tmp:
    ...     w = LmdbWriter(tmp / ".work", commit_every=1000)
    ...     for key, record in sorted_items: w.put(key, encode_value(record))
    ...     w.finish(tmp)            # tmp/data.mdb; work dir removed
    """

    def __init__(self, work_dir: Path, *, commit_every: int, map_size: int = INITIAL_MAP_SIZE,
                 name: str | None = None) -> None:
        if commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {commit_every}")
        self.work_dir = Path(work_dir)
        self.name = name or str(self.work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=False)
        self.commit_every = commit_every
        self._env = lmdb.open(str(self.work_dir), map_size=map_size, subdir=True, sync=False,
                              metasync=False, readahead=False, meminit=True, max_dbs=0)
        self._pending: list[tuple[bytes, bytes]] = []
        self._last_key: bytes | None = None
        self.count = 0
        self.commits = 0
        self.value_bytes = 0
        self.map_growths = 0

    def put(self, key: str | bytes, value: bytes) -> None:
        """Queue one record; keys must arrive in strictly increasing byte order."""
        kb = key.encode("utf-8") if isinstance(key, str) else key
        if self._last_key is not None and kb <= self._last_key:
            raise ValueError(f"keys must be unique and sorted: {kb!r} after {self._last_key!r} in {self.work_dir}")
        self._last_key = kb
        self._pending.append((kb, value))
        self.count += 1
        self.value_bytes += len(value)
        if len(self._pending) >= self.commit_every:
            self.commit()

    def commit(self) -> None:
        """Write the queued records in one transaction, growing the map while it is full."""
        if not self._pending:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    consumed, added = txn.cursor().putmulti(self._pending, append=True)
                if added != len(self._pending):
                    raise RuntimeError(f"LMDB accepted {added} of {len(self._pending)} records in {self.work_dir}")
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
                self.map_growths += 1
            except lmdb.Error as err:
                self._raise_if_no_space(err, self.work_dir, sum(len(k) + len(v) for k, v in self._pending))
                raise
        self._pending = []
        self.commits += 1

    def finish(self, out_dir: Path) -> Path:
        """Commit the rest, write the compacted ``out_dir/data.mdb``, remove the work dir."""
        self.commit()
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._env.copy(str(out_dir), compact=True)
        except lmdb.Error as err:
            used = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
            self._raise_if_no_space(err, out_dir, used, partial=out_dir / "data.mdb")
            raise
        self._env.close()
        shutil.rmtree(self.work_dir)
        return out_dir / "data.mdb"

    def abort(self) -> None:
        self._env.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _raise_if_no_space(self, err: lmdb.Error, target: Path, needed: int, partial: Path | None = None) -> None:
        """Raise DiskFullError from ``err`` when writing about ``needed`` bytes under ``target`` failed
        for lack of space (then remove the ``partial`` file, if given); return otherwise.

        LMDB reports ENOSPC as DiskError but a short write as a bare EIO error, so any other LMDB
        error counts as disk full when fewer than ``needed`` bytes are free.
        """
        usage = shutil.disk_usage(target)
        if not isinstance(err, lmdb.DiskError) and usage.free >= needed:
            return
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise DiskFullError(
            f"disk full while writing the LMDB {self.name}: {usage.free} bytes free on {_mount_point(target)}, "
            f"about {needed} more needed (LMDB: {err}); the partial DB is discarded"
        ) from err


def text_length(record: dict[str, Any]) -> int:
    """Tokens the text side of an example occupies (question + longest answer + longest rationale): its
    ``id2len`` value, as build_dbs and the UNITER-release import both write it."""
    n = len(record["input_ids"])
    for key in ("answer_choices", "choices"):
        if key in record:
            n += max((len(c) for c in record[key]), default=0)
    return n
