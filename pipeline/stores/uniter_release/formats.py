"""Reading one entry of UNITER's released LMDBs, without pickle.

**Image LMDB** ``img_db/<dir>/feat_th{conf_th}_max{max_bb}_min{min_bb}[_compressed]``: key = the
feature file's name (``coco_train2014_000000000009.npz``) plus one ``__keys__`` entry (a JSON list
of the names); value = an ``np.savez_compressed`` archive (the ``_compressed`` variant) or a msgpack
map whose arrays are msgpack-numpy maps (``{b"nd": True, b"type": dtype str, b"kind": b"",
b"shape": [...], b"data": raw bytes}``). Fields: ``features`` [n, D] (fp16), ``norm_bb`` [n, 6]
(x1, y1, x2, y2, w, h over the image size; the reference appends w*h on read), ``conf`` [n],
``soft_labels`` [n, C+1]. Beside the LMDB, ``nbb_th{conf_th}_max{max_bb}_min{min_bb}.json`` maps
each name to the number of regions to read (the first n rows).

**Text LMDB** ``txt_db/<name>.db``: key = example id; value = an lz4 *frame* holding a msgpack map
(``input_ids`` list of int, ``img_fname`` a name or a pair of names, task fields such as ``target``).

The reference loads archives with ``allow_pickle=True`` and msgpack-numpy unpickles object arrays,
so a downloaded file could run code. Here archives load with ``allow_pickle=False`` and an object
array in either encoding raises :class:`UnsafeEntryError` naming the file, the key and the field.
"""

from __future__ import annotations

import io
import zipfile
import zlib
from pathlib import Path
from typing import Any

import lz4.frame
import msgpack
import msgpack_numpy
import numpy as np

from pipeline.common.source_records import SourceFormatError, load_json

KEYS_ENTRY = "__keys__"  # the name list the release's converter adds to every image LMDB
IMAGE_FIELDS = ("features", "norm_bb", "conf", "soft_labels")
NORM_BB_COLUMNS = 6


class UnsafeEntryError(SourceFormatError):
    """An entry of the release holds an object array: reading it would unpickle data from the download."""


class EntryFormatError(ValueError):
    """One entry does not have the fields/shapes of the format (the importer skips it and counts why)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def release_json(path: Path, expected: str) -> dict:
    """A JSON object file of the release or beside it (nbb, meta.json, id2len.json, ans2label.json);
    a leading UTF-8 byte order mark is allowed. Raises SourceFormatError naming ``path`` and
    ``expected`` when it cannot be read (absent, a directory), is not UTF-8, not JSON (cut short) or
    not an object: a download cut short is named, not a traceback."""
    try:
        doc, clean = load_json(path)
    except OSError as err:
        raise SourceFormatError(f"{path}: cannot be read ({err.strerror or err}); expected {expected}") from None
    if not clean:
        raise SourceFormatError(f"{path}: not UTF-8 text; expected {expected}")
    if not isinstance(doc, dict):
        raise SourceFormatError(f"{path}: a JSON {type(doc).__name__}, expected {expected}")
    return doc


def feature_db_name(conf_th: float, max_bb: int, min_bb: int) -> str:
    """``feat_th0.2_max100_min10``: the release's name for one region-count rule (its converter's f-string)."""
    return f"feat_th{conf_th}_max{max_bb}_min{min_bb}"


def nbb_file_name(conf_th: float, max_bb: int, min_bb: int) -> str:
    return f"nbb_th{conf_th}_max{max_bb}_min{min_bb}.json"


def rule_num_bb(conf: np.ndarray, conf_th: float, max_bb: int, min_bb: int) -> int:
    """The release's region-count rule: boxes above ``conf_th``, at least ``min_bb``, at most ``max_bb``."""
    return int(min(max_bb, max(min_bb, int((np.asarray(conf) > conf_th).sum()))))


# --------------------------------------------------------------------------------------------
# image entries


def _where(db: Path, key: str) -> str:
    return f"{db}: entry {key!r}"


def _names_object(obj: dict) -> bool:
    """msgpack-numpy marks object arrays with kind 'O'; its older layout had no kind, only the dtype string."""
    if obj.get(b"kind") == b"O":
        return True
    dtype = obj.get(b"type")
    dtype = dtype.decode("ascii", "replace") if isinstance(dtype, bytes) else dtype
    return isinstance(dtype, str) and dtype.endswith("O")


def _unsafe(db: Path, key: str, what: str) -> UnsafeEntryError:
    return UnsafeEntryError(f"{_where(db, key)} holds {what}: decoding it would unpickle data from the release "
                            f"or read objects from raw bytes; expected numeric arrays")


