"""Stage ``extract``: which images, the shard layout of docs/design.md §8, bad images, resume, given boxes.

A tiny world built here: a few rendered COCO-style scenes plus one image of each defect kind,
manifests that list them (clean + task manifests, with duplicates across manifests), VCR
metadata files, RefCOCO+ boxes, and a randomly initialized mini detector checkpoint.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "detector"))
from scene_kit import DECODABLE, REJECTED, render_scene, save_mini_checkpoint, write_defect_images  # noqa: E402

from pipeline.config import load_params  # noqa: E402
from pipeline.detector.runner import STOP_ENV, ExtractionInterrupted  # noqa: E402
from pipeline.detector.shards import read_shard  # noqa: E402
from pipeline.regions import detected_items, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCENE_IDS = [str(i) for i in range(101, 106)]


def _manifest(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("extract_world")
    raw = root / "raw"
    rng = np.random.default_rng(0)
    paths, objects = {}, {}
    for image_id in SCENE_IDS + ["106", "107"]:
        img, objs = render_scene(rng, 64, n_objects=2)
        paths[image_id] = raw / "coco" / f"COCO_train2014_{int(image_id):012d}.jpg"
        paths[image_id].parent.mkdir(parents=True, exist_ok=True)
        img.save(paths[image_id], quality=95)
        objects[image_id] = objs
    defects = write_defect_images(raw / "defects")
    row = lambda src, i, p: {"image_source": src, "image_id": i, "image_path": str(p), "text": "x"}  # noqa: E731
    clean = [row("coco", i, paths[i]) for i in SCENE_IDS] + [row("coco", f"d_{k}", p) for k, p in defects.items()]
    vqa = [row("coco", "101", paths["101"]), row("coco", "106", paths["106"])]
    refs = []
    for image_id, ann_base in (("101", 500), ("102", 600)):
        for k, obj in enumerate(objects[image_id]):
            x1, y1, x2, y2 = obj["box"]
            for sent in range(2):  # one manifest row per sentence
                refs.append(row("coco", image_id, paths[image_id]) | {"ann_id": ann_base + k, "bbox": [x1, y1, x2 - x1, y2 - y1]})
    refs.append(row("coco", "107", paths["107"]) | {"ann_id": 700, "bbox": [5.0, 5.0, 0.0, 10.0]})
    meta_dir = raw / "vcr"
    meta_dir.mkdir()
    vcr = []
    for image_id in ("v1", "v2", "v3"):
        meta = meta_dir / f"{image_id}.json"
        if image_id != "v3":  # v3's metadata file is missing
            boxes = [list(map(float, o["box"])) + [0.9] for o in objects["10" + image_id[1]]]
            meta.write_text(json.dumps({"boxes": boxes, "names": ["x"] * len(boxes), "width": 64, "height": 64}))
        vcr.append(row("vcr", image_id, paths["10" + image_id[1]]) | {"metadata_path": str(meta)})
    nlvr2 = [row("nlvr2", "n-img0", paths["103"]) | {"image_id_2": "n-img1", "image_path_2": str(paths["104"])}]
    manifests = {"clean/coco.parquet": clean, "manifests/vqa.parquet": vqa, "manifests/refcoco.parquet": refs,
                 "manifests/vcr.parquet": vcr, "manifests/nlvr2.parquet": nlvr2}
    data = root / "data"
    for rel, rows in manifests.items():
        _manifest(data / rel, rows)
    weights = save_mini_checkpoint(root / "weights" / "model_final.pth", image_size=64)
    return {"root": root, "data": data, "paths": paths, "objects": objects, "defects": defects,
            "weights": weights, "manifests": manifests}


def _params(data: Path, weights: Path, *extra: str):
    overrides = [f"paths.data={data}", f"extract.weights={weights}", "extract.shard_size=3", "extract.batch_size=2",
                 "extract.workers=1", "extract.device=cpu", *extra]
    return load_params(ROOT / "params.yaml", overrides, check_paths=False)


def _copy_manifests(world: dict, data: Path) -> None:
    for rel in world["manifests"]:
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(world["data"] / rel, data / rel)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith("_run")}


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
    run(_params(world["data"], world["weights"]), "coco")
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
    _copy_manifests(world, data)
    run(_params(data, world["weights"]), "vcr_gt")
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
    before = _files(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")}
    run(_params(world["data"], world["weights"]), "coco")
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == record["counts"]["shards"] > 1
    assert _files(out) == before
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*")} == mtimes


def test_kill_and_resume_gives_the_bytes_of_an_uninterrupted_run(world, coco_run, tmp_path, monkeypatch):
    data = tmp_path / "data"
    _copy_manifests(world, data)
    params = _params(data, world["weights"])
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
    assert _files(out) == _files(coco_run / "coco")
    assert not list(out.glob(".*.tmp"))


def test_a_stale_shard_is_recomputed(world, tmp_path):
    data = tmp_path / "data"
    _copy_manifests(world, data)
    params = _params(data, world["weights"], "extract.min_boxes=12")
    run(params, "nlvr2")
    out = data / "features" / "nlvr2"
    shard = read_shard(out / "shard-00000.safetensors")
    assert all(len(shard.image(j)["conf"]) >= 12 for j in range(len(shard.image_ids)))
    run(_params(data, world["weights"]), "nlvr2")  # a different keep rule: the marker no longer matches
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["shards_skipped"] == 0


def test_unknown_item_is_an_error(world):
    with pytest.raises(ValueError, match="unknown item 'imagenet'"):
        run(_params(world["data"], world["weights"]), "imagenet")


@pytest.mark.slow
def test_two_worker_processes_write_the_same_bytes(world, coco_run, tmp_path):
    data = tmp_path / "data"
    _copy_manifests(world, data)
    run(_params(data, world["weights"], "extract.workers=2"), "coco")
    assert _files(data / "features" / "coco") == _files(coco_run / "coco")
