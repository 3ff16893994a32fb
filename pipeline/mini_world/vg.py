"""Visual Genome: ``image_data.json`` + ``region_descriptions.json`` + images.

As in the real VG, a share of the images are COCO images (``coco_id`` set, same pixels). Planted:
VG copies of COCO eval images (reason ``coco_id``), VG images that are Flickr30k photos
(``flickr_id``, reason ``flickr_photo_id``); controls: VG copies of COCO *train* images, kept.
"""

from __future__ import annotations

import numpy as np

from pipeline.mini_world.text import region_phrases
from pipeline.mini_world.world import World


def _entries(world: World, rng: np.random.Generator) -> list[dict]:
    """What each VG image is: own scene, a COCO copy (planted or control) or a Flickr30k copy."""
    cfg = world.cfg
    coco, flickr = world.info["coco"], world.info["flickr30k"]
    entries: list[dict] = [{"kind": "own", "flickr": rng.random() < 0.5} for _ in range(cfg.n_vg_only)]
    test = [k for k in coco["keys"] if coco["split"][k] == "test" and k not in world.reserved]
    ref_eval = list(world.info["refcoco"]["eval_keys"])
    for i in range(cfg.n_planted_each):  # alternate the two kinds of COCO eval image
        pool = test if (i % 2 == 0 and test) or not ref_eval else ref_eval
        key = pool.pop(int(rng.integers(len(pool))))
        variant = "coco_id of a COCO Karpathy test image" if coco["split"][key] == "test" \
            else "coco_id of a RefCOCO+ val/testA/testB image"
        entries.append({"kind": "coco_eval", "src": key, "variant": variant})
    harmless = [k for k in coco["keys"] if k not in world.reserved and not world.is_eval(k)]
    for i in rng.choice(len(harmless), size=min(len(harmless), max(cfg.n_planted_each, cfg.n_vg_only // 2)),
                        replace=False):
        entries.append({"kind": "coco_train", "src": harmless[int(i)]})
    fpool = [k for k in flickr["keys"] if k not in world.reserved]
    for i in rng.choice(len(fpool), size=cfg.n_planted_each, replace=False):
        entries.append({"kind": "flickr", "src": fpool[int(i)]})
    return entries


def write_vg(world: World) -> None:
    rng = world.rng("vg")
    entries = _entries(world, rng)
    vg_ids = sorted((rng.choice(2_400_000, size=len(entries), replace=False) + 1).tolist())
    order = rng.permutation(len(entries))  # COCO copies are spread over the id range, as in VG
    image_data, regions_doc, keys = [], [], []
    region_id = 1
    for vg_id, e in zip(vg_ids, (entries[int(i)] for i in order)):
        relpath = f"vg/images/{vg_id}.jpg"
        folder = "VG_100K" if vg_id < 1_200_000 else "VG_100K_2"
        url = f"https://cs.stanford.edu/people/rak248/{folder}/{vg_id}.jpg"
        coco_id = flickr_id = None
        if e["kind"] == "own":
            rec = world.new_image(rng, "vg", str(vg_id), relpath)
            if e["flickr"]:
                flickr_id = world.photos.new(rng).photo_id
        else:
            rec = world.copy_image(e["src"], "vg", str(vg_id), relpath)
            src_id = e["src"].split("/")[1]
            if e["kind"] == "flickr":
                flickr_id = int(src_id)
                world.overlap("vg", str(vg_id), url, "flickr_photo_id", [e["src"]], "flickr_id of a Flickr30k image")
            else:
                coco_id = int(src_id)
                # real VG keeps the COCO photo's Flickr id too
                flickr_id = int(world.info["coco"]["flickr_id"][e["src"]])
                if e["kind"] == "coco_eval":
                    world.overlap("vg", str(vg_id), url, "coco_id", [e["src"]], e["variant"])
                else:
                    world.control("vg", str(vg_id), url, e["src"], "coco_id of a COCO train/restval/val image")
        w, h = rec.scene.size
        image_data.append({"coco_id": coco_id, "flickr_id": flickr_id, "height": h, "image_id": vg_id, "url": url,
                           "width": w})
        regions = []
        for phrase, (x, y, rw, rh) in region_phrases(rng, rec.scene):
            regions.append({"height": int(rh), "image_id": vg_id, "phrase": phrase, "region_id": region_id,
                            "width": int(rw), "x": int(x), "y": int(y)})
            region_id += 1
        regions_doc.append({"id": vg_id, "regions": regions})
        keys.append((rec.key, e["kind"]))
    _plant_defects(world, rng, keys, regions_doc)
    world.write_json("vg/image_data.json", image_data)
    world.write_json("vg/region_descriptions.json", regions_doc)
    world.counts["vg_images"] = len(image_data)
    world.counts["vg_regions"] = sum(len(r["regions"]) for r in regions_doc)
    world.counts["vg_coco_copies"] = sum(1 for d in image_data if d["coco_id"] is not None)


def _plant_defects(world: World, rng: np.random.Generator, keys: list[tuple[str, str]], regions_doc: list[dict]):
    own = [k for k, kind in keys if kind == "own"]
    a, b = (own[int(i)] for i in rng.choice(len(own), size=2, replace=False))
    world.break_image(a, "truncated", "vg")
    world.break_image(b, "missing", "vg")
    fname = "vg/region_descriptions.json"
    by_id = {str(doc["id"]): doc for doc in regions_doc}
    intact = [k for k in own if k not in (a, b)]
    victims = [by_id[intact[int(i)].split("/")[1]] for i in rng.choice(len(intact), size=2, replace=False)]
    r = victims[0]["regions"][0]
    del r["phrase"]
    world.defect("vg", fname, r["region_id"], "region_id", "missing_field", "region without 'phrase'")
    r = victims[1]["regions"][-1]
    r["phrase"] = ""
    world.defect("vg", fname, r["region_id"], "region_id", "missing_caption", "empty phrase")
