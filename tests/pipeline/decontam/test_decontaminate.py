"""Decontamination on a small synthetic world that plants one case of every reason.

The world is written here (manifests + tiny images in tmp_path) so these tests do not depend on
the mini-world generator or ingest; the last section below (``mini_chain``) runs the real chain.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.decontam import decontaminate
from pipeline.decontam.phash import phash_file
from pipeline.params.parser import load_params

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

REPO = Path(__file__).resolve().parents[3]
CORE = ["example_id", "dataset", "split", "image_source", "image_id", "image_path", "url", "text"]
EXTRA = {
    "coco": ["coco_split", "flickr_url", "width", "height"],
    "vg": ["coco_id", "flickr_id", "width", "height"],
    "nlvr2": ["image_id_2", "image_path_2", "label"],
    "snli_ve": ["premise", "label"],
    "refcoco": ["ref_id"],
}
F30K = ["1000092795", "2000000001", "3000000002"]  # Flickr30k photo ids (all eval by default)
COCO_URL = "http://images.cocodataset.org/val2014/COCO_val2014_{:012d}.jpg"


def _pattern(seed: int) -> np.ndarray:
    """A 64x64 RGB image of random 8x8 blocks: distinct seeds give far-apart pHashes."""
    blocks = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    return np.kron(blocks, np.ones((8, 8, 1), dtype=np.uint8))


def _save(path: Path, seed: int, *, reencode: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(_pattern(seed))
    if reencode:  # a re-hosted copy: resized and saved as a lossy JPEG
        image.resize((60, 60), Image.Resampling.BILINEAR).save(path, format="JPEG", quality=70)
    else:
        image.save(path, format="PNG")
    return str(path)


class World:
    """Manifests + images under ``root``; ``expected`` = dataset -> {image_id: (reason, refs)}."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: dict[str, list[dict]] = {}
        self.rejects: dict[str, list[str]] = {}
        self.expected: dict[str, dict[str, tuple[str, list[str]]]] = {}

    def image(self, name: str, seed: int, **kw) -> str:
        return _save(self.root / "images" / name, seed, **kw)

    def add(self, dataset: str, split: str, source: str, image_id: str, path: str, *, url=None, n=1, **extra):
        rows = self.rows.setdefault(dataset, [])
        for k in range(n):
            row = dict(example_id=f"{dataset}-{image_id}-{k}-{split}", dataset=dataset, split=split,
                       image_source=source, image_id=image_id, image_path=path, url=url, text=f"text {k}")
            row.update({c: extra.get(c) for c in EXTRA.get(dataset, [])})
            rows.append(row)

    def expect(self, dataset: str, image_id: str, reason: str, refs: list[str]) -> None:
        self.expected.setdefault(dataset, {})[image_id] = (reason, sorted(refs))

    def write(self) -> Path:
        # COCO's test image list (real format: no flickr_url); decontaminate reads it from sources
        info = {"info": {"description": "COCO 2015 Test"}, "images": getattr(self, "image_info", []),
                "licenses": [], "categories": []}
        (self.root / "image_info_test2015.json").write_text(json.dumps(info))
        out = self.root / "data" / "manifests"
        out.mkdir(parents=True, exist_ok=True)
        for dataset, rows in self.rows.items():
            cols = CORE + EXTRA.get(dataset, [])
            pq.write_table(pa.Table.from_pylist(rows).select(cols), out / f"{dataset}.parquet")
            reasons = self.rejects.get(dataset, [])
            rejects = pa.table({"dataset": [dataset] * len(reasons), "source_file": ["f"] * len(reasons),
                                "locator": [str(i) for i in range(len(reasons))], "reason": reasons,
                                "detail": [""] * len(reasons), "raw_row": ["{}"] * len(reasons)})
            pq.write_table(rejects, out / f"{dataset}.rejects.parquet")
        return self.root / "data"


