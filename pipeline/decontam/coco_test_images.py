"""COCO's test image list (``image_info_test2015.json``): the URLs of the test2015 images VQA tests on.

The file (``images`` with ``id``, ``file_name``, ``coco_url``, no ``flickr_url``) holds no
captions, so ingest makes no manifest rows of it; decontamination reads it to lend those images
their URLs (:mod:`pipeline.decontam.eval_set`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from pipeline.common.source_records import check_int, check_url, expect_list, load_json, missing_keys

log = logging.getLogger(__name__)

IMAGE_SOURCE = "coco"


def read_image_info(path: Path) -> pa.Table:
    """The images of a COCO image list (``image_info_test2015.json``; any COCO file with ``images``).

    Returns one row per usable entry of ``images``, columns ``image_source`` (``"coco"``),
    ``image_id`` (the id as text), ``url`` (``coco_url``) and ``flickr_url`` (null when absent, as in
    the test files), all strings. An entry that is not an object, has no integer ``id`` or no http(s)
    ``coco_url``, or whose ``flickr_url`` is not a URL is skipped with a warning naming the file,
    the entry and the key (its URLs are then unknown, nothing else is lost). Raises
    :class:`SourceFormatError` when the file is not JSON or has no ``images`` list.
    """
    path = Path(path)
    doc, _ = load_json(path)
    ids, urls, flickr_urls, problems = [], [], [], []
    for i, image in enumerate(expect_list(doc, path, "images")):
        problem = (missing_keys(image, ("id", "coco_url")) or check_int(image, "id")
                   or check_url(image["coco_url"], "coco_url")
                   or check_url(image.get("flickr_url"), "flickr_url", nullable=True))
        if problem:
            problems.append(f"images[{i}]: {problem[0]}: {problem[1]}")
            continue
        ids.append(str(image["id"]))
        urls.append(image["coco_url"])
        flickr_urls.append(image.get("flickr_url"))
    if problems:
        log.warning("%s: %d image entries skipped (their URLs stay unknown to decontamination), e.g. %s",
                    path, len(problems), "; ".join(problems[:3]))
    return pa.table({"image_source": pa.array([IMAGE_SOURCE] * len(ids), pa.string()),
                     "image_id": pa.array(ids, pa.string()), "url": pa.array(urls, pa.string()),
                     "flickr_url": pa.array(flickr_urls, pa.string())})
