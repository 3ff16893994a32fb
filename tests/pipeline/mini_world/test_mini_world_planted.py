"""planted.json of the mini world is the truth: every planted overlap and defect is really in the files.

Overlaps are re-found from the raw files with checks written here (Flickr photo ids parsed from
URLs, an RFC 3986 style canonicalization, pHash distances of the pixel files); defects are
re-detected in the named file at the named locator. The slow test checks pHash separation on the
default-size world.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import imagehash
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from pipeline.params.world import MiniWorldConfig
from helpers.mini_world import small_config
from pipeline.mini_world import generate
from pipeline.mini_world.web import REFCOCO_ONLY, VQA_TEST_ONLY

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

FLICKR_RE = re.compile(r"^https?://(?:farm\d+\.static\.flickr\.com|farm\d+\.staticflickr\.com|live\.staticflickr\.com"
                       r"|static\.flickr\.com)/\d+/(\d+)_[0-9a-f]+(?:_[a-z])?\.jpg$")
OVERLAP_KINDS = {("coco", "flickr_photo_id"), ("vg", "coco_id"), ("vg", "flickr_photo_id"), ("cc", "flickr_photo_id"),
                 ("cc", "canonical_url"), ("cc", "near_duplicate"), ("sbu", "flickr_photo_id"),
                 ("sbu", "near_duplicate")}


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mini_planted") / "world"
    generate(small_config(out), 2024, progress=False)
    return out


@pytest.fixture(scope="module")
def planted(world_dir) -> dict:
    return json.loads((world_dir / "planted.json").read_text())


@pytest.fixture(scope="module")
def scenes(world_dir) -> dict:
    return json.loads((world_dir / "scenes.json").read_text())


def _phash(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return imagehash.phash(im).hash.flatten()


def _canonical(url: str) -> str:
    """Independent canonical form: lower-case scheme/host, no default port, no dot segments, no
    fragment, sorted query, unreserved characters decoded."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port
    if port and not (parts.scheme.lower(), port) in (("http", 80), ("https", 443)):
        host += f":{port}"
    out: list[str] = []
    for seg in parts.path.split("/"):
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    path = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: unquote(m.group(0))
                  if re.fullmatch(r"[A-Za-z0-9\-._~]", unquote(m.group(0))) else m.group(0).upper(), "/".join(out))
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    return f"{parts.scheme.lower()}://{host.lower()}{path}" + (f"?{query}" if query else "")


def _image_path(world_dir: Path, scenes: dict, key: str) -> Path:
    return world_dir / scenes[key]["path"]


def _source_key(match: str) -> str:
    """``dataset/split/image_id`` of an eval match -> ``image_source/image_id`` in scenes.json."""
    dataset, _, image_id = match.split("/", 2)
    source = {"refcoco": "coco", "vqa": "coco", "snli_ve": "flickr30k"}.get(dataset, dataset)
    return f"{source}/{image_id}"


def _pretrain_key(o: dict) -> str:
    return f"{o['dataset']}/{o['image_id']}"


# ---------------------------------------------------------------------------------- overlaps


def _linked(o: dict) -> str | None:
    """Which eval image an overlap reaches only through another dataset's files (None: its own)."""
    return next((k for k in (REFCOCO_ONLY, VQA_TEST_ONLY) if o["variant"].startswith(k)), None)