def build_world(root: Path) -> World:
    w = World(root)
    # --- eval datasets
    for i, (pid, split) in enumerate(zip(F30K, ["train", "val", "test"])):
        w.add("flickr30k", split, "flickr30k", pid, w.image(f"f30k/{pid}.jpg", 100 + i), n=2)
    w.add("snli_ve", "dev", "flickr30k", F30K[0], str(root / f"images/f30k/{F30K[0]}.jpg"), premise="p", label="entailment")
    w.add("snli_ve", "train", "flickr30k", F30K[1], str(root / f"images/f30k/{F30K[1]}.jpg"), premise="p", label="neutral")
    nl_left, nl_right = w.image("nlvr2/dev-1-img0.png", 200), w.image("nlvr2/dev-1-img1.png", 201)
    w.add("nlvr2", "dev", "nlvr2", "dev-1-img0", nl_left, url="https://example.org/pics/left.jpg?b=2&a=1",
          image_id_2="dev-1-img1", image_path_2=nl_right, label=True)
    w.add("nlvr2", "train", "nlvr2", "train-1-img0", w.image("nlvr2/train-1-img0.png", 202),
          image_id_2="train-1-img1", image_path_2=w.image("nlvr2/train-1-img1.png", 203), label=False)
    w.add("vcr", "val", "vcr", "movie/frame1.jpg", w.image("vcr/frame1.png", 300))
    w.add("vcr", "train", "vcr", "movie/frame2.jpg", w.image("vcr/frame2.png", 301))
    w.add("vqa", "test", "coco", "9001", w.image("coco/9001.png", 400))  # a test2015 image
    w.add("vqa", "train", "coco", "1", str(root / "images/coco/1.png"))
    w.add("vqa", "val", "coco", "10", str(root / "images/coco/10.png"))  # scored by finetune@vqa (dev)
    w.add("refcoco", "val", "coco", "5", str(root / "images/coco/5.png"), ref_id="r5")
    w.add("refcoco", "train", "coco", "1", str(root / "images/coco/1.png"), ref_id="r1")
    w.rejects["flickr30k"] = ["missing_image"]

    # --- COCO (pretraining and eval): Karpathy splits
    coco = {1: "train", 2: "restval", 3: "val", 4: "test", 5: "train", 6: "train", 7: "train", 8: "train",
            10: "train"}
    for cid, split in coco.items():
        path = w.image(f"coco/{cid}.png", 1000 + cid) if cid not in (7, 8) else None
        flickr_url = f"http://farm{cid}.staticflickr.com/{cid}/{100 + cid}_abc123_z.jpg"
        if cid == 6:  # a Flickr30k photo under its COCO flickr_url
            flickr_url = f"http://farm3.staticflickr.com/2/{F30K[2]}_deadbeef_z.jpg"
        if cid == 7:  # a re-encoded copy of the NLVR2 dev right image, at an unrelated URL
            path = w.image("coco/7.jpg", 201, reencode=True)
        if cid == 8:  # a Flickr30k photo by flickr_url AND a near duplicate of it: flickr id wins
            flickr_url = f"https://live.staticflickr.com/65535/{F30K[1]}_f00d.jpg"
            path = w.image("coco/8.jpg", 101, reencode=True)
        w.add("coco", split, "coco", str(cid), path, url=COCO_URL.format(cid), n=2, coco_split="val2014",
              flickr_url=flickr_url, width=64, height=64)
    w.expect("coco", "4", "eval_split", ["coco/test/4"])
    w.expect("coco", "5", "eval_split", ["refcoco/val/5"])
    w.expect("coco", "10", "eval_split", ["vqa/val/10"])  # not in decontaminate.eval_splits: a task scores it
    # VG 15 (below) says COCO test image 4 is Flickr photo F30K[2]: both eval images share their keys
    w.expect("coco", "6", "flickr_photo_id", ["coco/test/4", f"flickr30k/test/{F30K[2]}"])
    w.expect("coco", "7", "near_duplicate", ["nlvr2/dev/dev-1-img1"])
    w.expect("coco", "8", "flickr_photo_id", [f"flickr30k/val/{F30K[1]}"])
    w.rejects["coco"] = ["missing_caption", "duplicate_id", "missing_caption"]

    # --- VG: regions, coco_id / flickr_id
    vg = {"11": dict(coco_id="4"), "12": dict(coco_id="3"), "13": dict(flickr_id=F30K[0]),
          "14": {}, "15": dict(coco_id="4", flickr_id="0" + F30K[2])}
    for vid, extra in vg.items():
        w.add("vg", "train", "vg", vid, w.image(f"vg/{vid}.png", 2000 + int(vid)),
              url=f"https://cs.stanford.edu/people/rak248/VG_100K/{vid}.jpg", n=3, width=64, height=64, **extra)
    w.expect("vg", "11", "coco_id", ["coco/test/4", f"flickr30k/test/{F30K[2]}"])  # linked by VG 15
    w.expect("vg", "13", "flickr_photo_id", [f"flickr30k/train/{F30K[0]}", f"snli_ve/dev/{F30K[0]}"])
    w.expect("vg", "15", "coco_id", ["coco/test/4", f"flickr30k/test/{F30K[2]}"])
    w.rejects["vg"] = ["missing_field"]

    # --- CC: URL variants
    cc = {
        "a": ("train", "HTTP://Images.CocoDataset.org:80/val2014/./x/../COCO_val2014_000000000004.jpg#frag"),
        "b": ("train", f"http://farm9.static.flickr.com/123/{F30K[0]}_s3cr3t.jpg"),
        "c": ("train", "https://example.com/unrelated.jpg"),
        "d": ("val", "https://example.com/val.jpg"),
        "e": ("train", "https://EXAMPLE.org:443/pics/%6Ceft.jpg?a=1&b=2"),
        "f": ("train", "https://rehost.example.net/copy.jpg"),
    }
    for key, (split, url) in cc.items():
        seed = 300 if key == "f" else 3000 + ord(key)  # f: a re-encoded VCR val frame
        w.add("cc", split, "cc", f"cc{key}", w.image(f"cc/{key}.jpg", seed, reencode=True), url=url)
    w.expect("cc", "cca", "canonical_url", ["coco/test/4"])
    w.expect("cc", "ccb", "flickr_photo_id", [f"flickr30k/train/{F30K[0]}", f"snli_ve/dev/{F30K[0]}"])
    w.expect("cc", "cce", "canonical_url", ["nlvr2/dev/dev-1-img0"])
    w.expect("cc", "ccf", "near_duplicate", ["vcr/val/movie/frame1.jpg"])
    w.rejects["cc"] = ["bad_url", "missing_image"]

    # --- SBU: Flickr URLs
    w.add("sbu", "train", "sbu", "s1", w.image("sbu/1.jpg", 4001, reencode=True),
          url=f"https://c1.staticflickr.com/9/8152/{F30K[2]}_abc_b.jpg")
    w.add("sbu", "train", "sbu", "s2", w.image("sbu/2.jpg", 4002, reencode=True),
          url="http://farm1.static.flickr.com/1/424242_abc.jpg")
    w.expect("sbu", "s1", "flickr_photo_id", ["coco/test/4", f"flickr30k/test/{F30K[2]}"])  # linked by VG 15
    w.rejects["sbu"] = []

    # --- eval images whose identity lives in another dataset's files (RefCOCO+ 5 and VQA test 9001
    # carry a COCO id only; the COCO manifest, COCO's test image list and VG know their URLs)
    w.add("cc", "train", "cc", "ccg", w.image("cc/g.jpg", 3101, reencode=True),
          url="http://Images.CocoDataset.ORG/val2014/COCO_val2014_000000000005.jpg")
    w.add("cc", "train", "cc", "cch", w.image("cc/h.jpg", 3102, reencode=True),
          url="http://images.cocodataset.org:80/test2015/./COCO_test2015_000000009001.jpg#top")
    w.add("cc", "train", "cc", "cci", w.image("cc/i.jpg", 3103, reencode=True),  # VG 16 shows RefCOCO+ 5
          url="HTTPS://CS.Stanford.edu/people/rak248/VG_100K/16.jpg")
    w.add("cc", "train", "cc", "ccj", w.image("cc/j.jpg", 3104, reencode=True),  # look-alike: a test image no
          url="http://images.cocodataset.org/test2015/COCO_test2015_000000009002.jpg")  # eval split uses
    w.add("cc", "train", "cc", "cck", w.image("cc/k.jpg", 3105, reencode=True),  # look-alike: COCO train 1
          url="http://IMAGES.cocodataset.org/val2014/COCO_val2014_000000000001.jpg")
    w.add("vg", "train", "vg", "16", w.image("vg/16.png", 2016), url="https://cs.stanford.edu/people/rak248/VG_100K/16.jpg",
          n=2, width=64, height=64, coco_id="5")
    w.add("sbu", "train", "sbu", "s3", w.image("sbu/3.jpg", 4003, reencode=True),  # RefCOCO+ 5's photo, re-uploaded
          url="https://live.staticflickr.com/65535/105_0th3rs3cr3t_o.jpg")
    w.add("sbu", "train", "sbu", "s4", w.image("sbu/4.jpg", 4004, reencode=True),  # look-alike: COCO train 1's photo
          url="https://live.staticflickr.com/65535/101_0th3rs3cr3t_o.jpg")
    w.expect("cc", "ccg", "canonical_url", ["refcoco/val/5"])
    w.expect("cc", "cch", "canonical_url", ["vqa/test/9001"])
    w.expect("cc", "cci", "canonical_url", ["refcoco/val/5"])
    w.expect("vg", "16", "coco_id", ["refcoco/val/5"])
    w.expect("sbu", "s3", "flickr_photo_id", ["refcoco/val/5"])
    w.image_info = [{"id": i, "file_name": f"COCO_test2015_{i:012d}.jpg", "height": 64, "width": 64, "license": 1,
                     "coco_url": f"http://images.cocodataset.org/test2015/COCO_test2015_{i:012d}.jpg",
                     "date_captured": "2013-11-14 11:18:45"} for i in (9001, 9002)]
    return w


