"""The ingest stage: dedupe, streamed parquet writes, determinism, run records, bounded memory, and
the whole mini world (every planted defect rejected with its reason, nothing else rejected)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.disk_full import fill_disk_at
from helpers.source_fixtures import fixture_overrides
from pipeline.ingest.ingest import SeenKeys, ingest_dataset, run
from pipeline.ingest.manifest import REJECT_SCHEMA, ParquetStreamWriter, manifest_schema
from pipeline.params.ingest import DATASETS
from pipeline.params.parser import load_params, to_dict

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)


def test_seen_keys_matches_a_python_set():
    rng = np.random.default_rng(0)
    seen, reference = SeenKeys(), set()
    seen.first_seen(np.array([5, 5], dtype=np.uint64))
    reference.add(5)
    for size in [0, 1, 7, 300, 50, 1000, 3, 2000]:
        keys = rng.integers(0, 3000, size=size).astype(np.uint64)  # many repeats within and across batches
        expected = []
        for k in keys.tolist():
            expected.append(k not in reference)
            reference.add(k)
        assert seen.first_seen(keys).tolist() == expected
    assert len(seen) == len(reference)
    assert not seen.first_seen(np.array([5, 5], dtype=np.uint64)).any()  # a batch of nothing new
    big = np.array([2**64 - 1, 2**63, 0], dtype=np.uint64)
    assert seen.first_seen(big).tolist() == [True, True, 0 not in reference]


def test_stream_writer_row_groups_and_atomic_commit(tmp_path):
    path = tmp_path / "m.parquet"
    schema = manifest_schema([pa.field("n", pa.int64())])
    row = {"example_id": "x", "dataset": "d", "split": "train", "image_source": "s", "image_id": "i",
           "image_path": "p", "url": None, "text": "t"}
    with ParquetStreamWriter(path, schema, chunk_rows=4) as writer:
        for n in range(10):
            writer.append(row | {"example_id": f"x{n}", "n": n})
        assert not path.exists()  # nothing at the final path until commit
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 2]
    assert pq.read_table(path)["n"].to_pylist() == list(range(10))
    with pytest.raises(RuntimeError):
        with ParquetStreamWriter(path, schema, chunk_rows=4) as writer:
            writer.append(row | {"example_id": "new", "n": 1})
            raise RuntimeError("killed")
    assert pq.read_table(path).num_rows == 10  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.parquet"]  # no temporary left
    with pytest.raises(ValueError, match="'text' must not be null"):
        with ParquetStreamWriter(tmp_path / "bad.parquet", schema, chunk_rows=4) as writer:
            writer.append(row | {"text": None, "n": 0})


@pytest.fixture
def params(tmp_path):
    return load_params(REPO / "params.yaml", fixture_overrides(tmp_path) + ["world=real"])


def test_outputs_are_deterministic_and_independent_of_chunking(tmp_path, params):
    first = {ds: ingest_dataset(params, ds, progress=False) for ds in ("cc", "coco", "vcr")}
    other = dataclasses.replace(params, paths=dataclasses.replace(params.paths, data=tmp_path / "again"),
                                ingest=dataclasses.replace(params.ingest, chunk_rows=3))
    same = dataclasses.replace(params, paths=dataclasses.replace(params.paths, data=tmp_path / "same"))
    for ds, result in first.items():
        again = ingest_dataset(same, ds, progress=False)
        assert again.manifest_path.read_bytes() == result.manifest_path.read_bytes()
        assert again.rejects_path.read_bytes() == result.rejects_path.read_bytes()
        chunked = ingest_dataset(other, ds, progress=False)
        assert pq.read_table(chunked.manifest_path).equals(pq.read_table(result.manifest_path))
        assert pq.read_table(chunked.rejects_path).equals(pq.read_table(result.rejects_path))
        assert pq.read_schema(result.rejects_path).equals(REJECT_SCHEMA)


def test_stage_runs_all_datasets_with_run_records_and_summaries(params, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline.ingest.ingest"):
        results = run(params)
    assert [r.dataset for r in results] == list(DATASETS)
    out = Path(params.paths.data) / "manifests"
    for r in results:
        rec = json.loads((out / f"{r.dataset}._run.json").read_text())
        counts = rec["counts"]
        assert counts["rows_in"] == counts["manifest_rows"] + counts["rejects"] == r.rows_in
        assert sum(counts["rejects_by_reason"].values()) == counts["rejects"]
        assert pq.read_metadata(out / f"{r.dataset}.parquet").num_rows == counts["manifest_rows"]
        assert pq.read_metadata(out / f"{r.dataset}.rejects.parquet").num_rows == counts["rejects"]
        assert rec["stage"] == f"ingest@{r.dataset}" and all(rec["input_digests"].values())
    lines = [m for m in caplog.messages if m.startswith("ingest ")]
    assert lines[0] == ("ingest coco: 21 rows -> 4 manifest, 17 rejects (missing_field 4, unreadable_image 3, "
                        "malformed_row 2, missing_caption 2, bad_label 1, bad_url 1, duplicate_id 1, "
                        "missing_image 1, non_utf8 1, text_too_long 1)")
    assert len(lines) == len(DATASETS)


def test_check_images_off_keeps_rows_with_broken_images(params):
    off = dataclasses.replace(params, ingest=dataclasses.replace(params.ingest, check_images=False))
    result = ingest_dataset(off, "cc", progress=False)
    assert "unreadable_image" not in result.rejects and "missing_image" not in result.rejects
    assert result.manifest_rows == 4 + 3  # + truncated, empty and missing downloads


def test_unknown_dataset_is_named(params):
    with pytest.raises(ValueError, match="unknown dataset 'coco2'"):
        run(params, "coco2")


def _write_cc_tsv(path: Path, rows: int) -> None:
    with path.open("wb") as fh:
        for i in range(rows):
            fh.write(b"caption number %d of a web image\thttp://img%d.example.com/p/%d.jpg\n" % (i, i % 97, i))


def _peak_bytes(params, rows: int, tmp: Path) -> int:
    tsv = tmp / f"cc_{rows}.tsv"
    _write_cc_tsv(tsv, rows)
    sources = dataclasses.replace(params.sources, cc=dataclasses.replace(params.sources.cc, train_tsv=tsv))
    p = dataclasses.replace(params, sources=sources,
                            ingest=dataclasses.replace(params.ingest, check_images=False, chunk_rows=1000))
    tracemalloc.start()
    try:
        result = ingest_dataset(p, "cc", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.manifest_rows == rows + 2  # + the val file's good lines
    return peak


def test_cc_memory_does_not_grow_with_the_file(params, tmp_path):
    """4x the rows must not need (nearly) 4x the memory: rows are streamed in chunks."""
    small, large = _peak_bytes(params, 4_000, tmp_path), _peak_bytes(params, 16_000, tmp_path)
    # only the id set grows (8 bytes per row): allow that plus 25% noise; holding the rows would
    # take ~1 KB each (4x the small run's peak)
    assert large < 1.25 * small + 8 * 16_000, (small, large)


# ---------------------------------------------------------------------------------------------
# the mini world


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A small mini world generated into a temp dir, and params whose sources point at it."""
    from pipeline.mini_world import generate

    base = load_params(REPO / "params.yaml")
    root = tmp_path_factory.mktemp("mini")
    world_dir = root / "raw"
    cfg = dataclasses.replace(base.mini_world, out_dir=world_dir, image_size=64, n_coco=40, n_vg_only=15,
                              n_flickr30k=30, n_cc=30, n_sbu=30, n_vcr=20, n_nlvr2_pairs=20,
                              captions_per_image=2, n_planted_each=2)
    generate(cfg, base.seed, world_dir, base.eval_splits(), progress=False)
    default_root = str(base.mini_world.out_dir)
    overrides = [f"sources.{ds}.{key}={str(value).replace(default_root, str(world_dir), 1)}"
                 for ds, section in to_dict(base.sources).items() for key, value in section.items()
                 if str(value).startswith(default_root)]
    params = load_params(REPO / "params.yaml", overrides + [f"paths.data={root / 'data'}"])
    results = {r.dataset: r for r in run(params)}
    return world_dir, params, results


