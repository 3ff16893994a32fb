"""Fuzzing the readers of UNITER's released LMDBs through the real importer (import_uniter_db).

Each example writes a small release in the release's own formats (tests/helpers/uniter_release.py):
a COCO image DB of ``np.savez_compressed`` archives with its nbb file, a Flickr30k image DB of
msgpack-numpy maps without one, and three lz4-framed msgpack text DBs (pretraining, VQA, VE). Then
it damages one entry: a field replaced by an array of another dtype or shape, by a plain msgpack
value (a list, a map, an edge number, odd text) or by a forged msgpack-numpy map; a field dropped;
or the whole value replaced by random bytes, cut short, or with one byte flipped (inside the zip, the
lz4 frame, the msgpack).

The invariant: the import finishes, and every entry of every release DB ends converted or skipped
with a reason naming its DB (the counts balance), and what was written reads back; or the import
refuses as a whole with a :class:`SourceFormatError` (exit 2) whose one line names the DB and the
key. Never any other exception.

Budget: ``UNITER_FUZZ_EXAMPLES`` examples per target (default 12, as the dataset readers' fuzz test;
e.g. ``UNITER_FUZZ_EXAMPLES=500 pytest tests/pipeline/stores/test_fuzz_uniter_release.py``).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import lz4.frame
import msgpack
import msgpack_numpy
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.fuzz import fuzz_settings
from helpers.dbs_synthetic import params_for
from helpers.uniter_release import C1, D, coco, msgpack_value, npz_value, regions, write_img_db, write_txt_db
from pipeline.common.failures import BAD_INPUT, describe
from pipeline.common.source_records import SourceFormatError
from pipeline.stores.import_uniter_db import run
from pipeline.stores.readers import ImageDb, TextDb
from pipeline.stores.tokenization import WordPieceTokenizer
from pipeline.stores.uniter_release.formats import IMAGE_FIELDS, UnsafeEntryError

N = 3  # entries per release DB
REASONS = {"unreadable", "missing_field", "bad_shape", "too_few_regions", "not_in_nbb", "unmapped_name",
           "duplicate_image", "missing_record", "bad_field", "missing_image", "bad_key"}

pytestmark = pytest.mark.stage  # runs the importer (not in `make test-unit`)

COCO = [coco("val2014", i) for i in range(1, N + 1)]
FLICKR = [f"flickr30k_{1000 + i:012d}.npz" for i in range(1, N + 1)]
# release DB -> (this project's DB, kind): what each damaged entry is counted in
RELEASE_DBS = {"img_db/coco_val2014": ("coco", "img"), "img_db/flickr30k": ("flickr30k", "img"),
               "txt_db/pretrain_coco_val.db": ("pretrain_indomain_val", "txt"),
               "txt_db/vqa_devval.db": ("vqa_val", "txt"), "txt_db/ve_dev.db": ("snli_ve_dev", "txt")}
TEXT_FIELDS = ("input_ids", "img_fname", "target", "question_id")


# ---------------------------------------------------------------------------------------------
# the release, clean


def clean_release(rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    """release DB -> {key: value before encoding} (image fields, or a text DB's msgpack maps)."""
    ids = [2000 + i for i in range(6)]
    return {
        "img_db/coco_val2014": {k: regions(rng, 10) for k in COCO},
        "img_db/flickr30k": {k: regions(rng, 12, above=11) for k in FLICKR},
        "txt_db/pretrain_coco_val.db": {str(i): {"input_ids": ids, "img_fname": k} for i, k in enumerate(COCO)},
        "txt_db/vqa_devval.db": {str(100 + i): {"input_ids": ids[:4], "img_fname": k, "question_id": 100 + i,
                                               "target": {"labels": [i % 3, 0], "scores": [1.0, 0.3]}}
                                 for i, k in enumerate(COCO)},
        "txt_db/ve_dev.db": {f"p{i}": {"input_ids": ids[:3], "img_fname": k,
                                       "target": {"labels": [i % 3], "scores": [1.0]}} for i, k in enumerate(FLICKR)},
    }


def write_release(root: Path, entries: dict[str, dict[str, Any]], raw: dict[str, dict[str, bytes]],
                  tok: WordPieceTokenizer) -> None:
    """Write the release; ``raw`` (release DB -> {key: bytes}) replaces encoded values as they are."""
    write_img_db(root, "coco_val2014", entries["img_db/coco_val2014"], compressed=True,
                 nbb={k: 10 for k in COCO}, raw=raw.get("img_db/coco_val2014"))
    write_img_db(root, "flickr30k", entries["img_db/flickr30k"], compressed=False, nbb=None,
                 raw=raw.get("img_db/flickr30k"))
    for db in ("pretrain_coco_val", "vqa_devval", "ve_dev"):
        name = f"txt_db/{db}.db"
        examples = entries[name]
        write_txt_db(root, db, {k: v for k, v in examples.items() if k not in raw.get(name, {})}, tok,
                     raw=raw.get(name))
    (root / "ans2label.json").write_text(json.dumps({"yes": 0, "no": 1, "two": 2}))


# ---------------------------------------------------------------------------------------------
# the damage


EDGE_INTS = [0, -1, 1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**64 - 1, 30522, 10**6]
EDGE_FLOATS = [float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 5e-324]
ODD_TEXT = ["", " ", "\x00", "\u202e", "x" * 5000, "1", "coco_val2014_000000000001.npz", "ok.npz"]
# text field values near the right shape: an id beyond int64, a bool for an int, a target's lists of the wrong kind
TEXT_SPECIALS = [[2**64 - 1], [True, 2000], [-1], [], ["2000"], [[2000]], [2000.0], [None], ["a.npz", "b.npz"],
                 {"labels": ["x"], "scores": [1.0]}, {"labels": 5, "scores": 5}, {"labels": [0], "scores": ["1"]},
                 {"labels": [2**64 - 1], "scores": [1.0]}, {"labels": [0], "scores": [1e308]}, {"labels": [0]}, 1, True]


def msgpack_values() -> st.SearchStrategy:
    """Values msgpack can hold, at their edges (ints within its 64 bits)."""
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.sampled_from(EDGE_INTS),
                       st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(EDGE_FLOATS),
                       st.text(max_size=8), st.sampled_from(ODD_TEXT), st.binary(max_size=16))
    return st.recursive(scalar, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(
            ["labels", "scores", "nd", "type", "shape", "data"])), inner, max_size=4)), max_leaves=8)