def _params(data: Path, *sets: str, image_info: Path | None = None):
    image_info = image_info or data.parent / "image_info_test2015.json"
    return load_params(REPO / "params.yaml", [f"paths.data={data}", "decontaminate.workers=1",
                                              "decontaminate.min_val_images=1",
                                              f"sources.coco.image_info_test={image_info}", *sets])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[World, Path, dict]:
    w = build_world(tmp_path_factory.mktemp("world"))
    data = w.write()
    reports = decontaminate.run(_params(data))
    return w, data, reports


def test_planted_images_are_removed_with_the_right_reason_and_matches(world):
    w, data, reports = world
    for dataset in ("coco", "vg", "cc", "sbu"):
        got = {e["image_id"]: (e["reason"], e["matched_eval"]) for e in reports[dataset]["removed"]}
        assert got == w.expected[dataset], dataset


def test_reports_hold_the_invariant_and_the_contract_fields(world):
    _, data, _ = world
    for dataset, rejected in (("coco", 3), ("vg", 1), ("cc", 2), ("sbu", 0)):
        rep = json.loads((data / "reports" / "cleaning" / f"{dataset}.json").read_text())
        assert set(rep) == {"dataset", "input_rows", "input_images", "kept_rows", "kept_images", "removed_rows",
                            "removed_images", "removed", "rejected_rows"}
        assert rep["input_rows"] == rep["kept_rows"] + rep["removed_rows"] + sum(rep["rejected_rows"].values())
        assert sum(rep["rejected_rows"].values()) == rejected
        assert list(rep["removed_images"]) == sorted(decontaminate.REASONS)  # json sorts keys
        assert sum(rep["removed_images"].values()) == len(rep["removed"])
        for entry in rep["removed"]:
            assert set(entry) == {"image_id", "url", "reason", "matched_eval"}
    coco = json.loads((data / "reports" / "cleaning" / "coco.json").read_text())
    assert coco["input_rows"] == 9 * 2 + 3 and coco["removed_rows"] == 6 * 2 and coco["kept_images"] == 3
    assert coco["removed_images"] == {"eval_split": 3, "coco_id": 0, "flickr_photo_id": 2, "canonical_url": 0,
                                      "near_duplicate": 1}
    summary = json.loads((data / "reports" / "cleaning" / "summary.json").read_text())
    assert summary["coco_removed_rows"] == 12 and summary["cc_removed_near_duplicate"] == 1
    assert all(isinstance(v, int) for v in summary.values())


