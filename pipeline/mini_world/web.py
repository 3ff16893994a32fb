"""Conceptual Captions (TSV ``caption<TAB>url``) and SBU (parallel url / caption lines), with their
downloaded images in img2dataset's shard layout below ``images/`` (pipeline/mini_world/shards.py;
rendered at ``images/<sha1(url)>.jpg`` first, moved into the shards once the line order is known).

Planted: rows at Flickr URLs of eval photos (``flickr_photo_id``), CC rows at spelling variants of
eval image URLs (``canonical_url``), rows at unrelated URLs whose image is a re-encode of an eval
image (``near_duplicate``); and line/row/image defects.

Also planted, on eval images whose own eval rows name a COCO id and nothing else (RefCOCO+ val/testA/
testB and VQA test images, known by URL only through COCO's files): CC rows at spelling variants of
their ``coco_url`` and SBU rows at other URLs of their Flickr photo; and, as controls that must be
kept, the same kinds of URL of COCO images no eval split uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.mini_world.shards import lay_out
from pipeline.mini_world.text import web_caption
from pipeline.mini_world.urlforms import (
    flickr_url, flickr_variant, original_url, sha1_key, url_variant, web_url,
)
from pipeline.mini_world.world import World, insert_randomly

URL_VARIANTS = ("upper_host", "default_port", "dot_segments", "fragment", "query_order", "percent_encoding")
# spellings of a COCO URL seen in the wild (the ones of the issue that found the gap)
COCO_URL_VARIANTS = ("upper_host", "default_port", "dot_segments", "fragment")
# variant descriptions start with these, so tests can tell these plants from the others
REFCOCO_ONLY, VQA_TEST_ONLY = "RefCOCO+-only image", "VQA-test-only image"


@dataclass
class Row:
    caption: bytes
    url: str
    defect: tuple[str, str] | None = None  # (reason, detail) of a planted line defect
    image_key: str | None = None


def _eval_pools(world: World, rng: np.random.Generator) -> dict[str, list[str]]:
    coco, flickr = world.info["coco"], world.info["flickr30k"]
    ok = lambda k: k not in world.broken and k not in world.reserved  # noqa: E731
    test = [k for k in coco["keys"] if coco["split"][k] == "test" and ok(k)]
    fl = [k for k in flickr["keys"] if ok(k)]
    fl_eval = [k for k in fl if flickr["split"][k.split("/")[1]] in ("val", "test")]
    shuffle = lambda xs: [xs[int(i)] for i in rng.permutation(len(xs))]  # noqa: E731
    fl_train = [k for k in fl if k not in fl_eval]
    # pools are popped from the end: Flickr-URL plants take train photos first, leaving the
    # val/test photos to the near-duplicate plants (every Flickr30k image is an eval image)
    return {"flickr": shuffle(fl_eval) + shuffle(fl_train), "coco_test": shuffle(test),
            "near": shuffle(test + fl_eval)}


def _take(world: World, pool: list[str]) -> str:
    """The next eval image of ``pool`` that no planted overlap uses yet (one plant per eval image)."""
    used = {t for o in world.overlaps for t in o["targets"]}
    while pool:
        key = pool.pop()
        if key not in used:
            return key
    raise RuntimeError("not enough eval images to plant overlaps on; raise the world sizes")


def _own(world: World, rng: np.random.Generator, dataset: str, url: str) -> Row:
    rec = world.new_image(rng, dataset, sha1_key(url), f"{dataset}/images/{sha1_key(url)}.jpg")
    return Row(web_caption(rng, rec.scene, dataset).encode(), url, image_key=rec.key)


def _copy(world: World, rng: np.random.Generator, dataset: str, url: str, src: str, *, reencode: bool) -> Row:
    png = world.images[src].relpath.endswith(".png")
    quality = int(rng.integers(60, 86)) if reencode else (95 if png else None)
    rec = world.copy_image(src, dataset, sha1_key(url), f"{dataset}/images/{sha1_key(url)}.jpg", rng, quality)
    return Row(web_caption(rng, rec.scene, dataset).encode(), url, image_key=rec.key)


def _plant_flickr_and_near(world: World, rng: np.random.Generator, dataset: str, pools: dict, new_url) -> list[Row]:
    rows = []
    photos = world.info["flickr30k"]["photos"]
    for _ in range(world.cfg.n_planted_each):
        src = _take(world, pools["flickr"])
        url, desc = flickr_variant(rng, photos[src.split("/")[1]], None)
        rows.append(_copy(world, rng, dataset, url, src, reencode=False))
        world.overlap(dataset, sha1_key(url), url, "flickr_photo_id", [src], desc)
    for _ in range(world.cfg.n_planted_each):
        src = _take(world, pools["near"])
        url = new_url()
        row = _copy(world, rng, dataset, url, src, reencode=True)
        world.overlap(dataset, sha1_key(url), url, "near_duplicate", [src],
                      f"re-encode of {src} at an unrelated URL")
        rows.append(row)
    return rows


def _only_eval_of(world: World, keys: list[str], dataset: str) -> list[str]:
    """The images of ``keys`` whose only eval uses are ``dataset``'s (usable: not broken or reserved)."""
    return [k for k in keys if k not in world.broken and k not in world.reserved and world.is_eval(k)
            and all(m.startswith(dataset + "/") for m in world.eval_matches(k))]


