"""LMDB image and text stores: the value codec, an atomic batched writer, and lazy readers.

Values (docs/design.md §9) are msgpack maps compressed with lz4 (block format, size-prefixed) or
zstd. Arrays travel as ``{"data": raw bytes, "dtype": "float16", "shape": [n, D]}`` so dtypes survive exactly and a
reader rebuilds them with ``np.frombuffer`` (no parsing, no extra copy).

Writers (:class:`LmdbWriter`) insert keys in sorted order (MDB_APPEND), commit every
``commit_every`` records, double the map size on MDB_MAP_FULL (starting from a fixed size, so
the growth path and hence the bytes are a function of the inputs), then write a compacted copy
into a temporary directory that is renamed over the final path. The final directory holds only
``data.mdb`` plus side files; a killed build leaves nothing at the final path.

Readers (:class:`LmdbReader`, :class:`ImageDb`, :class:`TextDb`) open read-only with
``lock=False, readahead=False`` on first use in each process (a DataLoader worker re-opens after
fork), read with ``buffers=True`` so the compressed value is never copied out of the map, and
raise a KeyError naming the DB and the key.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

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


# --------------------------------------------------------------------------------------------
# readers


# (st_dev, st_ino) of an open data.mdb -> (pid, env, read txn). LMDB allows one handle per file and
# process, so readers of the same file share it; keying on the inode (not the path) means a DB
# rebuilt at the same path is a new file and gets a new handle.
_OPEN: dict[tuple[int, int], tuple[int, lmdb.Environment, lmdb.Transaction]] = {}


def _shared_txn(path: Path) -> lmdb.Transaction:
    st = os.stat(path / "data.mdb")
    key, pid = (st.st_dev, st.st_ino), os.getpid()
    entry = _OPEN.get(key)
    if entry is not None and entry[0] == pid:
        return entry[2]
    if entry is not None:
        # inherited across fork: close this process's copy (lock=False: no locks to release, the
        # parent's mapping is untouched) before opening a handle of our own
        entry[1].close()
    env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, meminit=False, subdir=True,
                    max_readers=1)
    txn = env.begin(buffers=True)
    _OPEN[key] = (pid, env, txn)
    return txn


class LmdbReader:
    """Lazy read-only access to one LMDB directory; safe to pickle into DataLoader workers.

    Nothing is opened until the first read; each process (a forked or spawned DataLoader
    worker) opens its own handle on first use.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not (self.path / "data.mdb").is_file():
            raise FileNotFoundError(f"no LMDB at {self.path} (missing data.mdb)")
        self._txn: lmdb.Transaction | None = None
        self._pid: int | None = None

    def _begin(self) -> lmdb.Transaction:
        if self._txn is None or self._pid != os.getpid():
            self._txn = _shared_txn(self.path)
            self._pid = os.getpid()
        return self._txn

    def get_raw(self, key: str) -> memoryview:
        """The stored (compressed) bytes of ``key``: a view into the map, no copy."""
        buf = self._begin().get(key.encode("utf-8"))
        if buf is None:
            raise KeyError(f"key {key!r} not found in LMDB {self.path}")
        return buf

    def get(self, key: str) -> dict[str, Any]:
        return decode_value(self.get_raw(key))

    __getitem__ = get

    def __contains__(self, key: str) -> bool:
        return self._begin().get(key.encode("utf-8")) is not None

    def keys(self) -> Iterator[str]:
        """All keys in sorted (byte) order."""
        cursor = self._begin().cursor()
        for key in cursor.iternext(keys=True, values=False):
            yield bytes(key).decode("utf-8")

    def __len__(self) -> int:
        return self._begin().stat()["entries"]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_txn": None, "_pid": None}


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