def test_clean_manifests_keep_all_rows_of_kept_images_with_train_val_splits(world):
    w, data, _ = world
    coco = pq.read_table(data / "clean" / "coco.parquet")
    assert coco.schema == pq.read_schema(data / "manifests" / "coco.parquet")
    assert coco.column("example_id").to_pylist() == sorted(coco.column("example_id").to_pylist())
    pairs = sorted(set(zip(coco.column("image_id").to_pylist(), coco.column("split").to_pylist())))
    assert pairs == [("1", "train"), ("2", "train"), ("3", "val")]  # restval -> train
    assert coco.num_rows == 6
    vg = pq.read_table(data / "clean" / "vg.parquet")
    vg_pairs = sorted(set(zip(vg.column("image_id").to_pylist(), vg.column("split").to_pylist())))
    assert vg_pairs == [("12", "val"), ("14", "train")]  # 12 shows COCO val image 3
    cc = pq.read_table(data / "clean" / "cc.parquet")
    assert sorted(zip(cc.column("image_id").to_pylist(), cc.column("split").to_pylist())) == [
        ("ccc", "train"), ("ccd", "val"), ("ccj", "train"), ("cck", "train")]  # j, k: look-alikes, kept
    assert pq.read_table(data / "clean" / "sbu.parquet").column("image_id").to_pylist() == ["s2", "s4"]
    run = json.loads((data / "clean" / "_run.json").read_text())
    assert run["stage"] == "decontaminate" and run["counts"]["coco"]["removed_images"] == 6


