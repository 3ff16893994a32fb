"""COCO captions 2014 (``captions_{train,val}2014.json``) joined with Karpathy's ``dataset_coco.json``.

One manifest row per caption annotation (``annotations[i]``, locator ``annotations[i]``): the
text is the annotation's caption, the image comes from the file's ``images`` list, and ``split``
is the image's Karpathy split (train|restval|val|test) looked up by ``cocoid``. The example id
is the annotation id. Images: ``<image_root>/<train2014|val2014>/<file_name>``.

``image_info_test2015.json`` (COCO's test image list: ``images`` with ``id``, ``file_name``,
``coco_url``, no ``flickr_url``) holds no captions, so it makes no manifest rows; decontamination
reads it (``pipeline.decontam.coco_test_images``) to know the URLs of the test2015 images VQA tests on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, MISSING_FIELD, NON_UTF8, Problem, ReadContext, Reject, Row, check_int, check_url,
    expect_list, load_json, missing_keys, record_has_surrogates,
)

DATASET = "coco"
IMAGE_SOURCE = "coco"
COLUMNS = (
    pa.field("coco_split", pa.string(), nullable=False),
    pa.field("flickr_url", pa.string()),
    pa.field("width", pa.int64()),
    pa.field("height", pa.int64()),
)
IMAGES_REPEAT = True
KARPATHY_SPLITS = ("train", "restval", "val", "test")


def input_files(sources) -> dict[str, Path]:
    src = sources.coco
    return {"captions_train": src.captions_train, "captions_val": src.captions_val, "karpathy": src.karpathy}


def karpathy_splits(path: Path, ctx: ReadContext) -> dict[int, Any]:
    """cocoid -> split of every image in a Karpathy ``dataset_coco.json`` (entries without a
    cocoid are counted in ``ctx.notes`` and skipped: they cannot be joined)."""
    doc, _ = load_json(path)
    splits: dict[int, Any] = {}
    for entry in expect_list(doc, path, "images"):
        cocoid = entry.get("cocoid") if isinstance(entry, Mapping) else None
        if isinstance(cocoid, bool) or not isinstance(cocoid, int):
            ctx.note("karpathy_entries_without_cocoid")
            continue
        splits.setdefault(cocoid, entry.get("split"))
    return splits


def index_by_id(records: list, key: str) -> dict[Any, Mapping]:
    """{record[key]: record} for the records that are objects with that key; the first one wins."""
    index: dict[Any, Mapping] = {}
    for record in records:
        if isinstance(record, Mapping) and isinstance(record.get(key), (int, str)):  # a list or map joins nothing
            index.setdefault(record[key], record)
    return index


def optional_int(record: Mapping[str, Any], name: str) -> int | None:
    value = record.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _image_problem(image: Mapping | None, image_id: Any, clean: bool) -> Problem | None:
    if image is None:
        return MISSING_FIELD, f"image_id {image_id} has no entry in 'images'"
    if not clean and record_has_surrogates(image):
        return NON_UTF8, f"image {image_id} record holds bytes that are not UTF-8"
    problem = missing_keys(image, ("file_name", "coco_url"))
    if problem:
        return problem[0], f"image {image_id}: {problem[1]}"
    if not isinstance(image["file_name"], str) or not image["file_name"].strip():
        return MALFORMED_ROW, f"image {image_id}: file_name should be a non-empty string"
    return check_url(image["coco_url"], "coco_url") or check_url(image.get("flickr_url"), "flickr_url", nullable=True)


def _annotation(ann: Any, clean: bool, images: Mapping, splits: Mapping, ctx: ReadContext) -> Problem | dict:
    """The manifest values of one caption annotation, or the problem that rejects it."""
    if not clean and record_has_surrogates(ann):
        return NON_UTF8, "annotation holds bytes that are not UTF-8"
    problem = missing_keys(ann, ("id", "image_id", "caption")) or check_int(ann, "id") or check_int(ann, "image_id")
    if problem:
        return problem
    image_id = ann["image_id"]
    image = images.get(image_id)
    problem = ctx.check_text(ann["caption"], "caption") or _image_problem(image, image_id, clean)
    if problem:
        return problem
    if image_id not in splits:
        return MISSING_FIELD, f"cocoid {image_id} is not in the Karpathy split file"
    split = splits[image_id]
    if split not in KARPATHY_SPLITS:
        return BAD_LABEL, f"Karpathy split of cocoid {image_id} is {split!r}, expected one of {KARPATHY_SPLITS}"
    return {"image": image, "split": split}


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per caption annotation of the train then the val captions file."""
    src = ctx.sources.coco
    splits = karpathy_splits(Path(src.karpathy), ctx)
    for coco_split, path in (("train2014", Path(src.captions_train)), ("val2014", Path(src.captions_val))):
        doc, clean = load_json(path)
        images = index_by_id(expect_list(doc, path, "images"), "id")
        source, root = str(path), Path(src.image_root) / coco_split
        for i, ann in enumerate(ctx.bar(expect_list(doc, path, "annotations"), desc=f"coco {coco_split}")):
            locator = f"annotations[{i}]"
            found = _annotation(ann, clean, images, splits, ctx)
            if isinstance(found, tuple):
                yield Reject(found[0], found[1], ann, source, locator)
                continue
            image, image_id = found["image"], ann["image_id"]
            image_path = str(root / image["file_name"])
            values = {
                "example_id": f"coco:{ann['id']}", "split": found["split"], "image_source": IMAGE_SOURCE,
                "image_id": str(image_id), "image_path": image_path, "url": image["coco_url"],
                "text": ann["caption"].strip(), "coco_split": coco_split, "flickr_url": image.get("flickr_url"),
                "width": optional_int(image, "width"), "height": optional_int(image, "height"),
            }
            yield Row(values, ann, source, locator, (image_path,))
