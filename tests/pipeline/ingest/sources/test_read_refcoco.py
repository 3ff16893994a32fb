"""RefCOCO+ reader: fixture rows, Python 2 pickles, and refusal of pickles that would run code."""

from __future__ import annotations

import collections
import json
import os
import pickle
import struct

import pyarrow.parquet as pq
import pytest

from pipeline.ingest.ingest import ingest_dataset
from pipeline.common.plain_pickle import UnsafePickleError, load_plain_pickle
from pipeline.params.parser import load_params
from helpers.source_fixtures import FIXTURES, REPO, fates, fixture_overrides, ingest


def test_refcoco(fixture_params):
    result, manifest, rejects = ingest(fixture_params, "refcoco")
    f = "refs(unc).p"
    assert fates(rejects) == [
        (f, "[0].sentences[1]", "missing_caption"),
        (f, "[0].sentences[2]", "missing_field"),  # no sent
        (f, "[1].sentences[1]", "duplicate_id"),  # sent_id 0 again
        (f, "[2]", "missing_field"),  # ref without ann_id
        (f, "[3].sentences[0]", "missing_field"),  # ann_id not in instances.json
        (f, "[4].sentences[0]", "unreadable_image"),
        (f, "[5].sentences[0]", "bad_label"),  # split 'trainval'
        (f, "[6].sentences[0]", "text_too_long"),
        (f, "[7].sentences[0]", "missing_image"),
        (f, "[8]", "malformed_row"),  # sentences not a list
        (f, "[9].sentences[0]", "malformed_row"),  # bbox is a string
    ]
    table = pq.read_table(result.manifest_path)
    assert table["example_id"].to_pylist() == ["refcoco:0", "refcoco:3"]
    assert table["split"].to_pylist() == ["train", "testA"]
    assert table["bbox"].to_pylist() == [[1.0, 2.0, 10.0, 20.0], [30.5, 4.25, 8.0, 8.0]]
    assert table["ref_id"].to_pylist() == [0, 1] and table["ann_id"].to_pylist() == [100, 101]
    assert table["category_id"].to_pylist() == [1, 2] and table["text"].to_pylist()[1] == "blue square"
    assert manifest.image_path[0].endswith("coco/train2014/COCO_train2014_000000000001.jpg")
    assert (result.rows_in, result.manifest_rows, result.rejected) == (13, 2, 11)


def py2_pickle(obj) -> bytes:
    """Protocol-2 pickle as Python 2's cPickle writes plain data: ``bytes`` become py2 ``str``
    (SHORT_BINSTRING/BINSTRING), ``str`` becomes ``unicode`` (BINUNICODE). Written independently of
    Python 3's pickler, which cannot emit py2 strings."""
    out = bytearray(b"\x80\x02")

    def emit(value):
        if value is None:
            out.extend(b"N")
        elif isinstance(value, bool):
            out.extend(b"\x88" if value else b"\x89")
        elif isinstance(value, int):
            out.extend(b"J" + struct.pack("<i", value))
        elif isinstance(value, float):
            out.extend(b"G" + struct.pack(">d", value))
        elif isinstance(value, bytes):
            out.extend((b"U" + bytes([len(value)])) if len(value) < 256 else (b"T" + struct.pack("<I", len(value))))
            out.extend(value)
        elif isinstance(value, str):
            data = value.encode("utf-8")
            out.extend(b"X" + struct.pack("<I", len(data)) + data)
        elif isinstance(value, list):
            out.extend(b"](")
            for item in value:
                emit(item)
            out.extend(b"e")
        elif isinstance(value, dict):
            out.extend(b"}(")
            for key, item in value.items():
                emit(key)
                emit(item)
            out.extend(b"u")
        else:
            raise TypeError(type(value))

    emit(obj)
    return bytes(out + b".")


def _as_py2_str(obj):
    """Every text in ``obj`` as bytes (a Python 2 ``str``), like the original refs files."""
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, list):
        return [_as_py2_str(v) for v in obj]
    if isinstance(obj, dict):
        return {_as_py2_str(k): _as_py2_str(v) for k, v in obj.items()}
    return obj


def test_python2_pickle_with_latin1_bytes(tmp_path):
    refs = json.loads((FIXTURES / "refcoco" / "refs.json").read_text())
    refs = _as_py2_str(refs)
    refs[0][b"sentences"].append({b"sent_id": 11, b"sent": b"a caf\xe9 table", b"raw": b"x", b"tokens": []})
    path = tmp_path / "py2refs.p"
    path.write_bytes(py2_pickle(refs))
    loaded = load_plain_pickle(path)
    assert loaded[0]["sentences"][0]["sent"] == "left red circle"  # py2 str decoded to text
    params = load_params(REPO / "params.yaml", fixture_overrides(tmp_path) + [f"sources.refcoco.refs={path}"])
    result = ingest_dataset(params, "refcoco", progress=False)
    rejects = pq.read_table(result.rejects_path).to_pandas()
    assert rejects.reason.tolist().count("non_utf8") == 1
    bad = rejects[rejects.reason == "non_utf8"].iloc[0]
    assert bad.locator == "[0].sentences[3]" and "caf\\xe9" in bad.raw_row
    assert (result.rows_in, result.manifest_rows) == (14, 2)


class _RunsCommand:
    """Pickles to a REDUCE that calls os.system (what a malicious refs file would do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps([{"ref_id": 1, "payload": _RunsCommand(f"touch {marker}")}], protocol=protocol))
    with pytest.raises(UnsafePickleError) as info:
        load_plain_pickle(path)
    message = str(info.value)
    assert str(path) in message and "system" in message and "refusing" in message
    assert not marker.exists()


def test_ingest_refuses_malicious_refs_and_writes_nothing(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.p"
    evil.write_bytes(pickle.dumps(_RunsCommand(f"touch {marker}"), protocol=2))
    params = load_params(REPO / "params.yaml", fixture_overrides(tmp_path) + [f"sources.refcoco.refs={evil}"])
    with pytest.raises(UnsafePickleError, match="evil.p"):
        ingest_dataset(params, "refcoco", progress=False)
    assert not marker.exists()
    out = tmp_path / "data" / "manifests"
    assert list(out.iterdir()) == []  # temporary parquet files removed, nothing at the final paths


@pytest.mark.parametrize("obj", [collections.OrderedDict(a=1), {"x": complex(1, 2)}, [range(3)], {1, 2}])
def test_any_class_is_refused_even_harmless(tmp_path, obj):
    path = tmp_path / "x.p"
    path.write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(UnsafePickleError):
        load_plain_pickle(path)


def test_plain_containers_load(tmp_path):
    obj = [{"a": [1, 2.5, None, True], "b": ("t", 3)}, "s", -7]
    path = tmp_path / "ok.p"
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
        assert load_plain_pickle(path) == obj


def test_truncated_pickle_is_a_clear_error(tmp_path):
    path = tmp_path / "cut.p"
    path.write_bytes(pickle.dumps([{"a": 1}] * 10, protocol=2)[:20])
    with pytest.raises(ValueError, match="cut.p: not a readable pickle"):
        load_plain_pickle(path)