def test_the_planted_near_duplicates_are_close_and_the_rest_far():
    """Guards the synthetic world: the pHash cases above only mean something if this holds."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a = phash_file(_save(Path(tmp) / "a.png", 201))
        b = phash_file(_save(Path(tmp) / "b.jpg", 201, reencode=True))
        others = [phash_file(_save(Path(tmp) / f"{s}.png", s)) for s in range(1000, 1020)]
    assert (a ^ b).bit_count() <= 4
    assert min((a ^ o).bit_count() for o in others) > 12


def copy_manifests(data: Path, dest: Path) -> Path:
    """A fresh data dir ``dest`` holding a copy of ``data``'s manifests (decontaminate's inputs)."""
    (dest / "manifests").mkdir(parents=True)
    for f in (data / "manifests").iterdir():
        (dest / "manifests" / f.name).write_bytes(f.read_bytes())
    return dest


def test_outputs_are_byte_identical_across_runs(world, tmp_path):
    w, data, _ = world
    again = copy_manifests(data, tmp_path / "data")
    decontaminate.run(_params(again, image_info=data.parent / "image_info_test2015.json"))
    for sub in ("clean", "reports/cleaning"):
        first = {p.name: p.read_bytes() for p in (data / sub).iterdir() if p.name != "_run.json"}
        second = {p.name: p.read_bytes() for p in (again / sub).iterdir() if p.name != "_run.json"}
        assert first.keys() == second.keys() and len(first) > 3
        for name in first:
            assert first[name] == second[name], f"{sub}/{name} differs between runs"


def test_near_duplicates_off_and_eval_splits_param(world, tmp_path):
    w, data, _ = world
    out = copy_manifests(data, tmp_path / "data")
    # Karpathy val excluded too; no pHash: the near duplicates stay, coco 3 goes, VG 12 (coco_id 3) goes
    reports = decontaminate.run(_params(out, "decontaminate.near_duplicates=false",
                                        "decontaminate.eval_splits.coco=[val,test]",
                                        image_info=data.parent / "image_info_test2015.json"))
    removed = {d: {e["image_id"]: e["reason"] for e in r["removed"]} for d, r in reports.items()}
    assert "7" not in removed["coco"] and "ccf" not in removed["cc"]
    assert removed["coco"]["3"] == "eval_split" and removed["vg"]["12"] == "coco_id"
    assert all(n == 0 for r in reports.values() for k, n in r["removed_images"].items() if k == "near_duplicate")


def test_image_info_test_null_leaves_test_images_known_by_id_and_a_missing_one_is_named(world, tmp_path):
    w, data, _ = world
    out = copy_manifests(data, tmp_path / "data")
    with pytest.raises(FileNotFoundError, match=r"sources\.coco\.image_info_test: .*nowhere\.json does not exist"):
        decontaminate.run(_params(out, image_info=tmp_path / "nowhere.json"))
    params = load_params(REPO / "params.yaml", [f"paths.data={out}", "decontaminate.workers=1",
                                                "decontaminate.near_duplicates=false",
                                                "sources.coco.image_info_test=null"])
    removed = {e["image_id"] for e in decontaminate.run(params)["cc"]["removed"]}
    assert "cch" not in removed and {"ccg", "cci"} <= removed  # only the test image's URL is unknown


def test_missing_manifest_is_named(tmp_path):
    (tmp_path / "manifests").mkdir()
    missing = r"manifests/cc\.parquet does not exist: run `python -m pipeline ingest cc` first"
    with pytest.raises(FileNotFoundError, match=missing):
        decontaminate.run(_params(tmp_path))


# --------------------------------------------------------------------------------------------
# the real chain: mini world -> ingest -> decontaminate, against planted.json


@pytest.fixture(scope="module")
def mini_chain(tmp_path_factory):
    """A small mini world with a few extra test items of every kind (pipeline/mini_world/eval_extension.py),
    ingested, then decontaminated through the stage CLI."""
    from helpers.mini_world import ingest_and_decontaminate, small_config
    from pipeline.mini_world import generate

    base = load_params(REPO / "params.yaml")
    root = tmp_path_factory.mktemp("mini_chain")
    world_dir = root / "raw"
    extras = dict(n_vqa_test_extra=2, n_refcoco_test_extra=2, n_vcr_test_extra=2, n_nlvr2_test_extra_pairs=2,
                  n_snli_ve_test_extra=2, n_refcoco_val_extra=2)
    generate(small_config(world_dir, **extras), base.seed, world_dir, base.eval_splits(), progress=False)
    data = ingest_and_decontaminate(world_dir, root)
    planted = json.loads((world_dir / "planted.json").read_text())
    return data, planted


@pytest.mark.slow
def test_mini_world_planted_overlaps_precision_and_recall_are_one(mini_chain):
    data, planted = mini_chain
    expected = {(o["dataset"], o["image_id"]): (o["reason"], sorted(o["matches"])) for o in planted["overlaps"]}
    removed = {}
    for dataset in ("coco", "vg", "cc", "sbu"):
        rep = json.loads((data / "reports" / "cleaning" / f"{dataset}.json").read_text())
        assert rep["input_rows"] == rep["kept_rows"] + rep["removed_rows"] + sum(rep["rejected_rows"].values())
        removed.update({(dataset, e["image_id"]): (e["reason"], e["matched_eval"]) for e in rep["removed"]})
    hits = set(expected) & set(removed)
    recall, precision = len(hits) / len(expected), len(hits) / max(len(removed), 1)
    assert (precision, recall) == (1.0, 1.0), (sorted(set(expected) - hits)[:5], sorted(set(removed) - hits)[:5])
    wrong = {k: (expected[k], removed[k]) for k in hits if expected[k] != removed[k]}
    assert not wrong, list(wrong.items())[:5]
    # every kind the generator plants is exercised (the world is small but complete)
    assert {reason for reason, _ in expected.values()} == set(decontaminate.REASONS)
    clean = {d: pq.read_table(data / "clean" / f"{d}.parquet") for d in ("coco", "vg", "cc", "sbu")}
    for dataset, table in clean.items():
        kept_ids = set(table.column("image_id").to_pylist())
        assert not kept_ids & {i for d, i in expected if d == dataset}
        assert set(table.column("split").to_pylist()) <= {"train", "val"}


@pytest.mark.slow
def test_report_cli_reads_the_stage_output(mini_chain):
    import io

    from rich.console import Console

    from pipeline.report import cli as report_cli

    data, planted = mini_chain
    buf = io.StringIO()
    assert report_cli.main(["cleaning", "cc", "--show", "3", "--dir", str(data)],
                            console=Console(file=buf, width=200)) == 0
    out = buf.getvalue()
    assert "removed images (3 of" in out and any(o["image_id"] in out for o in planted["overlaps"])


# --------------------------------------------------------------------------------------------
# scored splits leave pretraining by construction; the pretraining val set is topped up


def test_scored_dev_split_leaves_pretraining_unless_kept_and_origins_are_recorded(world, tmp_path):
    _, data, reports = world
    run = json.loads((data / "clean" / "_run.json").read_text())
    origins = run["eval_splits"]
    assert origins["vqa"] == {"test": ["decontaminate.eval_splits", "finetune vqa test"], "val": ["finetune vqa dev"]}
    assert origins["refcoco"]["testA"] == ["decontaminate.eval_splits", "finetune refcoco_plus test"]
    assert "10" in {e["image_id"] for e in reports["coco"]["removed"]}
    out = copy_manifests(data, tmp_path / "data")
    kept = decontaminate.run(_params(out, "decontaminate.keep_dev_in_pretraining=[vqa]",
                                     image_info=data.parent / "image_info_test2015.json"))
    assert "10" not in {e["image_id"] for e in kept["coco"]["removed"]}  # UNITER's data: VQA val stays
    origins = json.loads((out / "clean" / "_run.json").read_text())["eval_splits"]
    assert origins["vqa"] == {"test": ["decontaminate.eval_splits", "finetune vqa test"]}


def test_top_up_val_draws_whole_images_by_seeded_hash_and_keeps_existing_val():
    ids = ["1", "1", "2", "3", "3", "4", "5"]
    clean = pa.table({"image_id": ids, "split": ["train", "train", "val", "train", "train", "train", "train"]})
    same = decontaminate.top_up_val(clean, 1, seed=7)
    assert same is clean  # enough val images already
    out = decontaminate.top_up_val(clean, 3, seed=7)
    val = {i for i, s in zip(ids, out.column("split").to_pylist()) if s == "val"}
    assert "2" in val and len(val) == 3
    assert all(s == "val" for i, s in zip(ids, out.column("split").to_pylist()) if i in val)  # every row moves
    assert out.schema == clean.schema
    again = decontaminate.top_up_val(clean, 3, seed=7)
    assert again.column("split").to_pylist() == out.column("split").to_pylist()
    # the draw is an order over images: asking for more keeps the earlier ones
    more = decontaminate.top_up_val(clean, 4, seed=7)
    assert val <= {i for i, s in zip(ids, more.column("split").to_pylist()) if s == "val"}
    drawn = {tuple(i for i, s in zip(ids, decontaminate.top_up_val(clean, 2, seed=seed).column("split").to_pylist())
                   if s == "val" and i != "2") for seed in range(12)}
    assert len(drawn) > 1  # the seed matters


def test_top_up_val_never_takes_more_than_half_the_train_images(caplog):
    clean = pa.table({"image_id": [str(i) for i in range(10)], "split": ["train"] * 10})
    with caplog.at_level("WARNING"):
        out = decontaminate.top_up_val(clean, 60, seed=1)
    assert out.column("split").to_pylist().count("val") == 5 and "min_val_images=60" in caplog.text


@pytest.mark.parametrize("batch_rows, workers", [(7, 1), (7, 2), (1 << 20, 2)])
def test_streamed_gives_the_in_memory_bytes_and_report(world, tmp_path, batch_rows, workers):
    """decontaminate_streamed (record batches, sorted runs merged) against decontaminate_dataset (the whole
    table): the same clean parquet bytes and the same report, also when every batch is a few rows and
    batches run on two threads."""
    from pipeline.decontam.eval_set import EvalIndex, read_eval_images

    w, data, _ = world
    params = _params(data, "decontaminate.near_duplicates=false")
    manifests = data / "manifests"
    index = EvalIndex.build(decontaminate.eval_identities(params, read_eval_images(manifests, params.eval_splits())))
    for dataset in ("cc", "sbu", "vg"):
        path, rejects = manifests / f"{dataset}.parquet", manifests / f"{dataset}.rejects.parquet"
        whole = decontaminate.decontaminate_dataset(dataset, pq.read_table(path), pq.read_table(rejects, columns=["reason"]),
                                                    index, finder=None)
        decontaminate.write_parquet(whole.clean, tmp_path / f"{dataset}.whole.parquet")
        runs = tmp_path / f"{dataset}.runs"
        runs.mkdir()
        streamed = decontaminate.decontaminate_streamed(dataset, path, rejects, index, tmp_path / f"{dataset}.parquet",
                                                        runs, finder=None, batch_rows=batch_rows, workers=workers)
        assert streamed.report == whole.report and streamed.samples == whole.samples
        assert (tmp_path / f"{dataset}.parquet").read_bytes() == (tmp_path / f"{dataset}.whole.parquet").read_bytes()
        assert whole.report["removed_rows"] > 0 or dataset == "vg"


def test_merge_runs_orders_rows_across_runs_with_small_buffers(tmp_path):
    from pipeline.decontam import streamed

    rng = np.random.default_rng(0)
    ids = [f"x:{v:012x}" for v in rng.integers(0, 1 << 40, 5000)]
    ids = sorted(set(ids), key=lambda _: rng.random())
    paths = []
    for k in range(0, len(ids), 900):
        part = sorted(ids[k:k + 900])
        paths.append(tmp_path / f"run{k}.arrow")
        streamed._write_run(pa.table({"example_id": part, "n": list(range(len(part)))}), paths[-1], 50)
    merged = pa.concat_tables(list(streamed.merge_runs(paths, "example_id")))
    assert merged.column("example_id").to_pylist() == sorted(ids)
    keys = tmp_path / "keys"
    keys.mkdir()
    key_runs = []
    for k, chunk in enumerate((ids[:3000], ids[2000:])):  # overlapping: 1000 keys in both
        key_runs.append(keys / f"k{k}.arrow")
        streamed._write_run(pa.table({"key": sorted(chunk)}), key_runs[-1], 64)
    assert streamed.count_distinct_runs(key_runs) == len(ids)


def test_sorted_distinct_equals_sorted_set_with_shared_prefixes_and_ties():
    from pipeline.decontam.streamed import sorted_distinct

    rng = np.random.default_rng(1)
    # long shared prefixes (equal 64-bit keys, told apart by the full strings) and repeats
    values = [f"cc:{'ab' * 6}{v:04d}" for v in rng.integers(0, 300, 2000)] + ["", "z", "z", "cc:"]
    assert sorted_distinct(pa.array(values, pa.string())).to_pylist() == sorted(set(values))
    assert sorted_distinct(pa.array([], pa.string())).to_pylist() == []


def test_streamed_gives_the_in_memory_bytes_when_columns_span_many_pages(tmp_path, monkeypatch):
    """A manifest whose columns fill several parquet pages: the streamed row groups, assembled from
    merge rounds (small ones here, as a manifest of many runs has), must be written as the in-memory
    table is (one chunk a column), or the writer's page boundaries, and so the bytes, differ."""
    from pipeline.decontam import streamed as streamed_module
    from pipeline.decontam.eval_set import EVAL_COLUMNS, EvalIndex

    monkeypatch.setattr(streamed_module, "MERGE_BUDGET", 3_000)
    rng = np.random.default_rng(3)
    n = 60_000
    raw = rng.bytes(20 * n).hex()
    ids = [raw[40 * i:40 * (i + 1)] for i in range(n)]  # as ingest's sha1 ids: in no order
    urls = [f"https://img.example.com/{i % 97}/{h[:12]}.jpg" for i, h in enumerate(ids)]
    manifest = pa.table({"example_id": [f"cc:{h}" for h in ids], "dataset": ["cc"] * n, "split": ["train"] * n,
                         "image_source": ["cc"] * n, "image_id": ids, "image_path": [f"cc/{h}.jpg" for h in ids],
                         "url": urls, "text": [f"caption {v}" for v in rng.integers(0, 10**9, n)]})
    path, rejects = tmp_path / "cc.parquet", tmp_path / "cc.rejects.parquet"
    pq.write_table(manifest, path, row_group_size=25_000)
    pq.write_table(pa.table({"reason": pa.array([], pa.string())}), rejects)
    evals = {c: [None, None] for c in EVAL_COLUMNS} | {"ref": ["coco/test/1", "coco/test/2"],
                                                        "image_source": ["coco", "coco"], "image_id": ["1", "2"],
                                                        "url": [urls[5], urls[40_000]]}
    index = EvalIndex.build(pa.table({c: pa.array(v, pa.string()) for c, v in evals.items()}))
    whole = decontaminate.decontaminate_dataset("cc", manifest, pq.read_table(rejects), index, finder=None)
    decontaminate.write_parquet(whole.clean, tmp_path / "whole.parquet")
    runs = tmp_path / "runs"
    runs.mkdir()
    streamed = decontaminate.decontaminate_streamed("cc", path, rejects, index, tmp_path / "streamed.parquet", runs,
                                                    finder=None, batch_rows=7_000, workers=2)
    assert streamed.report == whole.report and whole.report["removed_rows"] == 2
    assert pq.ParquetFile(tmp_path / "whole.parquet").metadata.row_group(0).column(0).total_compressed_size > 1 << 20
    assert (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()


def test_reading_a_manifest_in_batches_holds_about_one_row_group(tmp_path):
    """The streamed path's reader must not keep what it has read: with pyarrow's default
    ``pre_buffer=True`` the range cache held every row group's bytes, and memory grew with the file."""
    from pipeline.decontam.streamed import open_parquet

    rng = np.random.default_rng(4)
    rows, groups = 20_000, 20
    raw = rng.bytes(20 * rows * groups).hex()
    ids = pa.array([raw[40 * i:40 * (i + 1)] for i in range(rows * groups)], pa.string())
    pq.write_table(pa.table({"image_id": ids}), tmp_path / "m.parquet", row_group_size=rows)
    del ids
    file_bytes = (tmp_path / "m.parquet").stat().st_size
    held, before = [], pa.total_allocated_bytes()
    pf = open_parquet(tmp_path / "m.parquet")
    for batch in pf.iter_batches(batch_size=rows // 2, use_threads=False):
        held.append(pa.total_allocated_bytes() - before)
        del batch
    assert len(held) == 2 * groups and max(held) < file_bytes / 4, (max(held), file_bytes)


def test_merge_rounds_stay_large_with_many_runs(tmp_path):
    """Many runs of uniformly spread ids: a round must yield about the buffered rows, not one run's
    batch (which made the merge's cost grow with the square of the run count)."""
    from pipeline.decontam import streamed

    rng = np.random.default_rng(5)
    raw = rng.bytes(20 * 40_000).hex()
    ids = [raw[40 * i:40 * (i + 1)] for i in range(40_000)]
    paths = []
    for k in range(40):  # 40 runs of 1,000 rows, in batches of 50
        paths.append(tmp_path / f"run{k}.arrow")
        streamed._write_run(pa.table({"example_id": sorted(ids[1000 * k:1000 * (k + 1)])}), paths[-1], 50)
    rounds = list(streamed.merge_runs(paths, "example_id"))
    assert pa.concat_tables(rounds).column("example_id").to_pylist() == sorted(ids)
    # ~2,000 rows a round, then up to one round a run as the runs end; one batch a round gave ~800
    assert len(rounds) <= 100, len(rounds)


@pytest.mark.parametrize("missing", ["sbu.parquet", "sbu.rejects.parquet", "vqa.parquet"])
def test_a_manifest_not_yet_ingested_is_one_line_before_any_work(world, tmp_path, capsys, missing):
    """decontaminate run before an ingest it reads: a FileNotFoundError traceback (exit 1), and the
    datasets before the missing one were already decontaminated (the pHash cache written)."""
    from pipeline.__main__ import main

    _, data, _ = world
    out = copy_manifests(data, tmp_path / "data")
    (out / "manifests" / missing).unlink()
    args = ["decontaminate"]
    for item in (f"paths.data={out}", "decontaminate.workers=1", "decontaminate.min_val_images=1",
                 f"sources.coco.image_info_test={data.parent / 'image_info_test2015.json'}"):
        args += ["--set", item]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{missing} does not exist" in err and "ingest" in err, err
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_relative_to(out / "manifests"))
    # the stage's lock only: no pHash cache, clean manifests or reports
    assert written == ["cache", "cache/locks", "cache/locks/decontaminate.lock"], written