def _expected_locators(world_dir: Path, defect: dict) -> set[str] | None:
    """The reject locators a planted defect must produce (None: match image defects by path)."""
    kind, loc = defect["locator_kind"], defect["locator"]
    if kind == "line":
        return {f"line {loc}"}
    if kind == "annotation_index":
        return {f"annotations[{loc}]"}
    if kind == "question_index":
        return {f"questions[{loc}]"}
    if kind == "sentid":
        doc = json.loads((world_dir / defect["file"]).read_text())
        return {f"images[{i}].sentences[{j}]" for i, img in enumerate(doc["images"])
                for j, s in enumerate(img["sentences"]) if s.get("sentid") == loc}
    if kind == "region_id":
        doc = json.loads((world_dir / defect["file"]).read_text())
        return {f"[{i}].regions[{j}]" for i, e in enumerate(doc) for j, r in enumerate(e["regions"])
                if r.get("region_id") == loc}
    if kind == "ref_id":
        refs = pickle.loads((world_dir / defect["file"]).read_bytes())  # our own generated file
        found = [i for i, ref in enumerate(refs) if ref.get("ref_id") == loc]
        return {f"[{found[0]}]"} | {f"[{found[0]}].sentences[{j}]" for j in range(len(refs[found[0]]["sentences"]))}
    assert kind == "image_id", kind
    return None


