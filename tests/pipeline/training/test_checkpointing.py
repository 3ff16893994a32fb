"""``db_fingerprint``: what identifies a store directory in a run's ``fingerprint.json``."""

from __future__ import annotations

import hashlib
import json

from pipeline.training.checkpointing import db_fingerprint


def store(path, *, meta: dict, run: dict | None, mdb_bytes: int | None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps(meta))
    if run is not None:
        (path / "_run.json").write_text(json.dumps(run))
    if mdb_bytes is not None:
        (path / "data.mdb").write_bytes(b"\0" * mdb_bytes)
    return path


def test_fingerprint_by_hand(tmp_path):
    db = store(tmp_path / "db", meta={"name": "x", "kind": "txt"}, run={"wall_time_s": 3.5, "n": 2}, mdb_bytes=7)
    expected = hashlib.sha256(b'{"kind": "txt", "name": "x"}' + b'{"n": 2}' + b"7").hexdigest()
    assert db_fingerprint(db) == expected
    only_meta = store(tmp_path / "bare", meta={"a": 1}, run=None, mdb_bytes=None)
    assert db_fingerprint(only_meta) == hashlib.sha256(b'{"a": 1}' + b"-1").hexdigest()


def test_wall_time_is_ignored_and_content_is_not(tmp_path):
    base = db_fingerprint(store(tmp_path / "a", meta={"m": 1}, run={"wall_time_s": 1.0, "n": 2}, mdb_bytes=10))
    assert db_fingerprint(store(tmp_path / "b", meta={"m": 1}, run={"wall_time_s": 9.0, "n": 2}, mdb_bytes=10)) == base
    assert db_fingerprint(store(tmp_path / "c", meta={"m": 1}, run={"wall_time_s": 1.0, "n": 3}, mdb_bytes=10)) != base
    assert db_fingerprint(store(tmp_path / "d", meta={"m": 2}, run={"wall_time_s": 1.0, "n": 2}, mdb_bytes=10)) != base
    assert db_fingerprint(store(tmp_path / "e", meta={"m": 1}, run={"wall_time_s": 1.0, "n": 2}, mdb_bytes=11)) != base
