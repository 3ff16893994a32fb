"""RefCOCO+ (UNC splits): ``refs(unc).p`` (a pickle of plain dicts) + ``instances.json`` over COCO
train2014 images. Expressions use appearance words only; testA/testB split targets by shape group
(the mini analogue of people vs. other objects). ``mini_world.refcoco_expressions: comparing`` adds
expressions that compare regions (``task_text.comparing_expressions``). ``mini_world.refcoco_unseen_kinds``
leaves some colour-shape kinds out of the train split's targets (:func:`unseen_kinds`): real RefCOCO+
asks its test split for appearance words its train split has seen rarely or never."""

from __future__ import annotations

import pickle

from pipeline.mini_world.coco import LICENSES, categories
from pipeline.mini_world.scenes import COLOURS, SHAPES
from pipeline.mini_world.task_text import naming_expressions, referring_expressions
from pipeline.mini_world.text import tokenize
from pipeline.mini_world.world import World

TEST_A_SHAPES = set(SHAPES[:3])
REFS = "refcoco+/refs(unc).p"
INSTANCES = "refcoco+/instances.json"


def write_refcoco(world: World) -> None:
    cfg, rng = world.cfg, world.rng("refcoco")
    coco = world.info["coco"]
    pool = [k for k in coco["keys"] if coco["coco_split"][k] == "train2014" and k not in world.reserved
            and len(world.images[k].scene.objects) >= 2]
    pool = [pool[int(i)] for i in rng.permutation(len(pool))][: cfg.n_refcoco_images]
    n_eval = max(1, round(0.1 * len(pool)))
    quota = {"val": n_eval, "testA": n_eval, "testB": n_eval}
    refs, used = [], []
    for key in pool:
        split = next((s for s, q in quota.items() if q > 0), "train")
        made = write_image_refs(world, rng, key, split, coco["ann_ids"][key], refs)
        if made:
            if split in quota:
                quota[split] -= 1
            used.append(key)
    _plant_defects(world, refs, len(refs), sum(len(r["sentences"]) for r in refs))
    # a pickle of plain containers only, like the released file (protocol 2 reads everywhere)
    world.write_bytes(REFS, pickle.dumps(refs, protocol=2))
    used_set = {int(k.split("/")[1]) for k in used}
    train = world.info["coco"]["train2014"]
    images = [im for im in train["images"] if im["id"] in used_set]
    anns = [a for a in train["instances"] if a["image_id"] in used_set]
    world.write_json(INSTANCES, {"annotations": anns, "categories": categories(), "images": images,
                                                 "info": {"description": "mini world RefCOCO+"},
                                                 "licenses": LICENSES})
    for split in ("train", "val", "testA", "testB"):
        world.counts[f"refcoco_{split}_refs"] = sum(1 for r in refs if r["split"] == split)
    world.info["refcoco"] = {"eval_keys": [k for k in used if world.is_eval(k)]}


def unseen_kinds(n: int) -> frozenset[tuple[str, str]]:
    """The first ``n`` (colour, shape) kinds of the diagonal order: kind i has colour i mod 5 and shape
    i mod 6, which runs through all 30 kinds once (5 and 6 are coprime), so the kinds left out spread
    over the colours and shapes as evenly as ``n`` allows and every word keeps seen kinds."""
    colours = list(COLOURS)
    return frozenset((colours[i % len(colours)], SHAPES[i % len(SHAPES)]) for i in range(n))


def in_split(split: str, shape: str) -> bool:
    """Whether a target of ``shape`` may be referred to in ``split`` (testA / testB part the shapes)."""
    return not (split == "testA" and shape not in TEST_A_SHAPES or split == "testB" and shape in TEST_A_SHAPES)


def has_refs(scene, split: str) -> bool:
    """Whether :func:`write_image_refs` finds a target in ``scene`` for ``split`` (some object of the
    split's shapes that appearance words single out)."""
    return any(in_split(split, o.shape) and naming_expressions(scene, t) for t, o in enumerate(scene.objects))


def write_image_refs(world: World, rng, key: str, split: str, ann_ids: list[int], refs: list[dict]) -> int:
    """The refs of COCO image ``key`` in ``split`` (testA: targets of the first shapes, testB: the
    others; train: none of the unseen kinds), appended to ``refs`` with ref and sentence ids counting
    on; returns how many (0: the image is not used)."""
    scene = world.images[key].scene
    image_id = int(key.split("/")[1])
    ref_id, sent_id = len(refs), sum(len(r["sentences"]) for r in refs)
    unseen = unseen_kinds(world.cfg.refcoco_unseen_kinds) if split == "train" else frozenset()
    made = 0
    for t, obj in enumerate(scene.objects):
        if not in_split(split, obj.shape) or (obj.colour, obj.shape) in unseen:
            continue
        exps = referring_expressions(rng, scene, t, comparing=world.cfg.refcoco_expressions == "comparing")
        if not exps:
            continue
        ann_id = ann_ids[t]
        sents = [{"raw": e, "sent": e, "sent_id": sent_id + k, "tokens": tokenize(e)} for k, e in enumerate(exps)]
        sent_id += len(sents)
        refs.append({"ann_id": ann_id, "category_id": obj.category_id,
                     "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg", "image_id": image_id,
                     "ref_id": ref_id + made, "sent_ids": [s["sent_id"] for s in sents], "sentences": sents,
                     "split": split})
        made += 1
    if made:
        world.use(key, "refcoco", split)
    return made


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