def _take_linked(world: World, pool: list[str], rng: np.random.Generator) -> str:
    """An image of ``pool`` no planted overlap targets yet, else (a small world) any one of it."""
    used = {t for o in world.overlaps for t in o["targets"]}
    fresh = [k for k in pool if k not in used]
    if not pool:
        raise RuntimeError("no RefCOCO+/VQA-test eval image to plant overlaps on; raise the world sizes")
    choice = fresh or pool
    return choice[int(rng.integers(len(choice)))]


def _harmless_coco(world: World) -> list[str]:
    """COCO train2014/val2014 images no eval split uses (look-alike controls point at these)."""
    return [k for k in world.info["coco"]["keys"] if k not in world.broken and k not in world.reserved
            and not world.is_eval(k)]


def _plant_linked_cc(world: World) -> list[Row]:
    """CC rows at COCO-URL variants of RefCOCO+-only and VQA-test-only images (alternating), and one
    control at a variant of a COCO image no eval split uses. Drawn from their own rng stream, so the
    rest of the CC files stays as it was without them."""
    rng, coco = world.rng("cc_linked"), world.info["coco"]
    pools = {REFCOCO_ONLY: _only_eval_of(world, world.info["refcoco"]["eval_keys"], "refcoco"),
             VQA_TEST_ONLY: _only_eval_of(world, coco["test2015_keys"], "vqa")}
    rows = []
    for i in range(world.cfg.n_planted_each):
        kind = (REFCOCO_ONLY, VQA_TEST_ONLY)[i % 2]
        src = _take_linked(world, pools[kind], rng)
        variant = COCO_URL_VARIANTS[i % len(COCO_URL_VARIANTS)]
        url = url_variant(rng, coco["coco_url"][src], variant)
        if f"cc/{sha1_key(url)}" in world.images:  # the same image and spelling again (a small world)
            variant = "fragment"
            url = url_variant(rng, coco["coco_url"][src], variant)
        rows.append(_copy(world, rng, "cc", url, src, reencode=False))
        world.overlap("cc", sha1_key(url), url, "canonical_url", [src],
                      f"{kind}: {variant} variant of {coco['coco_url'][src]}")
    harmless = _harmless_coco(world)
    src = harmless[int(rng.integers(len(harmless)))]
    url = url_variant(rng, coco["coco_url"][src], "upper_host")
    rows.append(_copy(world, rng, "cc", url, src, reencode=False))
    world.control("cc", sha1_key(url), url, src, "upper_host variant of the COCO URL of an image no eval split uses")
    return rows


def _plant_linked_sbu(world: World) -> list[Row]:
    """SBU rows at other URLs of RefCOCO+-only images' Flickr photos (the original-size URL on
    live.staticflickr.com/65535 with its own secret, or another host/size), and one control at the
    original-size URL of a photo no eval split uses. COCO's test images have no Flickr URL."""
    rng, coco = world.rng("sbu_linked"), world.info["coco"]
    pool = _only_eval_of(world, world.info["refcoco"]["eval_keys"], "refcoco")
    rows = []
    for i in range(world.cfg.n_planted_each):
        src = _take_linked(world, pool, rng)
        photo = coco["photo"][src]
        url, desc = original_url(rng, photo), "live.staticflickr.com/65535 original, other secret, _o"
        if i % 2 == 1:
            url, desc = flickr_variant(rng, photo, "farm_staticflickr")
            if f"sbu/{sha1_key(url)}" in world.images:  # the same URL again (a small world)
                url, desc = original_url(rng, photo), "live.staticflickr.com/65535 original, other secret, _o"
        rows.append(_copy(world, rng, "sbu", url, src, reencode=False))
        world.overlap("sbu", sha1_key(url), url, "flickr_photo_id", [src], f"{REFCOCO_ONLY}: {desc}")
    harmless = _harmless_coco(world)
    src = harmless[int(rng.integers(len(harmless)))]
    url = original_url(rng, coco["photo"][src])
    rows.append(_copy(world, rng, "sbu", url, src, reencode=False))
    world.control("sbu", sha1_key(url), url, src, "original-size Flickr URL of a COCO photo no eval split uses")
    return rows