def test_mini_world_every_planted_defect_and_nothing_else(mini):
    world_dir, params, results = mini
    planted = json.loads((world_dir / "planted.json").read_text())["defects"]
    assert {d["dataset"] for d in planted} <= set(DATASETS)
    for ds, result in results.items():
        assert result.rows_in == result.manifest_rows + result.rejected
        assert result.manifest_rows > 0
        rejects = pq.read_table(result.rejects_path).to_pylist()
        explained = [False] * len(rejects)
        for defect in (d for d in planted if d["dataset"] == ds):
            expected = _expected_locators(world_dir, defect)
            hits = []
            for k, rej in enumerate(rejects):
                if expected is None:  # image defect: every row using that file
                    match = str(world_dir / defect["file"]) + ":" in rej["detail"]
                else:
                    match = rej["locator"] in expected and Path(rej["source_file"]).name == Path(defect["file"]).name
                if match:
                    hits.append(k)
            assert hits, f"{ds}: planted defect not rejected: {defect}"
            for k in hits:
                assert rejects[k]["reason"] == defect["reason"], (defect, rejects[k])
                explained[k] = True
        unexplained = [r for r, ok in zip(rejects, explained) if not ok]
        assert not unexplained, f"{ds}: rejected without a planted defect: {unexplained[:3]}"


def test_mini_world_manifests_follow_the_contract(mini):
    _, _, results = mini
    for ds, result in results.items():
        table = pq.read_table(result.manifest_path)
        assert table.column_names[:8] == ["example_id", "dataset", "split", "image_source", "image_id",
                                          "image_path", "url", "text"]
        ids = table["example_id"].to_pylist()
        assert len(ids) == len(set(ids)), ds
        assert set(table["dataset"].to_pylist()) == {ds}
        assert all(t and t == t.strip() for t in table["text"].to_pylist())
        paths = table["image_path"].to_pylist()
        assert all(Path(p).is_file() for p in paths[:50]), ds
    coco = pq.read_table(results["coco"].manifest_path)
    assert set(coco["split"].to_pylist()) <= {"train", "restval", "val", "test"}
    cc = pq.read_table(results["cc"].manifest_path).to_pylist()
    assert all(r["image_id"] == hashlib.sha1(r["url"].encode()).hexdigest() for r in cc)