def _decode_array(obj: dict, db: Path, key: str) -> Any:
    """A msgpack-numpy array map -> ndarray (a numpy scalar where ``nd`` is not True).

    msgpack-numpy's own decoder unpickles kind 'O', and builds a structured dtype with an object
    field straight from the raw bytes (pointers read from the download); both are refused here
    before any array exists. Whatever else does not decode is an ``unreadable`` entry.
    """
    if _names_object(obj):
        raise _unsafe(db, key, "an object array (msgpack-numpy kind 'O')")
    try:
        descr = obj[b"type"]
        if obj.get(b"kind") == b"V":  # a structured dtype: [(name, type, *shape), ...]
            descr = [tuple(msgpack_numpy.tostr(t) if isinstance(t, bytes) else t for t in d) for d in descr]
        dtype = msgpack_numpy._unpack_dtype(descr)
    except Exception as err:  # noqa: BLE001 - numpy's dtype parser raises many kinds on a forged description
        raise EntryFormatError("unreadable", f"{_where(db, key)}: an array's dtype {obj.get(b'type')!r} does not "
                                             f"decode ({type(err).__name__}: {str(err)[:200]})") from None
    if dtype.hasobject:
        raise _unsafe(db, key, f"an array of dtype {dtype} (it holds objects)")
    try:
        if obj[b"nd"] is True:
            return np.ndarray(buffer=obj[b"data"], dtype=dtype, shape=obj[b"shape"])
        return np.frombuffer(obj[b"data"], dtype=dtype)[0]
    except Exception as err:  # noqa: BLE001 - a forged shape, buffer or flag: numpy raises many kinds
        raise EntryFormatError("unreadable", f"{_where(db, key)}: an array of dtype {dtype} does not decode "
                                             f"({type(err).__name__}: {str(err)[:200]})") from None


def _msgpack_numpy_hook(db: Path, key: str):
    """object_hook: msgpack-numpy arrays -> ndarray (:func:`_decode_array`), other maps as they are."""

    def hook(obj: dict) -> Any:
        if b"nd" in obj:
            return _decode_array(obj, db, key)
        if b"complex" in obj:
            raise EntryFormatError("unreadable", f"{_where(db, key)} holds a complex number, expected arrays")
        return obj

    return hook


# what a damaged archive raises: numpy's format errors, zip's, zlib's (a corrupt member), a cut one
_ARCHIVE_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError)