def _line_defects(world: World, rng: np.random.Generator, dataset: str, rows: list[Row], new_url) -> list[Row]:
    """Image defects on own rows (truncated, missing) and the returned extra defective rows."""
    own = [r for r in rows if r.image_key]  # rows of the dataset's own scenes
    a, b = (own[int(i)] for i in rng.choice(len(own), size=2, replace=False))
    world.break_image(a.image_key, "truncated", dataset)
    world.break_image(b.image_key, "missing", dataset)
    latin1 = "café crème coloured circle".encode("latin-1")
    blank = _own(world, rng, dataset, new_url())
    blank.caption, blank.defect = b"", ("missing_caption", "empty caption")
    non_utf8 = _own(world, rng, dataset, new_url())
    non_utf8.caption, non_utf8.defect = latin1, ("non_utf8", "latin-1 bytes in the caption")
    return [blank, non_utf8]


def write_cc(world: World) -> None:
    cfg, rng = world.cfg, world.rng("cc")
    pools = _eval_pools(world, rng)
    new_url = lambda: web_url(rng, with_query=rng.random() < 0.2)  # noqa: E731
    n_val = max(2, cfg.n_cc // 10)
    own = [_own(world, rng, "cc", new_url()) for _ in range(cfg.n_cc)]
    val, train = own[:n_val], own[n_val:]
    planted = []
    nlvr2 = list(world.info["nlvr2"]["query_left"])
    for i in range(cfg.n_planted_each):
        kind = URL_VARIANTS[i % len(URL_VARIANTS)]
        if kind == "query_order":
            src, base = nlvr2.pop(int(rng.integers(len(nlvr2))))
        else:
            src = _take(world, pools["coco_test"])
            base = world.info["coco"]["coco_url"][src]
        url = url_variant(rng, base, kind)
        planted.append(_copy(world, rng, "cc", url, src, reencode=False))
        world.overlap("cc", sha1_key(url), url, "canonical_url", [src], f"{kind} variant of {base}")
    planted += _plant_flickr_and_near(world, rng, "cc", pools, new_url)
    extra = _line_defects(world, rng, "cc", train, new_url)
    bad_url = _own(world, rng, "cc", "http//www.mini-web.example/missing-colon.jpg")
    bad_url.defect = ("bad_url", "URL without '://'")
    no_tab = Row(b"a caption line without any url", "", ("malformed_row", "no TAB separator"))
    rows = insert_randomly(rng, train, planted + extra + [bad_url, no_tab])
    rows = insert_randomly(world.rng("cc_linked_rows"), rows, _plant_linked_cc(world))
    lines = []
    for lineno, row in enumerate(rows, start=1):
        lines.append(row.caption + (b"\t" + row.url.encode() if row.url else b""))
        if row.defect:
            world.defect("cc", "cc/Train_GCC-training.tsv", lineno, "line", *row.defect)
    world.write_lines("cc/Train_GCC-training.tsv", lines)
    world.write_lines("cc/Validation_GCC-1.1.0-Validation.tsv", [r.caption + b"\t" + r.url.encode() for r in val])
    lay_out(world, "cc", [r for r in rows + val if r.image_key])  # img2dataset was given both files' URLs
    world.counts["cc_train_rows"], world.counts["cc_val_rows"] = len(lines), len(val)


def write_sbu(world: World) -> None:
    cfg, rng = world.cfg, world.rng("sbu")
    pools = _eval_pools(world, rng)
    new_url = lambda: flickr_url(world.photos.new(rng), "static")  # noqa: E731
    own = [_own(world, rng, "sbu", new_url()) for _ in range(cfg.n_sbu)]
    planted = _plant_flickr_and_near(world, rng, "sbu", pools, new_url)
    extra = _line_defects(world, rng, "sbu", own, new_url)
    bad_url = _own(world, rng, "sbu", "htp:/static.flickr.com/broken link.jpg")
    bad_url.defect = ("bad_url", "scheme 'htp' and a space in the URL")
    rows = insert_randomly(rng, own, planted + extra + [bad_url])
    rows = insert_randomly(world.rng("sbu_linked_rows"), rows, _plant_linked_sbu(world))
    for lineno, row in enumerate(rows, start=1):
        if row.defect:
            fname = "sbu/SBU_captioned_photo_dataset_urls.txt" if row.defect[0] == "bad_url" \
                else "sbu/SBU_captioned_photo_dataset_captions.txt"
            world.defect("sbu", fname, lineno, "line", *row.defect)
    world.write_lines("sbu/SBU_captioned_photo_dataset_urls.txt", [r.url.encode() for r in rows])
    world.write_lines("sbu/SBU_captioned_photo_dataset_captions.txt", [r.caption for r in rows])
    lay_out(world, "sbu", [r for r in rows if r.image_key])
    world.counts["sbu_rows"] = len(rows)
