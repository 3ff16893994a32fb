"""Fuzzing every dataset reader through the real ingest core, over the real-format fixtures.

Hypothesis damages one row of a fixture file (a field or the whole row replaced by a value of
another type, an edge number, a lone surrogate, deep nesting, a 5,000-digit number, random bytes
in a line-based file) and ingests the dataset. The invariant: the run finishes, every input row
ends as a manifest row or a reject with a known reason, and the counts balance (the same number of
input rows as without the damage where the damage cannot change it). Never a traceback. The only
other accepted outcome is a :class:`SourceFormatError` naming the file, for damage that makes a
whole-document JSON file unparseable as a whole (nesting deeper than the JSON parser goes).

Budget: ``UNITER_FUZZ_EXAMPLES`` examples per reader (default 12, a few seconds each; e.g. 500
for a longer search: ``UNITER_FUZZ_EXAMPLES=500 pytest tests/pipeline/ingest/test_fuzz_readers.py``).
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.fuzz import fuzz_settings
from helpers.source_fixtures import FIXTURES, fixture_overrides
from pipeline.ingest.ingest import ingest_dataset
from pipeline.common.source_records import REASONS, SourceFormatError
from pipeline.params.parser import load_params

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.stage  # ingests datasets (not in `make test-unit`)


@dataclass(frozen=True)
class Raw:
    """A JSON token that Python's json cannot write (a 5,000-digit number, deep nesting, 1e400)."""

    text: str
    deep: bool = False  # only a whole-document parse can fail on it (SourceFormatError accepted)


RAW_TOKENS = [Raw("1" * 5000), Raw("-" + "9" * 4400), Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"),
              Raw("[" * 200_000 + "]" * 200_000, deep=True), Raw("[" * 500 + "]" * 500)]
EDGE_NUMBERS = [0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**400, 1e308, -0.0, 5e-324]
ODD_TEXT = ["", " ", "\ud800", "a\udfffb", "caf\udce9", "\x00", "\u202e", "x" * 5000, "1", "http://", "True"]


def nasty_values() -> st.SearchStrategy:
    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(EDGE_NUMBERS),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                       st.sampled_from(ODD_TEXT), st.sampled_from(RAW_TOKENS))
    return st.recursive(scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                        max_leaves=6)


def dumps(value: Any) -> str:
    """JSON text of ``value`` with :class:`Raw` tokens spliced in verbatim (NaN/Infinity as Python writes)."""
    raws: list[str] = []

    def swap(v: Any) -> Any:
        if isinstance(v, Raw):
            raws.append(v.text)
            return f"\x01RAW{len(raws) - 1}\x01"
        if isinstance(v, list):
            return [swap(x) for x in v]
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        return v

    text = json.dumps(swap(value))
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x01RAW{i}\x01"), raw)
    return text


def has_deep(value: Any) -> bool:
    if isinstance(value, Raw):
        return value.deep
    if isinstance(value, list):
        return any(has_deep(v) for v in value)
    if isinstance(value, dict):
        return any(has_deep(v) for v in value.values())
    return False


# ---------------------------------------------------------------------------------------------
# where each reader's rows are


@dataclass(frozen=True)
class Target:
    """A fixture file of ``dataset`` (params key ``sources.<dataset>.<key>``) and how to damage it.

    ``kind``: json (a document; ``rows`` is the key path to the list whose elements are damaged,
    ``"*"`` picks an element on the way), jsonl, lines (tsv / txt) or pickle (the RefCOCO refs).
    ``stable``: the damage cannot change the number of input rows (one element = one row)."""

    dataset: str
    key: str
    file: str
    kind: str
    rows: tuple = ()
    stable: bool = True


