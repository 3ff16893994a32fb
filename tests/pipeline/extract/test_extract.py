"""Stage ``extract``: which images, the shard layout of docs/design.md §8, bad images, resume, given boxes.

The tiny world of tests/helpers/extract_world.py: a few rendered COCO-style scenes plus one image
of each defect kind, manifests that list them, VCR metadata files, RefCOCO+ boxes, and a randomly
initialized mini detector checkpoint.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from helpers.extract_world import SCENE_IDS, copy_manifests, feature_files, params_for, write_world
from helpers.scene_kit import DECODABLE, REJECTED

from pipeline.extract.detector.runner import STOP_ENV, ExtractionInterrupted
from pipeline.extract.detector.shards import read_shard
from pipeline.extract.extract import run
from pipeline.extract.image_sets import detected_items
from pipeline.params.extract import GIVEN_BOX_SETS

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return write_world(tmp_path_factory.mktemp("extract_world"))


def test_images_are_the_sorted_union_over_manifests(world):
    items, used = detected_items(world["data"], "coco")
    ids = [it.image_id for it in items]
    assert ids == sorted(set(SCENE_IDS) | {"106", "107"} | {f"d_{k}" for k in world["defects"]})
    assert {p.name for p in used} == {"coco.parquet", "vqa.parquet", "refcoco.parquet"}
    nlvr2, _ = detected_items(world["data"], "nlvr2")
    assert [(it.image_id, it.path) for it in nlvr2] == [("n-img0", str(world["paths"]["103"])),
                                                       ("n-img1", str(world["paths"]["104"]))]


@pytest.fixture(scope="module")
def coco_run(world):
    run(params_for(world["data"], world["weights"]), "coco")
    return world["data"] / "features"


def test_shards_follow_the_contract(world, coco_run):
    out = coco_run / "coco"
    items, _ = detected_items(world["data"], "coco")
    n_shards = -(-len(items) // 3)
    assert sorted(p.name for p in out.glob("shard-*.safetensors")) == [f"shard-{i:05d}.safetensors" for i in range(n_shards)]
    assert all((out / f"shard-{i:05d}.safetensors.done").is_file() for i in range(n_shards))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["feature_dim"] == 512 and meta["num_classes"] == 7 and meta["mode"] == "detected"
    assert meta["class_names"][0] == "__background__" and len(meta["class_names"]) == 7 and meta["detector"] == "mini"
    seen = []
    for i in range(n_shards):
        shard = read_shard(out / f"shard-{i:05d}.safetensors")
        a = shard.arrays
        m, n = len(shard.image_ids), len(a["conf"])
        assert a["features"].dtype == np.float16 and a["features"].shape == (n, 512)
        assert a["boxes"].dtype == np.float32 and a["boxes"].shape == (n, 4)
        assert a["norm_bb"].dtype == np.float16 and a["norm_bb"].shape == (n, 7)
        assert a["conf"].dtype == np.float16 and a["soft_labels"].dtype == np.float16 and a["soft_labels"].shape == (n, 7)
        assert a["offsets"].dtype == np.int64 and a["offsets"].shape == (m + 1,) and a["offsets"][-1] == n
        assert a["image_hw"].dtype == np.int32 and a["image_hw"].shape == (m, 2)
        for j, image_id in enumerate(shard.image_ids):
            img = shard.image(j)
            assert 10 <= len(img["conf"]) <= 100
            h, w = img["image_hw"]
            expected = img["boxes"] / np.array([w, h, w, h], np.float32)
            np.testing.assert_allclose(img["norm_bb"][:, :4], expected, atol=1e-3)
            seen.append((image_id, (int(h), int(w))))
    kept = dict(seen)
    assert [s[0] for s in seen] == sorted(kept)
    for kind in DECODABLE:
        assert f"d_{kind}" in kept
    assert kept["d_exif_rotated"] == (40, 24)  # stored 40 wide x 24 high, displayed upright
    rejects = pq.read_table(out / "rejects.parquet").to_pylist()
    assert {r["image_id"]: r["reason"] for r in rejects} == {f"d_{k}": reason for k, reason in REJECTED.items()}
    assert all(r["detail"] and r["image_path"] for r in rejects)
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["images"] == len(kept) and record["counts"]["rejected"] == len(REJECTED)


def test_coco_gt_has_exactly_the_refcoco_boxes(world, coco_run):
    out = coco_run / "coco_gt"
    shard = read_shard(out / "shard-00000.safetensors")
    assert shard.image_ids == ["101", "102"]
    assert json.loads((out / "meta.json").read_text())["mode"] == "given"
    for j, (image_id, base) in enumerate((("101", 500), ("102", 600))):
        objs = world["objects"][image_id]
        assert shard.box_ids[j] == [base + k for k in range(len(objs))]
        np.testing.assert_array_equal(shard.image(j)["boxes"], np.array([o["box"] for o in objs], np.float32))
    rejects = pq.read_table(out / "rejects.parquet").to_pylist()
    assert [(r["image_id"], r["reason"]) for r in rejects] == [("107", "bad_boxes")]


def test_vcr_gt_boxes_come_from_the_metadata_files(world, tmp_path):
    data = tmp_path / "data"
    copy_manifests(world, data)
    run(params_for(data, world["weights"]), "vcr_gt")
    shard = read_shard(data / "features" / "vcr_gt" / "shard-00000.safetensors")
    assert shard.image_ids == ["v1", "v2"]
    for j, image_id in enumerate(("101", "102")):
        boxes = np.array([o["box"] for o in world["objects"][image_id]], np.float32)
        np.testing.assert_array_equal(shard.image(j)["boxes"], boxes)
        assert shard.box_ids[j] == list(range(len(boxes)))
    rejects = pq.read_table(data / "features" / "vcr_gt" / "rejects.parquet").to_pylist()
    assert [(r["image_id"], r["reason"]) for r in rejects] == [("v3", "bad_boxes")]
    assert not (data / "features" / "vcr").exists()  # vcr_gt alone was asked for


def test_rerun_skips_finished_shards_and_changes_nothing(world, coco_run):
    out = coco_run / "coco"
    before = feature_files(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    run(params_for(world["data"], world["weights"]), "coco")
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == record["counts"]["shards"] > 1
    assert feature_files(out) == before
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == mtimes


def test_kill_and_resume_gives_the_bytes_of_an_uninterrupted_run(world, coco_run, tmp_path, monkeypatch):
    data = tmp_path / "data"
    copy_manifests(world, data)
    params = params_for(data, world["weights"])
    monkeypatch.setenv(STOP_ENV, "2")
    with pytest.raises(ExtractionInterrupted):
        run(params, "coco")
    out = data / "features" / "coco"
    assert sorted(p.name for p in out.glob("shard-*.done")) == ["shard-00000.safetensors.done",
                                                                 "shard-00001.safetensors.done"]
    assert not (out / "meta.json").exists()
    (out / ".shard-00002.safetensors.abc.tmp").write_bytes(b"half a shard")  # what a kill mid-write leaves
    monkeypatch.delenv(STOP_ENV)
    run(params, "coco")
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == 2
    assert feature_files(out) == feature_files(coco_run / "coco")
    assert not list(out.glob(".*.tmp"))


def test_a_stale_shard_is_recomputed(world, tmp_path):
    data = tmp_path / "data"
    copy_manifests(world, data)
    params = params_for(data, world["weights"], "extract.min_boxes=12")
    run(params, "nlvr2")
    out = data / "features" / "nlvr2"
    shard = read_shard(out / "shard-00000.safetensors")
    assert all(len(shard.image(j)["conf"]) >= 12 for j in range(len(shard.image_ids)))
    run(params_for(data, world["weights"]), "nlvr2")  # a different keep rule: the marker no longer matches
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == 0


def test_the_regions_are_chosen_among_extract_proposals(world, tmp_path):
    """``extract.proposals`` caps what the res5 head scores: no image keeps more regions than that,
    and the shards of another count are not reused."""
    data = tmp_path / "data"
    copy_manifests(world, data)
    run(params_for(data, world["weights"], "extract.min_boxes=2", "extract.proposals=3"), "nlvr2")
    out = data / "features" / "nlvr2"
    shard = read_shard(out / "shard-00000.safetensors")
    kept = [len(shard.image(j)["conf"]) for j in range(len(shard.image_ids))]
    assert kept and all(2 <= n <= 3 for n in kept), kept
    record = json.loads((out / "_run.json").read_text())
    assert record["settings"]["proposals"] == 3
    run(params_for(data, world["weights"], "extract.min_boxes=2"), "nlvr2")  # the detector's own count
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == 0 and record["settings"]["proposals"] is None
    shard = read_shard(out / "shard-00000.safetensors")
    assert max(len(shard.image(j)["conf"]) for j in range(len(shard.image_ids))) > 3


def test_unknown_item_is_an_error(world):
    with pytest.raises(ValueError, match="unknown item 'imagenet'"):
        run(params_for(world["data"], world["weights"]), "imagenet")


@pytest.mark.slow
def test_two_worker_processes_write_the_same_bytes(world, coco_run, tmp_path):
    data = tmp_path / "data"
    copy_manifests(world, data)
    run(params_for(data, world["weights"], "extract.workers=2"), "coco")
    for name in ("coco", "coco_gt"):  # one pool serves the source and its given-box set
        assert same_features(data / "features" / name, coco_run / name)


@pytest.mark.slow
def test_workers_share_the_batches_of_one_shard(world, tmp_path):
    """One shard of several batches: the workers split its batches, and the bytes are those of
    one process (the driver plans the batches, so an image keeps its batch-mates)."""
    shards = {}
    for workers in (1, 2):
        data = tmp_path / f"w{workers}"
        copy_manifests(world, data)
        run(params_for(data, world["weights"], "extract.shard_size=1000", f"extract.workers={workers}"), "coco")
        shards[workers] = data / "features"
        record = json.loads((data / "features" / "coco" / "_run.json").read_text())
        assert record["counts"]["shards"] == 1 and record["workers"] == workers
    assert all(same_features(shards[2] / name, shards[1] / name) for name in ("coco", "coco_gt"))


def same_features(a, b) -> bool:
    """Equal feature directories, but for the rejects of a given-box set (their detail names the
    manifest, so the data directory)."""
    drop = {"rejects.parquet"} if a.name in GIVEN_BOX_SETS.values() else set()
    files_a, files_b = feature_files(a), feature_files(b)
    return {k: v for k, v in files_a.items() if k not in drop} == {k: v for k, v in files_b.items() if k not in drop}


def test_amp_applies_on_cuda_and_a_cpu_extracts_in_fp32():
    from pipeline.extract.detector.runner import effective_amp

    assert effective_amp("bf16", "cuda") == "bf16" and effective_amp("fp16", "cuda") == "fp16"
    assert effective_amp("none", "cuda") is None
    assert all(effective_amp(amp, "cpu") is None for amp in ("bf16", "fp16", "none"))
