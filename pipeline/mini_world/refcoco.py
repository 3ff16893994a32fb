"""RefCOCO+ (UNC splits): ``refs(unc).p`` (a pickle of plain dicts) + ``instances.json`` over COCO
train2014 images. Expressions use appearance words only; testA/testB split targets by shape group
(the mini analogue of people vs. other objects). ``mini_world.refcoco_expressions: comparing`` adds
expressions that compare regions (``task_text.comparing_expressions``)."""

from __future__ import annotations

import pickle

from pipeline.mini_world.coco import LICENSES, categories
from pipeline.mini_world.scenes import SHAPES
from pipeline.mini_world.task_text import referring_expressions
from pipeline.mini_world.text import tokenize
from pipeline.mini_world.world import World

TEST_A_SHAPES = set(SHAPES[:3])


def write_refcoco(world: World) -> None:
    cfg, rng = world.cfg, world.rng("refcoco")
    coco = world.info["coco"]
    pool = [k for k in coco["keys"] if coco["coco_split"][k] == "train2014" and k not in world.reserved
            and len(world.images[k].scene.objects) >= 2]
    pool = [pool[int(i)] for i in rng.permutation(len(pool))][: cfg.n_refcoco_images]
    n_eval = max(1, round(0.1 * len(pool)))
    quota = {"val": n_eval, "testA": n_eval, "testB": n_eval}
    refs, ref_id, sent_id, used = [], 0, 0, []
    for key in pool:
        split = next((s for s, q in quota.items() if q > 0), "train")
        scene = world.images[key].scene
        image_id = int(key.split("/")[1])
        made = 0
        for t, obj in enumerate(scene.objects):
            if split == "testA" and obj.shape not in TEST_A_SHAPES or split == "testB" and obj.shape in TEST_A_SHAPES:
                continue
            exps = referring_expressions(rng, scene, t, comparing=cfg.refcoco_expressions == "comparing")
            if not exps:
                continue
            ann_id = coco["ann_ids"][key][t]
            sents = [{"raw": e, "sent": e, "sent_id": sent_id + k, "tokens": tokenize(e)} for k, e in enumerate(exps)]
            sent_id += len(sents)
            refs.append({"ann_id": ann_id, "category_id": obj.category_id,
                         "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg", "image_id": image_id,
                         "ref_id": ref_id, "sent_ids": [s["sent_id"] for s in sents], "sentences": sents,
                         "split": split})
            ref_id += 1
            made += 1
        if made:
            if split in quota:
                quota[split] -= 1
            used.append(key)
            world.use(key, "refcoco", split)
    _plant_defects(world, refs, ref_id, sent_id)
    # a pickle of plain containers only, like the released file (protocol 2 reads everywhere)
    world.write_bytes("refcoco+/refs(unc).p", pickle.dumps(refs, protocol=2))
    used_set = {int(k.split("/")[1]) for k in used}
    train = world.info["coco"]["train2014"]
    images = [im for im in train["images"] if im["id"] in used_set]
    anns = [a for a in train["instances"] if a["image_id"] in used_set]
    world.write_json("refcoco+/instances.json", {"annotations": anns, "categories": categories(), "images": images,
                                                 "info": {"description": "mini world RefCOCO+"},
                                                 "licenses": LICENSES})
    for split in ("train", "val", "testA", "testB"):
        world.counts[f"refcoco_{split}_refs"] = sum(1 for r in refs if r["split"] == split)
    world.info["refcoco"] = {"eval_keys": [k for k in used if world.is_eval(k)]}


def _plant_defects(world: World, refs: list[dict], ref_id: int, sent_id: int) -> None:
    """Two extra train refs: one without ``ann_id``, one whose only sentence is empty."""
    base = next(r for r in refs if r["split"] == "train")
    no_ann = {k: v for k, v in base.items() if k != "ann_id"} | {
        "ref_id": ref_id, "sent_ids": [sent_id],
        "sentences": [{"raw": "lost box", "sent": "lost box", "sent_id": sent_id, "tokens": ["lost", "box"]}]}
    empty = base | {"ref_id": ref_id + 1, "sent_ids": [sent_id + 1],
                    "sentences": [{"raw": "", "sent": "", "sent_id": sent_id + 1, "tokens": []}]}
    refs += [no_ann, empty]
    world.defect("refcoco", "refcoco+/refs(unc).p", ref_id, "ref_id", "missing_field", "ref without 'ann_id'")
    world.defect("refcoco", "refcoco+/refs(unc).p", ref_id + 1, "ref_id", "missing_caption", "empty sentence")