def test_every_kind_is_planted_n_times(planted):
    n = small_config("x").n_planted_each
    kinds = Counter((o["dataset"], o["reason"]) for o in planted["overlaps"]
                    if o["reason"] != "eval_split" and not _linked(o))
    assert set(kinds) == OVERLAP_KINDS
    assert set(kinds.values()) == {n}
    # RefCOCO+-only and VQA-test-only eval images: CC at COCO-URL variants, SBU at other Flickr URLs
    linked = Counter((o["dataset"], o["reason"], _linked(o)) for o in planted["overlaps"] if _linked(o))
    assert linked == {("cc", "canonical_url", REFCOCO_ONLY): (n + 1) // 2, ("cc", "canonical_url", VQA_TEST_ONLY): n // 2,
                      ("sbu", "flickr_photo_id", REFCOCO_ONLY): n}
    for o in planted["overlaps"]:
        if _linked(o):
            assert {m.split("/")[0] for m in o["matches"]} == {"refcoco" if _linked(o) == REFCOCO_ONLY else "vqa"}
    assert any("/65535/" in o["url"] and o["url"].endswith("_o.jpg") for o in planted["overlaps"] if _linked(o))
    variants = " ".join(o["variant"] for o in planted["overlaps"] if o["reason"] == "canonical_url")
    for v in ("upper_host", "default_port", "dot_segments", "fragment", "query_order", "percent_encoding"):
        assert v in variants
    hosts = {urlsplit(o["url"]).hostname for o in planted["overlaps"] if o["reason"] == "flickr_photo_id" and o["url"]}
    assert len(hosts) >= 3  # several Flickr host forms


def test_matches_name_real_eval_images(world_dir, planted):
    karpathy = {str(im["cocoid"]): im["split"] for im in
                json.loads((world_dir / "coco/karpathy/dataset_coco.json").read_text())["images"]}
    f30k = {im["filename"][:-4]: im["split"] for im in
            json.loads((world_dir / "flickr30k/dataset_flickr30k.json").read_text())["images"]}
    refs = pickle.loads((world_dir / "refcoco+/refs(unc).p").read_bytes())
    ref_split = {str(r["image_id"]): r["split"] for r in refs}
    vqa_images = {split: {str(q["image_id"]) for q in json.loads(
        (world_dir / f"vqa/v2_OpenEnded_mscoco_{name}_questions.json").read_text())["questions"]}
        for split, name in (("test", "test2015"), ("val", "val2014"))}
    for o in planted["overlaps"]:
        assert o["matches"], o
        for m in o["matches"]:
            dataset, split, image_id = m.split("/", 2)
            if dataset == "coco":
                assert split == "test" == karpathy[image_id]
            elif dataset == "refcoco":
                assert split in ("val", "testA", "testB") and ref_split[image_id] == split
            elif dataset == "flickr30k":
                assert f30k[image_id] == split
            elif dataset == "snli_ve":
                assert split in ("dev", "test") and {"dev": "val", "test": "test"}[split] == f30k[image_id]
            elif dataset == "nlvr2":
                assert split in ("dev", "test") and image_id.startswith({"dev": "dev-", "test": "test1-"}[split])
            elif dataset == "vqa":
                assert image_id in vqa_images[split]  # test: test2015; val: scored by finetune@vqa
            else:
                raise AssertionError(m)