F = FIXTURES
TARGETS = {
    "coco": [Target("coco", "captions_train", "coco/captions_train2014.json", "json", ("annotations",)),
             Target("coco", "captions_train", "coco/captions_train2014.json", "json", ("images",)),
             Target("coco", "karpathy", "coco/dataset_coco.json", "json", ("images",))],
    "vg": [Target("vg", "region_descriptions", "vg/region_descriptions.json", "json", ("*", "regions")),
           Target("vg", "region_descriptions", "vg/region_descriptions.json", "json", (), stable=False),
           Target("vg", "image_data", "vg/image_data.json", "json", ())],
    "flickr30k": [Target("flickr30k", "karpathy", "flickr30k/dataset_flickr30k.json", "json",
                         ("images", "*", "sentences")),
                  Target("flickr30k", "karpathy", "flickr30k/dataset_flickr30k.json", "json", ("images",),
                         stable=False)],
    "vqa": [Target("vqa", "questions_train", "vqa/v2_OpenEnded_mscoco_train2014_questions.json", "json",
                   ("questions",)),
            Target("vqa", "annotations_train", "vqa/v2_mscoco_train2014_annotations.json", "json",
                   ("annotations",))],
    "nlvr2": [Target("nlvr2", "train", "nlvr2/train.json", "jsonl")],
    "snli_ve": [Target("snli_ve", "train", "snli_ve/snli_ve_train.jsonl", "jsonl")],
    "vcr": [Target("vcr", "train", "vcr/train.jsonl", "jsonl"),
            Target("vcr", "test_labels", "", "labels")],
    "cc": [Target("cc", "train_tsv", "cc/Train_GCC-training.tsv", "lines")],
    "sbu": [Target("sbu", "captions", "sbu/SBU_captioned_photo_dataset_captions.txt", "lines"),
            Target("sbu", "urls", "sbu/SBU_captioned_photo_dataset_urls.txt", "lines")],
    "refcoco": [Target("refcoco", "refs", "refcoco/refs.json", "pickle", ("*", "sentences"), stable=False),
                Target("refcoco", "refs", "refcoco/refs.json", "pickle", (), stable=False),  # a ref: many rows
                Target("refcoco", "instances", "refcoco/instances.json", "json", ("annotations",))],
}


def _pick(doc: Any, path: tuple, draw) -> tuple[Any, list | None]:
    """Follow ``path`` (keys; ``"*"``: an element drawn) to a list; (list, None) or (None, None)."""
    node = doc
    for step in path:
        if step == "*":
            if not isinstance(node, list) or not node:
                return None, None
            node = node[draw(st.integers(0, len(node) - 1))]
        elif isinstance(node, dict) and step in node:
            node = node[step]
        else:
            return None, None
    return (node, None) if isinstance(node, list) and node else (None, None)


def damage_element(rows: list, draw) -> Any:
    """Replace one element of ``rows``, or one field of it, or drop one of its keys; returns the
    value put in (for :func:`has_deep`)."""
    i = draw(st.integers(0, len(rows) - 1))
    value = draw(nasty_values())
    row = rows[i]
    how = draw(st.sampled_from(["field", "field", "drop", "row"]))
    if how != "row" and isinstance(row, dict) and row:
        key = draw(st.sampled_from(sorted(row)))
        if how == "drop":
            del row[key]
            return None
        row[key] = value
        return value
    rows[i] = value
    return value


