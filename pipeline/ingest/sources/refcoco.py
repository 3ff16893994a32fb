"""RefCOCO / RefCOCO+ / RefCOCOg: ``refs(unc).p`` (a pickle) + ``instances.json``.

The refs file is a pickled list of refs ``{ref_id, ann_id, image_id, split, sentences: [{sent_id,
sent, tokens, raw}], category_id, ...}``. Pickles can run arbitrary code when loaded, so it is read
with :func:`pipeline.common.plain_pickle.load_plain_pickle`, which builds only plain containers and
scalars and refuses any pickle that names a class or function.

One manifest row per sentence (locator ``[i].sentences[j]``); a ref without a usable
``sentences`` list is one rejected row (``[i]``). ``bbox`` ([x, y, w, h]) comes from the
instances annotation ``ann_id``; images are COCO images located through instances' ``images``
(``<coco image_root>/<train2014|val2014>/<file_name>``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from pipeline.common.plain_pickle import load_plain_pickle
from pipeline.ingest.sources.coco import index_by_id
from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, MISSING_FIELD, NON_UTF8, Problem, ReadContext, Reject, Row, SourceFormatError,
    bad_number, check_int, expect_list, load_json, missing_keys, record_has_surrogates, short_repr,
)

DATASET = "refcoco"
IMAGE_SOURCE = "coco"
COLUMNS = (
    pa.field("ref_id", pa.int64(), nullable=False),
    pa.field("ann_id", pa.int64(), nullable=False),
    pa.field("sent_id", pa.int64(), nullable=False),
    pa.field("bbox", pa.list_(pa.float32()), nullable=False),
    pa.field("category_id", pa.int64()),
)
IMAGES_REPEAT = True
SPLITS = ("train", "val", "testA", "testB", "test")
COCO_SPLIT_RE = re.compile(r"COCO_(train2014|val2014)_")


def input_files(sources) -> dict[str, Path]:
    return {"refs": sources.refcoco.refs, "instances": sources.refcoco.instances}


def _ref_problem(ref: Any) -> Problem | None:
    if isinstance(ref, Mapping) and record_has_surrogates({k: v for k, v in ref.items() if k != "sentences"}):
        return NON_UTF8, "ref holds bytes that are not UTF-8"
    problem = missing_keys(ref, ("ref_id", "ann_id", "image_id", "split", "sentences"))
    problem = problem or check_int(ref, "ref_id") or check_int(ref, "ann_id") or check_int(ref, "image_id")
    if problem:
        return problem
    if not isinstance(ref["sentences"], list):
        return MALFORMED_ROW, "sentences should be a list"
    return None


def _target(ref: Mapping, anns: Mapping, images: Mapping) -> Problem | dict:
    """The ref's box, category and image file, from instances.json."""
    ann = anns.get(ref["ann_id"])
    if ann is None:
        return MISSING_FIELD, f"ann_id {ref['ann_id']} has no annotation in instances.json"
    bbox = ann.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4 or any(bad_number(v) for v in bbox):
        return MALFORMED_ROW, f"annotation {ref['ann_id']} bbox {short_repr(bbox)} should be [x, y, w, h]"
    image = images.get(ref["image_id"])
    if image is None or not isinstance(image.get("file_name"), str):
        return MISSING_FIELD, f"image_id {ref['image_id']} has no image with a file_name in instances.json"
    category = ref.get("category_id", ann.get("category_id"))
    return {"bbox": [float(v) for v in bbox], "file_name": image["file_name"],
            "category_id": category if isinstance(category, int) and not isinstance(category, bool) else None}


def _sentence(sent: Any, ref: Mapping, ctx: ReadContext) -> Problem | None:
    if isinstance(sent, Mapping) and record_has_surrogates(sent):
        return NON_UTF8, "sentence holds bytes that are not UTF-8"
    problem = missing_keys(sent, ("sent_id", "sent")) or check_int(sent, "sent_id") or ctx.check_text(sent["sent"],
                                                                                                       "sent")
    if problem:
        return problem
    if ref["split"] not in SPLITS:
        return BAD_LABEL, f"split {ref['split']!r} is not one of {SPLITS}"
    return None


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per referring expression (sentence)."""
    src = ctx.sources.refcoco
    refs_path, instances_path = Path(src.refs), Path(src.instances)
    refs = load_plain_pickle(refs_path)
    if not isinstance(refs, list):
        raise SourceFormatError(f"{refs_path}: expected a pickled list of refs, got {type(refs).__name__}")
    instances, _ = load_json(instances_path)
    anns = index_by_id(expect_list(instances, instances_path, "annotations"), "id")
    images = index_by_id(expect_list(instances, instances_path, "images"), "id")
    coco_root, source = Path(ctx.sources.coco.image_root), str(refs_path)
    for i, ref in enumerate(ctx.bar(refs, desc=src.variant)):
        problem = _ref_problem(ref)
        if problem:
            yield Reject(problem[0], problem[1], ref, source, f"[{i}]")
            continue
        target = _target(ref, anns, images)
        for j, sent in enumerate(ref["sentences"]):
            locator = f"[{i}].sentences[{j}]"
            problem = _sentence(sent, ref, ctx) or (target if isinstance(target, tuple) else None)
            if problem:
                yield Reject(problem[0], problem[1], sent, source, locator)
                continue
            match = COCO_SPLIT_RE.match(target["file_name"])
            image_path = str(coco_root / (match[1] if match else "train2014") / target["file_name"])
            values = {
                "example_id": f"refcoco:{sent['sent_id']}", "split": ref["split"], "image_source": IMAGE_SOURCE,
                "image_id": str(ref["image_id"]), "image_path": image_path, "url": None,
                "text": sent["sent"].strip(), "ref_id": ref["ref_id"], "ann_id": ref["ann_id"],
                "sent_id": sent["sent_id"], "bbox": target["bbox"], "category_id": target["category_id"],
            }
            yield Row(values, sent, source, locator, (image_path,))