def test_overlap_ids_and_urls_are_in_the_files(world_dir, planted):
    cap = {}
    for s in ("train2014", "val2014"):
        for im in json.loads((world_dir / f"coco/annotations/captions_{s}.json").read_text())["images"]:
            cap[str(im["id"])] = im
    vg = {str(r["image_id"]): r for r in json.loads((world_dir / "vg/image_data.json").read_text())}
    cc_urls = {line.split(b"\t")[-1].decode("utf-8", "replace")
               for line in (world_dir / "cc/Train_GCC-training.tsv").read_bytes().splitlines()}
    sbu_urls = set((world_dir / "sbu/SBU_captioned_photo_dataset_urls.txt").read_text().splitlines())
    downloaded = {ds: {row["url"]: world_dir / ds / "images" / shard.stem / f"{row['key']}.jpg"
                       for shard in (world_dir / ds / "images").glob("*.parquet")
                       for row in pq.read_table(shard).to_pylist() if row["status"] == "success"}
                  for ds in ("cc", "sbu")}
    nlvr2_left = {}
    for f in ("dev", "test1"):
        for line in (world_dir / f"nlvr2/{f}.json").read_text().splitlines():
            row = json.loads(line)
            nlvr2_left[row["identifier"].rsplit("-", 1)[0] + "-img0"] = row["left_url"]
    test2015 = {str(im["id"]): im for im in
                json.loads((world_dir / "coco/annotations/image_info_test2015.json").read_text())["images"]}
    assert all("flickr_url" not in im for im in test2015.values())  # as in the real test image list
    for o in planted["overlaps"]:
        targets = [m.split("/", 2)[2] for m in o["matches"]]
        if _linked(o):  # the eval rows carry a COCO id only: the URL is in COCO's own files
            info = cap[targets[0]] if _linked(o) == REFCOCO_ONLY else test2015[targets[0]]
            assert o["url"] in (cc_urls if o["dataset"] == "cc" else sbu_urls)
            if o["reason"] == "canonical_url":
                assert o["url"] != info["coco_url"] and _canonical(o["url"]) == _canonical(info["coco_url"])
            else:
                assert o["reason"] == "flickr_photo_id" and o["url"] != info["flickr_url"]
                assert FLICKR_RE.match(o["url"]).group(1) == FLICKR_RE.match(info["flickr_url"]).group(1)
            continue
        if o["dataset"] == "coco":
            im = cap[o["image_id"]]
            if o["reason"] == "flickr_photo_id":
                assert im["flickr_url"] == o["url"]
                assert FLICKR_RE.match(o["url"]).group(1) in targets
            else:
                assert o["reason"] == "eval_split" and im["coco_url"] == o["url"] and o["image_id"] in targets
        elif o["dataset"] == "vg":
            rec = vg[o["image_id"]]
            assert rec["url"] == o["url"]
            key = "coco_id" if o["reason"] == "coco_id" else "flickr_id"
            assert str(rec[key]) in targets
        else:
            assert o["url"] in (cc_urls if o["dataset"] == "cc" else sbu_urls)
            assert o["image_id"] == hashlib.sha1(o["url"].encode()).hexdigest()
            assert downloaded[o["dataset"]][o["url"]].exists()  # in img2dataset's shards
            if o["reason"] == "flickr_photo_id":
                assert FLICKR_RE.match(o["url"]).group(1) in targets
            elif o["reason"] == "canonical_url":
                target_urls = [cap[t]["coco_url"] if t in cap else nlvr2_left[t] for t in targets]
                assert o["url"] not in target_urls
                assert _canonical(o["url"]) in {_canonical(u) for u in target_urls}
            else:  # near duplicates sit at unrelated URLs (SBU: a Flickr URL of another photo)
                assert o["reason"] == "near_duplicate"
                assert bool(FLICKR_RE.match(o["url"])) == (o["dataset"] == "sbu")
                assert all(_canonical(o["url"]) != _canonical(cap[t]["coco_url"]) for t in targets if t in cap)
                if o["dataset"] == "sbu":
                    assert FLICKR_RE.match(o["url"]).group(1) not in targets


def test_overlapping_copies_show_the_same_pixels(world_dir, planted, scenes):
    for o in planted["overlaps"]:
        mine = _phash(_image_path(world_dir, scenes, _pretrain_key(o)))
        for m in o["matches"]:
            theirs = _phash(_image_path(world_dir, scenes, _source_key(m)))
            dist = int((mine != theirs).sum())
            assert dist <= 4, (o, m, dist)
            if o["reason"] == "near_duplicate":
                a = (world_dir / scenes[_pretrain_key(o)]["path"]).read_bytes()
                b = (world_dir / scenes[_source_key(m)]["path"]).read_bytes()
                assert a != b  # a re-encode, not a byte copy


