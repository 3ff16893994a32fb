"""Visual Genome: ``region_descriptions.json`` joined with ``image_data.json``.

One manifest row per region description (locator ``[i].regions[j]``): text = ``phrase``,
``region_box`` = [x, y, width, height] in pixels, example id = ``region_id``. An image entry of
``region_descriptions.json`` without a usable ``regions`` list is one rejected row (``[i]``).
Image metadata (url, coco_id, flickr_id, size) comes from ``image_data.json`` by image id.
Images: ``<image_root>/<image_id>.jpg``; split is always ``train`` (decontamination decides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from pipeline.ingest.sources.coco import index_by_id, optional_int
from pipeline.common.source_records import (
    MALFORMED_ROW, MISSING_FIELD, NON_UTF8, Problem, ReadContext, Reject, Row, check_int, check_url, expect_list,
    bad_number, load_json, missing_keys, record_has_surrogates, short_repr,
)

DATASET = "vg"
IMAGE_SOURCE = "vg"
COLUMNS = (
    pa.field("coco_id", pa.string()),
    pa.field("flickr_id", pa.string()),
    pa.field("region_box", pa.list_(pa.float32()), nullable=False),
    pa.field("width", pa.int64()),
    pa.field("height", pa.int64()),
)
IMAGES_REPEAT = True
BOX_KEYS = ("x", "y", "width", "height")


def input_files(sources) -> dict[str, Path]:
    return {"image_data": sources.vg.image_data, "region_descriptions": sources.vg.region_descriptions}


def _id_text(value: Any) -> str | None:
    """coco_id / flickr_id as text (null stays null)."""
    return None if value is None else str(value)


def _region(region: Any, entry_image_id: Any, clean: bool, images: Mapping, ctx: ReadContext) -> Problem | dict:
    """Manifest values of one region, or the problem that rejects it."""
    if not clean and record_has_surrogates(region):
        return NON_UTF8, "region holds bytes that are not UTF-8"
    problem = missing_keys(region, ("region_id", "phrase", *BOX_KEYS)) or check_int(region, "region_id")
    if problem:
        return problem
    box = [region[k] for k in BOX_KEYS]
    if any(bad_number(v) for v in box):
        return MALFORMED_ROW, f"region box {short_repr(box)} should be four finite numbers (float32)"
    image_id = region.get("image_id", entry_image_id)
    if isinstance(image_id, bool) or not isinstance(image_id, (int, str)):
        return MALFORMED_ROW, f"image_id should be an integer, got {short_repr(image_id)}"
    image = images.get(image_id)
    if image is None:
        return MISSING_FIELD, f"image_id {image_id} has no entry in image_data.json"
    if not clean and record_has_surrogates(image):
        return NON_UTF8, f"image_data entry of image {image_id} holds bytes that are not UTF-8"
    problem = ctx.check_text(region["phrase"], "phrase") or missing_keys(image, ("url",))
    return problem or check_url(image["url"], "url") or {"image_id": image_id, "image": image, "box": box}


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per region (plus one Reject per image entry without a regions list)."""
    src = ctx.sources.vg
    image_data_path, regions_path = Path(src.image_data), Path(src.region_descriptions)
    image_doc, images_clean = load_json(image_data_path)
    images = index_by_id(expect_list(image_doc, image_data_path), "image_id")
    doc, clean = load_json(regions_path)
    clean = clean and images_clean
    source, root = str(regions_path), Path(src.image_root)
    for i, entry in enumerate(ctx.bar(expect_list(doc, regions_path), desc="vg")):
        entry_id = entry.get("id", entry.get("image_id")) if isinstance(entry, Mapping) else None
        regions = entry.get("regions") if isinstance(entry, Mapping) else None
        if not isinstance(regions, list):
            if isinstance(entry, Mapping) and "regions" not in entry:
                yield Reject(MISSING_FIELD, "image entry has no 'regions'", entry, source, f"[{i}]")
            else:
                yield Reject(MALFORMED_ROW, "image entry should be an object with a 'regions' list", entry, source,
                             f"[{i}]")
            continue
        for j, region in enumerate(regions):
            locator = f"[{i}].regions[{j}]"
            found = _region(region, entry_id, clean, images, ctx)
            if isinstance(found, tuple):
                yield Reject(found[0], found[1], region, source, locator)
                continue
            image, image_id = found["image"], found["image_id"]
            image_path = str(root / f"{image_id}.jpg")
            values = {
                "example_id": f"vg:{region['region_id']}", "split": "train", "image_source": IMAGE_SOURCE,
                "image_id": str(image_id), "image_path": image_path, "url": image["url"],
                "text": region["phrase"].strip(), "coco_id": _id_text(image.get("coco_id")),
                "flickr_id": _id_text(image.get("flickr_id")), "region_box": [float(v) for v in found["box"]],
                "width": optional_int(image, "width"), "height": optional_int(image, "height"),
            }
            yield Row(values, region, source, locator, (image_path,))