DTYPES = ["float16", "float32", "float64", "int8", "int64", "uint64", "bool", "complex64", "<U3", "S2", "V4",
          "datetime64[s]"]


@st.composite
def odd_arrays(draw) -> np.ndarray:
    """A numeric-looking array of another dtype or shape (sizes around the 10 regions, D = 8)."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    dims = draw(st.lists(st.sampled_from([0, 1, 6, 9, 10, 11, D, 64]), max_size=3))
    fill = draw(st.sampled_from(["zeros", "ones", "edge"]))
    arr = np.zeros(dims, dtype=dtype) if fill == "zeros" else np.ones(dims, dtype=dtype)
    if fill == "edge" and arr.size and dtype.kind in "fc":
        arr.flat[:] = draw(st.sampled_from(EDGE_FLOATS))
    elif fill == "edge" and arr.size and dtype.kind in "iu":
        arr.flat[:] = np.iinfo(dtype).max
    return arr


@st.composite
def forged_nd_maps(draw) -> dict:
    """A msgpack-numpy array map with fields of the wrong kind (what decoding trusts)."""
    return {b"nd": draw(st.sampled_from([True, False, 1, None])),
            b"type": draw(st.sampled_from(["<f2", "<f4", "|O", "O", "<U3", "garbage", "", 5, b"<f4",
                                           [["a", "<f4"]], [["a", "|O"]], [["a"]]])),
            b"kind": draw(st.sampled_from([b"", b"V", b"O", b"x", None])),
            b"shape": draw(st.sampled_from([[10, D], [10], [-1], [2**40, 2**40], "x", [], None, [10, D, 0]])),
            b"data": draw(st.one_of(st.binary(max_size=200), st.sampled_from([b"\0" * 160, b"\0" * 320, 7, None])))}


def damage_bytes(value: bytes, draw) -> bytes:
    """The whole stored value replaced by random bytes, cut short, or with one byte flipped."""
    how = draw(st.sampled_from(["random", "cut", "flip", "empty"]))
    if how == "random":
        return draw(st.binary(max_size=300))
    if how == "empty" or not value:
        return b""
    at = draw(st.integers(0, len(value) - 1))
    if how == "cut":
        return value[:at]
    return value[:at] + bytes([value[at] ^ draw(st.integers(1, 255))]) + value[at + 1:]


def damage(entries: dict[str, dict[str, Any]], draw) -> tuple[str, str, dict[str, dict[str, bytes]]]:
    """Damage one entry of one release DB in place (or as raw bytes); returns (release DB, key, raw)."""
    db = draw(st.sampled_from(sorted(RELEASE_DBS)))
    key = draw(st.sampled_from(sorted(entries[db])))
    record = entries[db][key]
    image, npz = db.startswith("img_db/"), db == "img_db/coco_val2014"
    ways = ["field", "drop", "bytes"] + (["plain", "forged"] if image and not npz else []) + \
        (["text_frame"] if not image else [])
    how = draw(st.sampled_from(ways))
    if how == "bytes":
        value = (npz_value(record) if npz else msgpack_value(record)) if image else \
            lz4.frame.compress(msgpack.packb(record, use_bin_type=True))
        return db, key, {db: {key: damage_bytes(value, draw)}}
    if how == "text_frame":  # a valid lz4 frame around damaged msgpack
        packed = draw(st.one_of(st.binary(max_size=60).map(lambda b: b),
                                msgpack_values().map(lambda v: msgpack.packb(v, use_bin_type=True)),
                                st.just(msgpack.packb(record, use_bin_type=True)[:-1])))
        return db, key, {db: {key: lz4.frame.compress(packed)}}
    fields = IMAGE_FIELDS if image else TEXT_FIELDS
    field = draw(st.sampled_from(fields + ("extra",)))
    if how == "drop":
        record.pop(field, None)
    elif how == "forged":
        return db, key, {db: {key: msgpack.packb({**{k: msgpack_numpy.encode(v) for k, v in record.items()},
                                                  field: draw(forged_nd_maps())}, use_bin_type=True)}}
    elif image and how == "field":
        record[field] = draw(odd_arrays())
    elif image:
        record[field] = draw(msgpack_values())
    else:
        record[field] = draw(st.one_of(st.sampled_from(TEXT_SPECIALS), msgpack_values()))
    return db, key, {}


# ---------------------------------------------------------------------------------------------
# the invariant


def check_report(report: dict[str, Any], data: Path, root: Path) -> None:
    """Every entry converted or skipped with a reason naming its DB; what was written reads back."""
    for release_db, (name, kind) in RELEASE_DBS.items():
        entry = report["image_dbs" if kind == "img" else "text_dbs"][name]
        done = entry.get("images" if kind == "img" else "examples", 0)
        skipped = entry.get("skipped", {})
        assert done + sum(skipped.values()) == N, (release_db, entry)
        assert set(skipped) <= REASONS, skipped
        for samples in entry.get("skipped_samples", {}).values():
            assert all(str(root / release_db) in s for s in samples), samples
        if entry["written"]:
            db = ImageDb(data / "db" / "img" / name) if kind == "img" else TextDb(data / "db" / "txt" / name)
            ids = list(db.nbb) if kind == "img" else list(db.ids)
            assert len(ids) == done
            for i in ids:
                db[i]


@pytest.fixture(scope="module")
def tok():
    return WordPieceTokenizer()


def test_every_damaged_entry_is_converted_or_skipped_or_refused_by_name(tmp_path_factory, tok):
    # the default budget reports a failing example as found (no shrinking: each step is an import)
    @fuzz_settings()
    @given(data=st.data())
    def check(data):
        tmp = tmp_path_factory.mktemp("release")
        entries = clean_release(np.random.default_rng(0))
        db, key, raw = damage(entries, data.draw)
        root, out = tmp / "release", tmp / "data"
        write_release(root, entries, raw, tok)
        params = params_for(out, f"build_dbs.uniter_release.root={root}", "build_dbs.source=uniter_release",
                            f"build_dbs.uniter_release.ans2label={root / 'ans2label.json'}")
        try:
            report = run(params)
        except SourceFormatError as err:
            status, line = describe(err)
            assert status == BAD_INPUT and "\n" not in line
            assert str(root / db) in line and repr(key) in line, line
            return
        check_report(report, out, root)

    check()


def test_the_clean_release_imports_every_entry(tmp_path, tok):
    """The fuzz test's baseline: undamaged, every entry of every release DB converts."""
    root = tmp_path / "release"
    write_release(root, clean_release(np.random.default_rng(0)), {}, tok)
    report = run(params_for(tmp_path / "data", f"build_dbs.uniter_release.root={root}",
                            f"build_dbs.uniter_release.ans2label={root / 'ans2label.json'}"))
    check_report(report, tmp_path / "data", root)
    for name, kind in RELEASE_DBS.values():
        entry = report["image_dbs" if kind == "img" else "text_dbs"][name]
        assert entry["written"] and not entry.get("skipped"), (name, entry)