@pytest.mark.parametrize("marker", ["coco.rejects.parquet", "coco._run.json"])
def test_ingest_on_a_full_disk_replaces_all_its_outputs_or_none(params, monkeypatch, marker):
    """A full disk at any of ingest's three outputs leaves the previous outputs as they were (none
    on a first run), never new manifests without their run record; the error is one line naming
    the file. (The manifests used to be renamed into place before the run record was written.)"""
    from pipeline.common.failures import MACHINE_STATE, describe

    out = Path(params.paths.data) / "manifests"

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())} if out.is_dir() else {}

    strict = dataclasses.replace(params, ingest=dataclasses.replace(params.ingest, check_images=True))
    loose = dataclasses.replace(params, ingest=dataclasses.replace(params.ingest, check_images=False))
    for before in ({}, "a finished run"):
        if before:
            ingest_dataset(strict, "coco", progress=False)
            before = files()
        with monkeypatch.context() as patch:
            fill_disk_at(patch, marker)
            with pytest.raises(OSError) as info:
                ingest_dataset(loose, "coco", progress=False)  # other rows, so other bytes
        status, line = describe(info.value)
        assert status == MACHINE_STATE and marker in line and "\n" not in line, line
        assert files() == before, sorted(files())
    ingest_dataset(loose, "coco", progress=False)
    assert files()["coco.parquet"] != before["coco.parquet"]  # the failed run would have changed it


@pytest.mark.parametrize("output", ["coco._run.json", "coco.rejects.parquet"])
def test_a_directory_in_place_of_an_output_is_refused_before_the_work(params, output):
    from pipeline.common.ownership import ForeignDirectoryError

    target = Path(params.paths.data) / "manifests" / output
    (target / "sub").mkdir(parents=True)
    with pytest.raises(ForeignDirectoryError, match=str(target)):
        ingest_dataset(params, "coco", progress=False)
    assert (target / "sub").is_dir() and not (target.parent / "coco.parquet").exists()


def _manifests(root: Path) -> dict[str, object]:
    """The files of ``root/manifests``: bytes, a run record without its wall time, memory and paths."""
    out = {}
    for p in sorted((root / "manifests").iterdir()):
        if p.name.endswith("._run.json"):
            rec = json.loads(p.read_text().replace(str(root), "<data>"))
            out[p.name] = {k: v for k, v in rec.items() if k not in ("wall_time_s", "peak_rss_mb")}
        else:
            out[p.name] = p.read_bytes()
    return out


def test_a_kill_at_any_step_of_ingest_then_a_rerun_gives_the_outputs_of_a_clean_run(params, tmp_path):
    """A killed ingest left its ``.coco.*.tmp`` files in manifests/ and nothing removed them. The
    rerun removes its own dataset's (another dataset's, as ``ingest@vg`` may be writing it, stays)."""
    from helpers.kill import run_killed_at

    def ingest(root: Path) -> None:
        ingest_dataset(dataclasses.replace(params, paths=dataclasses.replace(params.paths, data=root)), "coco",
                       progress=False)

    ingest(tmp_path / "clean")
    expected = _manifests(tmp_path / "clean")
    other = ".vg.parquet.x1y2z3ab.tmp"
    for k in itertools.count(1):
        root = tmp_path / f"k{k}"
        (root / "manifests").mkdir(parents=True)
        (root / "manifests" / other).write_bytes(b"being written by ingest@vg")
        if not run_killed_at(ingest, root, k):
            break
        ingest(root)
        got = _manifests(root)
        assert got.pop(other) == b"being written by ingest@vg"
        assert got == expected, f"after a kill at step {k} and a rerun: {sorted(set(got) ^ set(expected))}"
    assert k > 6  # the three temporaries, their renames and the old record's removal
