"""COCO 2014: captions and instances json per split, Karpathy ``dataset_coco.json``, the images,
and the test2015 images VQA tests on. Plants COCO images that are Flickr30k photos."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from pipeline.mini_world.scenes import CATEGORIES, CATEGORY_ID
from pipeline.mini_world.text import coco_captions, tokenize
from pipeline.mini_world.urlforms import coco_url, flickr_url, flickr_variant
from pipeline.mini_world.world import World, split_plan

TEST2015_INFO = "coco/annotations/image_info_test2015.json"
LICENSES = [{"id": 1, "name": "Mini World License", "url": "https://example.org/mini-world-license"}]


def categories() -> list[dict]:
    return [{"id": CATEGORY_ID[(c, s)], "name": f"{c} {s}", "supercategory": s} for c, s in CATEGORIES]


def _info(split: str) -> dict:
    return {"description": f"mini world COCO {split}", "version": "1.0", "year": 2014,
            "contributor": "uniter-pipeline mini_world", "date_created": "2014-01-01 00:00:00.000000"}


def write_coco(world: World) -> None:
    """Write every COCO file; leave ids, splits, captions and instance ids in ``world.info['coco']``."""
    cfg, rng = world.cfg, world.rng("coco")
    n = cfg.n_coco
    n_val2014 = max(3, n // 3)
    ids = (rng.choice(581_929, size=n + cfg.n_vqa_test, replace=False) + 1).tolist()
    coco_split = ["train2014"] * (n - n_val2014) + ["val2014"] * n_val2014
    # Karpathy: every train2014 image is "train"; val2014 is cut into val, test and restval
    kval = split_plan(rng, n_val2014, {"val": 0.3, "test": 0.3}, "restval")
    karpathy = ["train"] * (n - n_val2014) + kval
    # which Karpathy-train images are planted copies of Flickr30k photos
    flickr_pool = [k for k in world.info["flickr30k"]["keys"] if k not in world.reserved]
    f_targets = [flickr_pool[int(i)] for i in rng.choice(len(flickr_pool), size=cfg.n_planted_each, replace=False)]
    f_slots = sorted(int(i) for i in rng.choice(n - n_val2014, size=cfg.n_planted_each, replace=False))
    plants = dict(zip(f_slots, f_targets))

    by_split: dict[str, dict] = {s: {"images": [], "captions": [], "instances": []} for s in ("train2014", "val2014")}
    kimages, info = [], {"split": {}, "coco_split": {}, "captions": {}, "ann_ids": {}, "keys": [], "coco_url": {}, "flickr_id": {},
                       "photo": {}}
    cap_ids = iter(sorted((rng.choice(900_000, size=n * cfg.captions_per_image, replace=False) + 1).tolist()))
    inst_ids = iter(sorted((rng.choice(2_200_000, size=n * cfg.max_objects, replace=False) + 1).tolist()))
    sentid = 0
    for idx in range(n):
        cid, csplit, ksplit = ids[idx], coco_split[idx], karpathy[idx]
        fname = f"COCO_{csplit}_{cid:012d}.jpg"
        relpath = f"coco/images/{csplit}/{fname}"
        if idx in plants:
            src = plants[idx]
            rec = world.copy_image(src, "coco", str(cid), relpath)
            furl, variant = flickr_variant(rng, world.info["flickr30k"]["photos"][src.split("/")[1]], None)
            world.overlap("coco", str(cid), furl, "flickr_photo_id", [src], variant)
            world.reserved.add(rec.key)
            photo = world.info["flickr30k"]["photos"][src.split("/")[1]]
            photo_id = photo.photo_id
        else:
            rec = world.new_image(rng, "coco", str(cid), relpath)
            photo = world.photos.new(rng)
            furl = flickr_url(photo, "farm_staticflickr", size="z", https=False)
            photo_id = photo.photo_id
        caps = coco_captions(rng, rec.scene, cfg.captions_per_image)
        url = coco_url(csplit, fname)
        anns = add_coco_entries(by_split[csplit], kimages, rec, csplit, furl, caps, cap_ids, inst_ids, sentid, ksplit)
        sentid += len(caps)
        info["split"][rec.key], info["coco_split"][rec.key] = ksplit, csplit
        info["captions"][rec.key], info["ann_ids"][rec.key] = caps, [a["id"] for a in anns]
        info["coco_url"][rec.key], info["flickr_id"][rec.key] = url, photo_id
        info["photo"][rec.key] = photo  # later writers spell other URLs of the same photo
        info["keys"].append(rec.key)
        world.use(rec.key, "coco", ksplit)
    info["train2014"] = by_split["train2014"]
    world.info["coco"] = info
    _plant_defects(world, rng, by_split["train2014"], [k for k in info["keys"] if info["coco_split"][k] == "train2014"])
    for csplit, parts in by_split.items():
        world.write_json(f"coco/annotations/captions_{csplit}.json", {
            "annotations": parts["captions"], "images": parts["images"], "info": _info(csplit), "licenses": LICENSES})
        world.write_json(f"coco/annotations/instances_{csplit}.json", {
            "annotations": parts["instances"], "categories": categories(), "images": parts["images"],
            "info": _info(csplit), "licenses": LICENSES})
        world.counts[f"coco_{csplit}_images"] = len(parts["images"])
        world.counts[f"coco_{csplit}_captions"] = len(parts["captions"])
    world.write_json("coco/karpathy/dataset_coco.json", {"dataset": "coco", "images": kimages})
    for ks in ("train", "restval", "val", "test"):
        world.counts[f"coco_karpathy_{ks}"] = sum(1 for im in kimages if im["split"] == ks)
    _write_test2015(world, rng, ids[n:])


def add_coco_entries(parts: dict, kimages: list[dict], rec, csplit: str, furl: str, caps: list[str],
                     cap_ids: Iterator[int], inst_ids: Iterator[int], sentid: int, ksplit: str) -> list[dict]:
    """COCO image ``rec`` of ``csplit`` into ``parts`` (its image, caption and instance entries, ids
    from ``cap_ids`` / ``inst_ids``) and into the Karpathy ``kimages`` (split ``ksplit``, sentence ids
    from ``sentid``); returns its instance annotations (one per scene object)."""
    cid, (w, h) = int(rec.image_id), rec.scene.size
    fname = f"COCO_{csplit}_{cid:012d}.jpg"
    parts["images"].append({"coco_url": coco_url(csplit, fname), "date_captured": "2013-11-14 16:28:13",
                            "file_name": fname, "flickr_url": furl, "height": h, "id": cid, "license": 1, "width": w})
    for cap in caps:
        parts["captions"].append({"caption": cap, "id": next(cap_ids), "image_id": cid})
    anns = []
    for obj in rec.scene.objects:
        x, y, bw, bh = obj.xywh()
        anns.append({"area": bw * bh, "bbox": [x, y, bw, bh], "category_id": obj.category_id, "id": next(inst_ids),
                     "image_id": cid, "iscrowd": 0, "segmentation": [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]})
    parts["instances"] += anns
    imgid = len(kimages)
    sentences = [{"imgid": imgid, "raw": c, "sentid": sentid + k, "tokens": tokenize(c)} for k, c in enumerate(caps)]
    kimages.append({"cocoid": cid, "filename": fname, "filepath": csplit, "imgid": imgid, "sentences": sentences,
                    "sentids": [s["sentid"] for s in sentences], "split": ksplit})
    return anns


def _plant_defects(world: World, rng: np.random.Generator, train: dict, train_keys: list[str]) -> None:
    """Unreadable/missing images and broken caption annotations in captions_train2014.json."""
    fname = "coco/annotations/captions_train2014.json"
    usable = [k for k in train_keys if k not in world.reserved]
    carriers = [usable[int(i)] for i in rng.choice(len(usable), size=3, replace=False)]
    for key, kind in zip(carriers, ("truncated", "empty", "missing")):
        world.break_image(key, kind, "coco")
    caps = train["captions"]
    victim = caps[int(rng.integers(len(caps)))]
    extra = [
        ({"caption": "A duplicate annotation id.", "id": victim["id"], "image_id": victim["image_id"]},
         "duplicate_id", f"annotation id {victim['id']} appears twice"),
        ({"caption": "A caption whose image id is missing.", "id": 950_001}, "missing_field", "no 'image_id'"),
        ({"caption": "", "id": 950_002, "image_id": victim["image_id"]}, "missing_caption", "empty caption"),
    ]
    for ann, reason, detail in extra:
        # after the original so that the first occurrence of a duplicated id stays the valid one
        first = caps.index(victim) + 1
        pos = int(rng.integers(first, len(caps) + 1))
        caps.insert(pos, ann)
    for ann, reason, detail in extra:
        world.defect("coco", fname, next(i for i, a in enumerate(caps) if a is ann), "annotation_index", reason,
                     detail)


def write_test2015_image(world: World, rng: np.random.Generator, cid: int) -> tuple[str, dict]:
    """One COCO test2015 image with id ``cid``: its key and its image_info entry."""
    fname = f"COCO_test2015_{cid:012d}.jpg"
    rec = world.new_image(rng, "coco", str(cid), f"coco/images/test2015/{fname}")
    w, h = rec.scene.size
    return rec.key, {"coco_url": coco_url("test2015", fname), "date_captured": "2013-11-14 16:28:13",
                     "file_name": fname, "height": h, "id": cid, "license": 1, "width": w}


def _write_test2015(world: World, rng: np.random.Generator, ids: list[int]) -> None:
    """COCO test2015 images (VQA's test split) and their image_info file."""
    images, keys = [], []
    for cid in ids:
        key, image = write_test2015_image(world, rng, cid)
        images.append(image)
        keys.append(key)
    world.write_json(TEST2015_INFO, {
        "categories": categories(), "images": images, "info": _info("test2015"), "licenses": LICENSES})
    world.info["coco"]["test2015_keys"] = keys
    world.info["coco"]["coco_url"].update({k: im["coco_url"] for k, im in zip(keys, images)})
    world.counts["coco_test2015_images"] = len(images)