class ImageDb:
    """Region features of one image source (``data/db/img/<name>/``).

    ``db[image_id]`` -> dict with ``features`` f16 [n, D], ``boxes`` f32 [n, 4], ``norm_bb`` f16
    [n, 7], ``conf`` f16 [n], ``soft_labels`` f16 [n, C+1], ``image_h``, ``image_w``.
    ``nbb`` (image_id -> n), ``feature_dim`` and ``num_classes`` come from the side files, so
    samplers never open the LMDB itself.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.meta = read_json(self.path / META_FILE)
        if self.meta.get("kind") != IMG_DB_KIND:
            raise ValueError(f"{self.path} is not an image DB (meta.json kind={self.meta.get('kind')!r})")
        self.name = self.meta["name"]
        self.nbb: dict[str, int] = read_json(self.path / NBB_FILE)
        self.feature_dim = int(self.meta["feature_dim"])
        self.num_classes = int(self.meta["num_classes"])
        self._lmdb = LmdbReader(self.path)

    def __getitem__(self, image_id: str) -> dict[str, Any]:
        try:
            return self._lmdb.get(image_id)
        except KeyError:
            raise KeyError(f"image {image_id!r} not in image DB {self.name!r} ({self.path})") from None

    def __contains__(self, image_id: str) -> bool:
        return image_id in self.nbb

    def __len__(self) -> int:
        return len(self.nbb)


class ImageDbGroup:
    """Resolve qualified image ids ``"<img_db>/<image_id>"`` (as stored in text DBs) to records."""

    def __init__(self, root: Path | str, names: Iterable[str]) -> None:
        self.root = Path(root)
        self.dbs = {name: ImageDb(self.root / name) for name in sorted(set(names))}
        dims = {db.feature_dim for db in self.dbs.values()}
        if len(dims) > 1:
            raise ValueError(f"image DBs under {self.root} disagree on feature_dim: {sorted(dims)}")
        self.feature_dim = dims.pop() if dims else 0
        self.num_classes = max((db.num_classes for db in self.dbs.values()), default=0)

    def _split(self, qualified_id: str) -> tuple[ImageDb, str]:
        name, sep, image_id = qualified_id.partition("/")
        if not sep or name not in self.dbs:
            raise KeyError(f"image id {qualified_id!r} does not name one of the open image DBs {sorted(self.dbs)}")
        return self.dbs[name], image_id

    def __getitem__(self, qualified_id: str) -> dict[str, Any]:
        db, image_id = self._split(qualified_id)
        return db[image_id]

    def num_regions(self, qualified_id: str) -> int:
        db, image_id = self._split(qualified_id)
        try:
            return db.nbb[image_id]
        except KeyError:
            raise KeyError(f"image {image_id!r} not in image DB {db.name!r} ({db.path})") from None


class TextDb:
    """One text DB split (``data/db/txt/<name>/``): tokenized examples plus side files.

    ``db[example_id]`` -> dict with ``input_ids`` i32 [L] (no [CLS]/[SEP]), ``image_ids`` (list
    of ``"<img_db>/<image_id>"``) and the task's targets. ``ids`` is the sorted list of example
    ids, ``id2len`` their token counts, ``meta`` the tokenizer and task description.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.meta = read_json(self.path / META_FILE)
        if self.meta.get("kind") != TXT_DB_KIND:
            raise ValueError(f"{self.path} is not a text DB (meta.json kind={self.meta.get('kind')!r})")
        self.name = self.meta["name"]
        self.id2len: dict[str, int] = read_json(self.path / ID2LEN_FILE)
        self.txt2img: dict[str, list[str]] = read_json(self.path / TXT2IMG_FILE)
        self.ids = sorted(self.id2len)
        self._lmdb = LmdbReader(self.path)

    @property
    def img_db_names(self) -> list[str]:
        return list(self.meta["img_db"])

    def __getitem__(self, example_id: str) -> dict[str, Any]:
        try:
            return self._lmdb.get(example_id)
        except KeyError:
            raise KeyError(f"example {example_id!r} not in text DB {self.name!r} ({self.path})") from None

    def __len__(self) -> int:
        return len(self.ids)


def open_db(path: Path | str) -> ImageDb | TextDb:
    """Open an image or text DB, whichever ``meta.json`` says it is."""
    kind = read_json(Path(path) / META_FILE).get("kind")
    if kind == IMG_DB_KIND:
        return ImageDb(path)
    if kind == TXT_DB_KIND:
        return TextDb(path)
    raise ValueError(f"{path}/meta.json: unknown DB kind {kind!r}")