def _load_archive(buf: bytes, db: Path, key: str) -> dict[str, np.ndarray]:
    try:
        archive = np.load(io.BytesIO(buf), allow_pickle=False)
    except _ARCHIVE_ERRORS as err:
        raise EntryFormatError("unreadable", f"{_where(db, key)} is not an .npz archive: {err}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise EntryFormatError("unreadable", f"{_where(db, key)} is a single array, expected an .npz archive")
    out = {}
    with archive:
        for name in archive.files:
            if name not in IMAGE_FIELDS:  # e.g. the 'allow_pickle' flag the converter stored as an array
                continue
            try:
                _check_member_size(archive, name, db, key)
                out[name] = archive[name]
            except EntryFormatError:
                raise
            except _ARCHIVE_ERRORS as err:
                if isinstance(err, ValueError) and "allow_pickle" in str(err):  # numpy: "Object arrays cannot be
                    # loaded when allow_pickle=False"
                    raise UnsafeEntryError(f"{_where(db, key)}: field {name!r} is an object array, which only "
                                           f"pickle can load ({err}); expected a numeric array") from None
                raise EntryFormatError("unreadable", f"{_where(db, key)}: field {name!r} does not load "
                                                     f"({type(err).__name__}: {err})") from None
    return out


def _check_member_size(archive: Any, name: str, db: Path, key: str) -> None:
    """Refuse a member whose header declares more bytes than the member holds: numpy allocates the
    declared array before it reads, so a forged shape would claim any amount of memory."""
    member = f"{name}.npy" if f"{name}.npy" in archive.zip.namelist() else name  # numpy lists both as name
    size = archive.zip.getinfo(member).file_size
    with archive.zip.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(fh)
    declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if declared > size:
        raise EntryFormatError("unreadable", f"{_where(db, key)}: field {name!r} declares shape {shape} of {dtype} "
                                             f"({declared} bytes) in a member of {size} bytes")


def decode_image_entry(buf: bytes | memoryview, *, compressed: bool, db: Path, key: str) -> dict[str, np.ndarray]:
    """One stored image value -> {field: array} for the fields of :data:`IMAGE_FIELDS` it has.

    Raises :class:`EntryFormatError` (``unreadable``; ``bad_shape`` for a field that is no array of
    numbers: a msgpack list, a string array)."""
    buf = bytes(buf)
    fields = _load_archive(buf, db, key) if compressed else \
        {k: v for k, v in _unpack_map(buf, db, key).items() if k in IMAGE_FIELDS}
    for name, arr in fields.items():
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "fiu":
            what = f"an array of dtype {arr.dtype}" if isinstance(arr, np.ndarray) else type(arr).__name__
            raise EntryFormatError("bad_shape", f"{_where(db, key)}: field {name!r} is {what}, expected an array "
                                                f"of numbers")
    return fields


def image_record(fields: dict[str, np.ndarray], nbb: int, *, db: Path, key: str) -> dict[str, Any]:
    """The release's fields, cut to ``nbb`` regions -> this project's image record (docs/design.md §9).

    Output: ``features`` f16 [n, D], ``norm_bb`` f16 [n, 7] (the area w*h appended, as the reference
    does on read), ``boxes`` f32 [n, 4] (the normalized corners: the release keeps no image size, so
    boxes are in a 1 x 1 image, ``image_h = image_w = 1``), ``conf`` f16 [n], ``soft_labels`` f16 [n, C+1].
    Raises :class:`EntryFormatError` (reason ``missing_field``, ``bad_shape`` or ``too_few_regions``).
    """
    missing = [f for f in IMAGE_FIELDS if f not in fields]
    if missing:
        raise EntryFormatError("missing_field",
                               f"{_where(db, key)} has no field(s) {missing}; expected {list(IMAGE_FIELDS)}")
    feat, bb = fields["features"], fields["norm_bb"]
    conf, soft = fields["conf"].reshape(-1), fields["soft_labels"]
    n = feat.shape[0] if feat.ndim == 2 else -1
    if feat.ndim != 2 or bb.ndim != 2 or bb.shape[1] < NORM_BB_COLUMNS or soft.ndim != 2 \
            or {bb.shape[0], conf.shape[0], soft.shape[0]} != {n} or not feat.shape[1] or soft.shape[1] < 2:
        raise EntryFormatError("bad_shape", f"{_where(db, key)}: features {feat.shape}, norm_bb {bb.shape}, conf "
                               f"{fields['conf'].shape}, soft_labels {soft.shape}; expected [n, D], [n, 6], [n], "
                               f"[n, C+1] (D >= 1, C >= 1)")
    if nbb < 1:
        raise EntryFormatError("too_few_regions", f"{_where(db, key)}: the region count is {nbb}, expected at least 1")
    if nbb > n:
        raise EntryFormatError("too_few_regions",
                               f"{_where(db, key)}: the nbb file says {nbb} regions, the entry has {n}")
    bb6 = bb[:nbb, :NORM_BB_COLUMNS].astype(np.float32)
    area = bb6[:, 4:5] * bb6[:, 5:6]
    return {"features": np.ascontiguousarray(feat[:nbb], dtype=np.float16),
            "norm_bb": np.concatenate([bb6, area], axis=1).astype(np.float16),
            "boxes": np.ascontiguousarray(bb6[:, :4], dtype=np.float32),
            "conf": np.ascontiguousarray(conf[:nbb], dtype=np.float16),
            "soft_labels": np.ascontiguousarray(soft[:nbb], dtype=np.float16),
            "image_h": 1, "image_w": 1}


# --------------------------------------------------------------------------------------------
# text entries


def decode_text_entry(buf: bytes | memoryview, *, db: Path, key: str) -> dict[str, Any]:
    """One stored text value (lz4 frame of a msgpack map) -> the map."""
    try:
        raw = lz4.frame.decompress(bytes(buf))
    except RuntimeError as err:  # python-lz4 raises RuntimeError for a corrupt frame
        raise EntryFormatError("unreadable", f"{_where(db, key)} is not an lz4 frame: {err}") from None
    return _unpack_map(raw, db, key)


def _unpack_map(raw: bytes, db: Path, key: str) -> dict:
    """A msgpack map (msgpack-numpy arrays decoded without pickle) or EntryFormatError("unreadable")."""
    try:
        obj = msgpack.unpackb(raw, raw=False, object_hook=_msgpack_numpy_hook(db, key), strict_map_key=False)
    except (EntryFormatError, UnsafeEntryError):  # the hook's, already naming DB and key
        raise
    except (ValueError, TypeError) as err:  # msgpack's format errors are ValueErrors
        raise EntryFormatError("unreadable", f"{_where(db, key)} is not a msgpack map: {err}") from None
    if not isinstance(obj, dict):
        raise EntryFormatError("unreadable", f"{_where(db, key)} is a msgpack {type(obj).__name__}, expected a map")
    return obj