def write_damaged(target: Target, tmp: Path, draw, params_sets: list[str]) -> tuple[Path, bool]:
    """Write the damaged copy of the target's file; returns (path, deep) where ``deep``: the damage
    holds nesting only a whole-document parse can fail on."""
    if target.kind == "labels":  # VCR's leaderboard labels: one line per test question
        lines = [json.dumps({"annot_id": json.loads(l)["annot_id"], "answer_label": 0, "rationale_label": 1})
                 for l in (F / "vcr" / "test.jsonl").read_text().splitlines() if l.strip()]
        target = Target("vcr", "test_labels", "", "jsonl")
        src_text = "\n".join(lines) + "\n"
    else:
        src_text = (F / target.file).read_text(encoding="utf-8", errors="surrogateescape")
    out = tmp / "damaged" / (Path(target.file).name or "test_labels.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    deep = False
    if target.kind in ("json", "pickle"):
        doc = json.loads(src_text)
        rows, _ = _pick(doc, target.rows, draw)
        if rows is not None:
            value = damage_element(rows, draw)
            deep = has_deep(value)
        if target.kind == "pickle":
            out.write_bytes(pickle.dumps(_python(doc), protocol=2))
        else:
            out.write_bytes(dumps(doc).encode("utf-8", errors="surrogatepass"))
    elif target.kind == "jsonl":
        lines = src_text.splitlines()
        i = draw(st.integers(0, len(lines) - 1))
        try:
            parsed = json.loads(lines[i])
        except ValueError:  # a line the fixture itself breaks on purpose
            parsed = None
        if parsed is not None and draw(st.booleans()):
            holder = [parsed]
            damage_element(holder, draw)
            new = dumps(holder[0]).encode("utf-8", errors="surrogatepass")
        else:
            new = draw(st.one_of(st.binary(max_size=40), st.sampled_from([b"[1, 2]", b"null", b"{}", b"\"x\"",
                                                                           ("[" * 200_000).encode(),
                                                                           ("1" * 5000).encode()])))
        data = [l.encode("utf-8", errors="surrogateescape") for l in lines]
        data[i] = new.replace(b"\n", b" ").replace(b"\r", b" ")
        out.write_bytes(b"\n".join(data) + b"\n")
    else:  # tsv / txt lines
        lines = src_text.encode("utf-8", errors="surrogateescape").split(b"\n")
        i = draw(st.integers(0, max(0, len(lines) - 2)))
        lines[i] = draw(st.binary(max_size=60)).replace(b"\n", b" ").replace(b"\r", b" ")
        out.write_bytes(b"\n".join(lines))
    params_sets.append(f"sources.{target.dataset}.{target.key}={out}")
    return out, deep


def _python(value: Any) -> Any:
    """A JSON-ish value as plain Python for pickling (Raw tokens as the numbers or text they spell)."""
    if isinstance(value, Raw):
        return int(value.text[:300]) if value.text.lstrip("-").isdigit() else value.text[:300]
    if isinstance(value, list):
        return [_python(v) for v in value]
    if isinstance(value, dict):
        return {k: _python(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------
# the invariant


_BASE: dict[str, int] = {}


def _ingest(tmp: Path, dataset: str, sets: list[str]):
    params = load_params(REPO / "params.yaml", [*fixture_overrides(tmp), "world=real", *sets])
    return ingest_dataset(params, dataset, progress=False)


def baseline_rows(tmp_path_factory, dataset: str) -> int:
    if dataset not in _BASE:
        _BASE[dataset] = _ingest(tmp_path_factory.mktemp(f"base_{dataset}"), dataset, []).rows_in
    return _BASE[dataset]


@pytest.mark.parametrize("dataset", sorted(TARGETS))
def test_every_damaged_row_ends_as_a_row_or_a_reject(dataset, tmp_path_factory):
    expected_rows = baseline_rows(tmp_path_factory, dataset)

    # the default budget reports a failing example as found (no shrinking: each step is an ingest)
    @fuzz_settings()
    @given(data=st.data())
    def check(data):
        tmp = tmp_path_factory.mktemp(dataset)
        target = data.draw(st.sampled_from(TARGETS[dataset]))
        sets: list[str] = []
        path, deep = write_damaged(target, tmp, data.draw, sets)
        try:
            result = _ingest(tmp, dataset, sets)
        except SourceFormatError as err:
            assert deep and target.kind == "json", f"{path}: refused as a whole: {err}"
            assert str(path) in str(err)
            return
        assert result.rows_in == result.manifest_rows + result.rejected
        if target.stable:
            assert result.rows_in == expected_rows, (target, result.rows_in, expected_rows)
        rejects = pq.read_table(result.rejects_path).to_pylist()
        assert len(rejects) == result.rejected
        for reject in rejects:
            assert reject["reason"] in REASONS and reject["detail"], reject
        assert pq.read_table(result.manifest_path).num_rows == result.manifest_rows

    check()


# ---------------------------------------------------------------------------------------------
# the rows that used to abort a whole ingest (traceback, no manifest), each now one reject


def _doc_case(tmp: Path, file: str, edit) -> Path:
    doc = json.loads((F / file).read_text(encoding="utf-8", errors="surrogateescape"))
    edit(doc)
    out = tmp / "damaged" / Path(file).name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(dumps(doc).encode("utf-8", errors="surrogatepass"))
    return out


def _line_case(tmp: Path, file: str, line: int, text: str) -> Path:
    lines = (F / file).read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    lines[line - 1] = text
    out = tmp / "damaged" / Path(file).name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
    return out


def _set(path: tuple, value: Any):
    def edit(doc):
        node = doc
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
    return edit


BAD_ROWS = {
    "a lone surrogate in a caption": ("coco", "captions_train", lambda t: _doc_case(
        t, "coco/captions_train2014.json", _set(("annotations", 0, "caption"), "A red \ud800 circle.")),
        "annotations[0]", "non_utf8"),
    "a 5,000-digit number as an id": ("coco", "captions_train", lambda t: _doc_case(
        t, "coco/captions_train2014.json", _set(("annotations", 0, "id"), Raw("1" * 5000))),
        "annotations[0]", "malformed_row"),
    "200k-deep nesting in a JSON line": ("snli_ve", "train", lambda t: _line_case(
        t, "snli_ve/snli_ve_train.jsonl", 1, '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"),
        "line 1", "malformed_row"),
    "a list where an id belongs": ("vg", "region_descriptions", lambda t: _doc_case(
        t, "vg/region_descriptions.json", _set((0, "regions", 0, "image_id"), [1])),
        "[0].regions[0]", "malformed_row"),
    "10**400 as a box value": ("vg", "region_descriptions", lambda t: _doc_case(
        t, "vg/region_descriptions.json", _set((0, "regions", 0, "x"), 10**400)),
        "[0].regions[0]", "malformed_row"),
    "1e400 as a box value": ("vg", "region_descriptions", lambda t: _doc_case(
        t, "vg/region_descriptions.json", _set((0, "regions", 0, "width"), Raw("1e400"))),
        "[0].regions[0]", "malformed_row"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_row_that_aborted_a_whole_ingest_is_one_reject(case, tmp_path, tmp_path_factory):
    dataset, key, write, locator, reason = BAD_ROWS[case]
    path = write(tmp_path)
    result = _ingest(tmp_path, dataset, [f"sources.{dataset}.{key}={path}"])
    assert result.rows_in == baseline_rows(tmp_path_factory, dataset)
    rejects = pq.read_table(result.rejects_path).to_pylist()
    mine = [r for r in rejects if r["source_file"] == str(path) and r["locator"] == locator]
    assert [r["reason"] for r in mine] == [reason], mine


def test_an_img2dataset_shard_with_an_int_key_column_is_named(tmp_path):
    """A shard table whose key column lost its text type (and zero padding): one line naming file and column."""
    import pyarrow as pa

    from pipeline.ingest.sources.web_images import ShardIndex

    pq.write_table(pa.table({"url": ["http://a.example/1.jpg"], "key": pa.array([7], pa.int64()),
                             "status": ["success"], "error_message": pa.array([None], pa.string())}),
                   tmp_path / "00000.parquet")
    (tmp_path / "00000_stats.json").write_text("{}")
    with pytest.raises(SourceFormatError, match=r"00000.parquet: column key should hold text .*got int64"):
        ShardIndex(tmp_path)