# ---------------------------------------------------------------------------------------------
# what the fuzzing found (or aimed at), each now a skipped entry or a refusal naming DB and key


def _one_damaged(tmp_path: Path, tok: WordPieceTokenizer, db: str, key: str, *, field: str | None = None,
                 value: Any = None, raw: bytes | None = None) -> dict[str, Any]:
    """Import the clean release with one entry damaged; returns that DB's report entry."""
    entries = clean_release(np.random.default_rng(0))
    if field is not None:
        entries[db][key][field] = value
    root, data = tmp_path / "release", tmp_path / "data"
    write_release(root, entries, {db: {key: raw}} if raw is not None else {}, tok)
    report = run(params_for(data, f"build_dbs.uniter_release.root={root}",
                            f"build_dbs.uniter_release.ans2label={root / 'ans2label.json'}"))
    check_report(report, data, root)
    name, kind = RELEASE_DBS[db]
    return report["image_dbs" if kind == "img" else "text_dbs"][name]


def _npy_with_header(shape: tuple[int, ...]) -> bytes:
    """An .npy member whose header declares ``shape`` (float16) but holds 20 bytes of data."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f2", "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 20


def _npz_with(fields: dict[str, np.ndarray], member: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **{k: v for k, v in fields.items() if k != member})
    with zipfile.ZipFile(buf, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{member}.npy", data)
    return buf.getvalue()


@pytest.mark.parametrize("case", ["empty", "crc", "huge_header", "no_npy_suffix"])
def test_a_damaged_archive_is_a_skipped_entry(tmp_path, tok, case):
    """An empty value (numpy: EOFError), a member whose bytes were changed (zip: CRC error) and a
    member declaring 10^12 regions (numpy would allocate them first), and one not in .npy format are
    unreadable entries."""
    key = COCO[0]
    fields = clean_release(np.random.default_rng(0))["img_db/coco_val2014"][key]
    if case == "empty":
        raw = b""
    elif case == "crc":
        good = npz_value(fields)
        with zipfile.ZipFile(io.BytesIO(good)) as zf:
            info = zf.getinfo("features.npy")
        local = info.header_offset  # the member's local header: name and extra field lengths at 26 and 28
        start = local + 30 + int.from_bytes(good[local + 26:local + 28], "little") + \
            int.from_bytes(good[local + 28:local + 30], "little")
        at = start + info.compress_size // 2  # inside the member's compressed bytes
        raw = good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1:]
    elif case == "huge_header":
        raw = _npz_with(fields, "conf", _npy_with_header((10**12,)))
    else:  # a member named without .npy: numpy lists it under its name and reads it as bytes
        buf = io.BytesIO()
        np.savez_compressed(buf, **{k: v for k, v in fields.items() if k != "conf"})
        with zipfile.ZipFile(buf, "a") as zf:
            zf.writestr("conf", b"\0" * 20)
        raw = buf.getvalue()
    entry = _one_damaged(tmp_path, tok, "img_db/coco_val2014", key, raw=raw)
    assert entry["skipped"] == {"unreadable": 1}, entry


@pytest.mark.parametrize("value", [[0.5] * 12, {"a": 1}, "features", 7])
def test_a_plain_msgpack_value_for_an_array_is_a_skipped_entry(tmp_path, tok, value):
    entry = _one_damaged(tmp_path, tok, "img_db/flickr30k", FLICKR[1], field="conf", value=value)
    assert entry["skipped"] == {"bad_shape": 1}, entry


def test_a_structured_dtype_holding_objects_is_refused_before_any_array_exists(tmp_path, tok):
    """msgpack-numpy builds a kind 'V' array with an object field straight from the raw bytes: object
    pointers read from the download. Refused as unsafe, naming DB and key."""
    key = FLICKR[0]
    fields = clean_release(np.random.default_rng(0))["img_db/flickr30k"][key]
    forged = {b"nd": True, b"kind": b"V", b"type": [["a", "|O"]], b"shape": [2], b"data": b"\0" * 16}
    raw = msgpack.packb({**{k: msgpack_numpy.encode(v) for k, v in fields.items()}, "conf": forged},
                        use_bin_type=True)
    with pytest.raises(UnsafeEntryError, match=rf"img_db/flickr30k/.*entry {key!r} holds an array of dtype"):
        _one_damaged(tmp_path, tok, "img_db/flickr30k", key, raw=raw)


@pytest.mark.parametrize("db, field, value", [
    ("txt_db/pretrain_coco_val.db", "input_ids", [2**64 - 1]),
    ("txt_db/pretrain_coco_val.db", "input_ids", [True, 2000]),
    ("txt_db/vqa_devval.db", "target", {"labels": ["x"], "scores": [1.0]}),
    ("txt_db/vqa_devval.db", "target", {"labels": 5, "scores": 5}),
    ("txt_db/ve_dev.db", "target", {"labels": [0], "scores": ["1"]}),
])
def test_a_text_field_of_the_wrong_kind_is_a_skipped_entry(tmp_path, tok, db, field, value):
    key = sorted(clean_release(np.random.default_rng(0))[db])[0]
    entry = _one_damaged(tmp_path, tok, db, key, field=field, value=value)
    assert entry["skipped"] == {"bad_field": 1}, entry


@pytest.mark.parametrize("db, key", [("img_db/coco_val2014", COCO[0]), ("img_db/flickr30k", FLICKR[0])])
@pytest.mark.parametrize("field, width", [("features", D + 4), ("soft_labels", 3)])
def test_a_first_entry_of_another_width_costs_that_entry_only(tmp_path, tok, db, key, field, width):
    """The DB's (D, C+1) was the first converted entry's: a damaged first entry made every good one a
    ``bad_shape`` skip (counts balanced, the DB held one image). It is the most common in a sample."""
    fields = clean_release(np.random.default_rng(0))[db][key]
    value = np.ones((fields[field].shape[0], width), dtype=fields[field].dtype)
    entry = _one_damaged(tmp_path, tok, db, key, field=field, value=value)
    assert entry["skipped"] == {"bad_shape": 1} and entry["images"] == N - 1, entry
    assert repr(key) in entry["skipped_samples"]["bad_shape"][0]
    name = RELEASE_DBS[db][0]
    written = ImageDb(tmp_path / "data" / "db" / "img" / name)
    assert (written.feature_dim, written.num_classes) == (D, C1)
