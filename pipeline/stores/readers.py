"""Lazy readers of the LMDB stores (format: :mod:`pipeline.stores.lmdb_store`).

Readers (:class:`LmdbReader`, :class:`ImageDb`, :class:`TextDb`, :class:`ImageDbGroup`) open
read-only with ``lock=False, readahead=False`` on first use in each process (a DataLoader worker
re-opens after fork), read with ``buffers=True`` so the compressed value is never copied out of the
map, and raise a KeyError naming the DB and the key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import lmdb

from pipeline.stores.lmdb_store import (ID2LEN_FILE, IMG_DB_KIND, META_FILE, NBB_FILE, TXT2IMG_FILE, TXT_DB_KIND,
                                        decode_value)



class DamagedStoreError(ValueError):
    """A store's ``data.mdb`` is truncated or one of its values cannot be decoded (names DB and key)."""


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
    env = _open_checked(path, st.st_size)
    txn = env.begin(buffers=True)
    _OPEN[key] = (pid, env, txn)
    return txn


def _open_checked(path: Path, size: int) -> lmdb.Environment:
    """Open ``path`` read-only after checking that ``data.mdb`` holds every page its header counts:
    reading a page past the end of a truncated file is a SIGBUS (the process dies without a word)."""
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, meminit=False, subdir=True,
                        max_readers=1)
    except lmdb.Error as err:
        raise DamagedStoreError(f"LMDB {path}: data.mdb ({size} bytes) cannot be opened ({err}); rebuild the DB") \
            from None
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < need:
        env.close()
        raise DamagedStoreError(f"LMDB {path}: data.mdb has {size} bytes, its header counts {need}: the file is "
                                "truncated; rebuild the DB")
    return env


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
        """The decoded value of ``key``; DamagedStoreError naming DB and key when it cannot be decoded."""
        raw = self.get_raw(key)
        try:
            value = decode_value(raw)
        except Exception as err:  # noqa: BLE001 - stored bytes are untrusted: any decode failure means damage
            raise DamagedStoreError(f"LMDB {self.path}: the value of key {key!r} is damaged ({type(err).__name__}: "
                                    f"{str(err)[:200]}); rebuild the DB") from None
        if not isinstance(value, dict):
            raise DamagedStoreError(f"LMDB {self.path}: the value of key {key!r} is a {type(value).__name__}, "
                                    "expected a map; rebuild the DB")
        return value

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
