"""LMDB stores: value codec round trips, batched writer (map growth, sorted keys), readers, atomicity."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import pickle

import numpy as np
import pytest

from pipeline.common.ownership import OWNER_FILE, atomic_dir
from helpers.stores import write_lmdb
from pipeline.stores.lmdb_store import LmdbWriter, decode_value, encode_value
from pipeline.stores.readers import LmdbReader


def sample_record(rng: np.random.Generator, n: int) -> dict:
    return {
        "features": rng.standard_normal((n, 32)).astype(np.float16),
        "boxes": rng.uniform(0, 500, (n, 4)).astype(np.float32),
        "ids": rng.integers(0, 30522, 17).astype(np.int32),
        "big": rng.integers(-(2**40), 2**40, 3).astype(np.int64),
        "empty": np.zeros((0, 4), np.float32),
        "choices": [np.arange(3, dtype=np.int32), np.arange(5, dtype=np.int32)],
        "image_ids": ["coco/1", "coco/2"],
        "label": -1,
        "score": 0.3,
        "nested": {"b": 1, "a": [1, 2, 3]},
    }


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_codec_round_trip_preserves_values_dtypes_and_shapes(compression):
    rec = sample_record(np.random.default_rng(0), 9)
    out = decode_value(encode_value(rec, compression))
    assert sorted(out) == sorted(rec)
    for key in ("features", "boxes", "ids", "big", "empty"):
        assert out[key].dtype == rec[key].dtype and out[key].shape == rec[key].shape
        np.testing.assert_array_equal(out[key], rec[key])
    assert [c.tolist() for c in out["choices"]] == [[0, 1, 2], [0, 1, 2, 3, 4]]
    assert out["image_ids"] == rec["image_ids"] and out["label"] == -1 and out["score"] == 0.3
    assert out["nested"] == {"a": [1, 2, 3], "b": 1}


def test_codec_is_deterministic_and_compresses_and_rejects_garbage():
    rec = {"z": np.zeros((100, 64), np.float16), "a": 1}
    same_keys_other_order = {"a": 1, "z": np.zeros((100, 64), np.float16)}
    assert encode_value(rec) == encode_value(same_keys_other_order)
    assert len(encode_value(rec)) < 100 * 64 * 2 / 10  # zeros compress
    assert encode_value(rec, "zstd")[:4] != encode_value(rec, "lz4")[:4]
    with pytest.raises(ValueError, match="neither lz4 nor zstd"):
        decode_value(b"\x00\x01\x02\x03rest")
    with pytest.raises(ValueError, match="unknown compression"):
        encode_value(rec, "gzip")
    with pytest.raises(TypeError, match="cannot store"):
        encode_value({"x": object()})


def _items(n: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(f"{i:06d}", encode_value({"x": rng.standard_normal(size).astype(np.float32)})) for i in range(n)]


def test_writer_grows_map_on_full_and_reader_returns_every_value(tmp_path):
    items = _items(60, 20_000)  # ~80 KB each, 4.8 MB in all: far over the 256 KiB start
    with atomic_dir(tmp_path / "db", stage="test") as tmp:
        writer = LmdbWriter(tmp / ".work", commit_every=7, map_size=256 << 10)
        for k, v in items:
            writer.put(k, v)
        writer.finish(tmp)
    assert writer.map_growths >= 4 and writer.commits == 9 and writer.count == 60
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == [OWNER_FILE, "data.mdb"]
    reader = LmdbReader(tmp_path / "db")
    assert len(reader) == 60 and list(reader.keys()) == [k for k, _ in items]
    for k, v in items[::7]:
        np.testing.assert_array_equal(reader[k]["x"], decode_value(v)["x"])
        assert bytes(reader.get_raw(k)) == v


def test_writer_refuses_unsorted_or_duplicate_keys(tmp_path):
    writer = LmdbWriter(tmp_path / "w", commit_every=10)
    writer.put("b", b"x")
    with pytest.raises(ValueError, match="sorted"):
        writer.put("a", b"x")
    with pytest.raises(ValueError, match="sorted"):
        writer.put("b", b"x")
    writer.abort()
    assert not (tmp_path / "w").exists()


def test_missing_key_error_names_db_and_key(tmp_path):
    write_lmdb(tmp_path / "db", _items(3, 4), commit_every=2)
    reader = LmdbReader(tmp_path / "db")
    with pytest.raises(KeyError, match=r"'nope'.*" + str(tmp_path / "db")):
        reader["nope"]
    assert "000001" in reader and "nope" not in reader
    with pytest.raises(FileNotFoundError, match="data.mdb"):
        LmdbReader(tmp_path)


def test_same_items_give_byte_identical_files(tmp_path):
    items = _items(200, 3000, seed=3)
    digests = []
    for name in ("a", "b"):
        write_lmdb(tmp_path / name, items, commit_every=16)
        digests.append(hashlib.sha256((tmp_path / name / "data.mdb").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def _read_in_child(reader: LmdbReader, key: str, queue) -> None:
    queue.put(float(reader[key]["x"][0]))


def test_reader_reopens_after_fork_and_pickles_without_its_handle(tmp_path):
    items = _items(5, 8)
    write_lmdb(tmp_path / "db", items, commit_every=2)
    reader = LmdbReader(tmp_path / "db")
    expected = float(reader["000003"]["x"][0])  # opened in the parent first
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_read_in_child, args=(reader, "000003", queue))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0 and queue.get(timeout=5) == expected
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._txn is None and float(clone["000003"]["x"][0]) == expected


def test_failure_midway_leaves_nothing_at_the_final_path(tmp_path):
    items = _items(50, 100)

    def failing():
        for i, item in enumerate(items):
            if i == 35:  # 3 commits of 10 are already in the work LMDB
                raise RuntimeError("injected failure")
            yield item

    with pytest.raises(RuntimeError, match="injected"):
        with atomic_dir(tmp_path / "db", stage="test") as tmp:
            write_lmdb(tmp, failing(), commit_every=10)
    assert list(tmp_path.iterdir()) == []
    with atomic_dir(tmp_path / "db", stage="test") as tmp:
        writer = write_lmdb(tmp, items, commit_every=10)
    assert writer.count == 50 and len(LmdbReader(tmp_path / "db")) == 50


def test_parent_keeps_reading_after_a_child_reopened(tmp_path):
    write_lmdb(tmp_path / "db", _items(5, 8), commit_every=2)
    reader = LmdbReader(tmp_path / "db")
    before = float(reader["000002"]["x"][0])
    ctx = mp.get_context("fork")
    for _ in range(2):
        queue = ctx.Queue()
        proc = ctx.Process(target=_read_in_child, args=(reader, "000002", queue))
        proc.start()
        proc.join(30)
        assert proc.exitcode == 0 and queue.get(timeout=5) == before
    assert float(reader["000002"]["x"][0]) == before and len(reader) == 5
