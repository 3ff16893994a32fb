"""Flickr30k (Karpathy ``dataset_flickr30k.json`` + images named by photo id) and SNLI-VE on top."""

from __future__ import annotations

import json

from pipeline.mini_world.task_text import snli_hypothesis
from pipeline.mini_world.text import coco_captions, tokenize
from pipeline.mini_world.world import World, insert_randomly, split_plan

SNLI_SPLIT = {"train": "train", "val": "dev", "test": "test"}
# Real SNLI-VE pairs each image with several premise captions. Three here put 270 hypotheses in test
# (one premise gave 90, 1.1 points each: the demo test's pretraining margin is 2).
PREMISES_PER_IMAGE = 3
SNLI_VE_TEST = "snli_ve/snli_ve_test.jsonl"


def write_flickr30k(world: World) -> None:
    """Images + Karpathy json; leaves photos, splits and captions in ``world.info['flickr30k']``."""
    cfg, rng = world.cfg, world.rng("flickr30k")
    splits = split_plan(rng, cfg.n_flickr30k, {"test": 0.15, "val": 0.15}, "train")
    images, photos, captions, keys = [], {}, {}, []
    sentid = 0
    for imgid, split in enumerate(splits):
        photo = world.photos.new(rng)
        pid = str(photo.photo_id)
        rec = world.new_image(rng, "flickr30k", pid, f"flickr30k/flickr30k-images/{pid}.jpg")
        caps = coco_captions(rng, rec.scene, cfg.captions_per_image)
        sentences = [{"imgid": imgid, "raw": c, "sentid": sentid + k, "tokens": tokenize(c)} for k, c in enumerate(caps)]
        sentid += len(caps)
        images.append({"filename": f"{pid}.jpg", "imgid": imgid, "sentences": sentences,
                       "sentids": [s["sentid"] for s in sentences], "split": split})
        photos[pid], captions[pid] = photo, caps
        keys.append(rec.key)
        world.use(rec.key, "flickr30k", split)
    # defects on train images: unreadable and missing files, a sentence without its text
    train = [i for i, s in enumerate(splits) if s == "train"]
    carriers = [train[int(k)] for k in rng.choice(len(train), size=3, replace=False)]
    world.break_image(keys[carriers[0]], "truncated", "flickr30k")
    world.break_image(keys[carriers[1]], "missing", "flickr30k")
    bad = images[carriers[2]]
    bad["sentences"].append({"imgid": bad["imgid"], "sentid": sentid, "tokens": ["a", "lost", "caption"]})
    bad["sentids"].append(sentid)
    world.reserved.add(keys[carriers[2]])
    world.defect("flickr30k", "flickr30k/dataset_flickr30k.json", sentid, "sentid", "missing_field",
                 "sentence without 'raw'")
    world.write_json("flickr30k/dataset_flickr30k.json", {"dataset": "flickr30k", "images": images})
    world.info["flickr30k"] = {"photos": photos, "split": dict(zip((k.split("/")[1] for k in keys), splits)),
                               "captions": captions, "keys": keys}
    world.counts["flickr30k_images"] = len(images)


def write_snli_ve(world: World) -> None:
    """SNLI-VE jsonl: per usable Flickr30k image ``PREMISES_PER_IMAGE`` premise captions, three hypotheses each."""
    rng = world.rng("snli_ve")
    info = world.info["flickr30k"]
    rows: dict[str, list[bytes]] = {"train": [], "dev": [], "test": []}
    for key in info["keys"]:
        if key in world.reserved or key in world.broken:
            continue
        pid = key.split("/")[1]
        split = SNLI_SPLIT[info["split"][pid]]
        rows[split] += snli_ve_rows(rng, pid, world.images[key].scene, info["captions"][pid])
        world.use(key, "snli_ve", split)
    some = json.loads(rows["train"][0])
    bad_label = _line(some | {"gold_label": "-", "pairID": some["pairID"] + "x"})
    no_field = _line({k: v for k, v in some.items() if k != "sentence2"} | {"pairID": some["pairID"] + "y"})
    malformed = _line(some)[: len(_line(some)) // 2]
    extra = [(bad_label, "bad_label", "gold_label '-'"), (no_field, "missing_field", "no 'sentence2'"),
             (malformed, "malformed_row", "truncated JSON line")]
    train = insert_randomly(rng, [(r, None, None) for r in rows["train"]], extra)
    for lineno, (_, reason, detail) in enumerate(train, start=1):
        if reason:
            world.defect("snli_ve", "snli_ve/snli_ve_train.jsonl", lineno, "line", reason, detail)
    world.write_lines("snli_ve/snli_ve_train.jsonl", [r for r, _, _ in train])
    world.write_lines("snli_ve/snli_ve_dev.jsonl", rows["dev"])
    world.write_lines(SNLI_VE_TEST, rows["test"])
    for split, lines in rows.items():
        world.counts[f"snli_ve_{split}"] = len(lines)


def snli_ve_rows(rng, pid: str, scene, captions: list[str]) -> list[bytes]:
    """SNLI-VE jsonl lines of Flickr30k photo ``pid``: ``PREMISES_PER_IMAGE`` of its ``captions`` as
    premises, each with an entailed, a neutral and a contradicted hypothesis about ``scene``."""
    lines = []
    for cap_idx in sorted(rng.choice(len(captions), size=min(PREMISES_PER_IMAGE, len(captions)), replace=False)):
        for label in ("entailment", "neutral", "contradiction"):
            lines.append(_line({
                "Flikr30kID": f"{pid}.jpg", "annotator_labels": [label], "captionID": f"{pid}.jpg#{cap_idx}",
                "gold_label": label, "pairID": f"{pid}.jpg#{cap_idx}r1{label[0]}", "sentence1": captions[cap_idx],
                "sentence2": snli_hypothesis(rng, scene, label)}))
    return lines


def _line(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()