def test_controls_are_copies_of_images_no_eval_split_uses(world_dir, planted, scenes):
    karpathy = {str(im["cocoid"]): im["split"] for im in
                json.loads((world_dir / "coco/karpathy/dataset_coco.json").read_text())["images"]}
    eval_coco = {m.split("/")[2] for o in planted["overlaps"] for m in o["matches"] if m.split("/")[0] in
                 ("coco", "refcoco")}
    vg = {str(r["image_id"]): r for r in json.loads((world_dir / "vg/image_data.json").read_text())}
    cap = {}
    for s in ("train2014", "val2014"):
        for im in json.loads((world_dir / f"coco/annotations/captions_{s}.json").read_text())["images"]:
            cap[str(im["id"])] = im
    assert len(planted["controls"]) >= 8
    assert Counter(c["dataset"] for c in planted["controls"])["cc"] == 1
    assert Counter(c["dataset"] for c in planted["controls"])["sbu"] == 1
    for c in planted["controls"]:
        coco_id = c["shares_with"].split("/")[1]
        if c["dataset"] == "cc":  # look-alike of the linked plants: a COCO URL variant of a non-eval image
            assert _canonical(c["url"]) == _canonical(cap[coco_id]["coco_url"]) != c["url"]
        elif c["dataset"] == "sbu":  # ... and another URL of a non-eval COCO image's Flickr photo
            assert FLICKR_RE.match(c["url"]).group(1) == FLICKR_RE.match(cap[coco_id]["flickr_url"]).group(1)
        else:
            assert str(vg[c["image_id"]]["coco_id"]) == coco_id
        key = f"{c['dataset']}/{c['image_id']}"
        assert karpathy[coco_id] in ("train", "restval", "val") and coco_id not in eval_coco
        assert scenes[key]["scene"] == scenes[c["shares_with"]]["scene"]


def test_distinct_scenes_are_far_apart_in_phash(world_dir, scenes):
    keys = sorted(scenes)
    hashes = np.stack([_phash(world_dir / scenes[k]["path"]) for k in keys])
    origin = np.array([scenes[k]["scene"] for k in keys])
    dist = (hashes[:, None, :] != hashes[None, :, :]).sum(-1)
    different = origin[:, None] != origin[None, :]
    assert dist[different].min() > 10
    assert dist[~different & ~np.eye(len(keys), dtype=bool)].max() <= 4


# ---------------------------------------------------------------------------------- defects


def _line(world_dir: Path, d: dict) -> bytes:
    return (world_dir / d["file"]).read_bytes().splitlines()[d["locator"] - 1]


def _check_defect(world_dir: Path, d: dict) -> None:
    path, reason, kind = world_dir / d["file"], d["reason"], d["locator_kind"]
    if kind == "image_id":
        if reason == "missing_image":
            assert not path.exists()
        else:
            data = path.read_bytes()
            assert reason == "unreadable_image"
            if data:
                with pytest.raises(OSError), Image.open(path) as im:
                    im.load()
        return
    if kind == "line":
        line = _line(world_dir, d)
        if d["file"].endswith((".jsonl", ".json")):
            if reason == "malformed_row":
                with pytest.raises(json.JSONDecodeError):
                    json.loads(line)
                return
            row = json.loads(line)
            if reason == "missing_field":
                field = {"nlvr2": "sentence", "snli_ve": "sentence2", "vcr": "answer_choices"}[d["dataset"]]
                assert field not in row
            elif reason == "bad_label":
                assert row.get("label", row.get("gold_label")) not in (
                    "True", "False", "entailment", "neutral", "contradiction")
            else:
                raise AssertionError(d)
        elif d["file"].endswith(".tsv"):
            if reason == "malformed_row":
                assert b"\t" not in line
            elif reason == "missing_caption":
                assert line.split(b"\t")[0] == b""
            elif reason == "non_utf8":
                with pytest.raises(UnicodeDecodeError):
                    line.decode("utf-8")
            elif reason == "bad_url":
                url = line.decode().split("\t")[1]
                assert not re.match(r"^https?://[^/\s]+/\S*$", url)
            else:
                raise AssertionError(d)
        else:  # SBU parallel files
            if reason == "non_utf8":
                with pytest.raises(UnicodeDecodeError):
                    line.decode("utf-8")
            elif reason == "missing_caption":
                assert line.strip() == b""
            elif reason == "bad_url":
                assert not re.match(r"^https?://[^/\s]+/\S*$", line.decode())
            else:
                raise AssertionError(d)
        return
    doc = pickle.loads(path.read_bytes()) if path.suffix == ".p" else json.loads(path.read_text())
    if kind == "annotation_index":
        ann = doc["annotations"][d["locator"]]
        if reason == "duplicate_id":
            first = next(i for i, a in enumerate(doc["annotations"]) if a["id"] == ann["id"])
            assert first < d["locator"]
        elif reason == "missing_field":
            assert "image_id" not in ann
        else:
            assert reason == "missing_caption" and ann["caption"] == ""
    elif kind == "question_index":
        q = doc["questions"][d["locator"]]
        if reason == "duplicate_id":
            assert [x["question_id"] for x in doc["questions"]].count(q["question_id"]) == 2
        else:
            assert reason == "missing_field" and "question" not in q
    elif kind == "region_id":
        region = next(r for img in doc for r in img["regions"] if r["region_id"] == d["locator"])
        assert ("phrase" not in region) if reason == "missing_field" else (region["phrase"] == "")
    elif kind == "ref_id":
        ref = next(r for r in doc if r["ref_id"] == d["locator"])
        assert ("ann_id" not in ref) if reason == "missing_field" else (ref["sentences"][0]["sent"] == "")
    elif kind == "sentid":
        sent = next(s for im in doc["images"] for s in im["sentences"] if s["sentid"] == d["locator"])
        assert reason == "missing_field" and "raw" not in sent
    else:
        raise AssertionError(d)


def test_every_defect_is_in_its_file(world_dir, planted):
    assert len(planted["defects"]) >= 30
    by_dataset = Counter(d["dataset"] for d in planted["defects"])
    assert set(by_dataset) == {"coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco"}
    assert {d["reason"] for d in planted["defects"]} == {
        "unreadable_image", "missing_image", "malformed_row", "missing_field", "missing_caption", "non_utf8",
        "bad_url", "duplicate_id", "bad_label"}
    for d in planted["defects"]:
        _check_defect(world_dir, d)


def test_broken_images_are_left_out_of_scenes(world_dir, planted, scenes):
    paths = {sc["path"] for sc in scenes.values()}
    for d in planted["defects"]:
        if d["locator_kind"] == "image_id":
            assert d["file"] not in paths


@pytest.mark.slow
def test_default_world_phash_separation(tmp_path):
    """On the default-size world: distinct scenes > 10 bits apart, planted copies within 4."""
    out = tmp_path / "default"
    generate(MiniWorldConfig(out_dir=out), 1234, progress=False)
    scenes = json.loads((out / "scenes.json").read_text())
    planted = json.loads((out / "planted.json").read_text())
    keys = sorted(scenes)
    hashes = np.packbits(np.stack([_phash(out / scenes[k]["path"]) for k in keys]), axis=1).view(">u8")[:, 0]
    origin = np.array([scenes[k]["scene"] for k in keys])
    worst_distinct, worst_same = 64, 0
    _, scene = np.unique(origin, return_inverse=True)
    for start in range(0, len(keys), 512):  # every pair once, a block of rows at a time
        rows = np.arange(start, min(start + 512, len(keys)))
        dist = np.bitwise_count(hashes[rows, None] ^ hashes[None, :]).astype(int)
        later = np.arange(len(keys))[None, :] > rows[:, None]
        same = scene[rows, None] == scene[None, :]
        if (later & ~same).any():
            worst_distinct = min(worst_distinct, int(dist[later & ~same].min()))
        if (later & same).any():
            worst_same = max(worst_same, int(dist[later & same].max()))
    assert worst_distinct > 10
    assert worst_same <= 4
    near = [o for o in planted["overlaps"] if o["reason"] == "near_duplicate"]
    assert len(near) == 2 * MiniWorldConfig().n_planted_each
    assert len(keys) > 1900
