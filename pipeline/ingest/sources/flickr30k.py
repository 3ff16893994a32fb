"""Flickr30k, Karpathy's ``dataset_flickr30k.json``.

One manifest row per sentence (locator ``images[i].sentences[j]``): text = the sentence's ``raw``,
example id = ``sentid``, split = the image's Karpathy split (train|val|test), image id = the
Flickr photo id (the file name's stem, ``1000092795.jpg`` -> ``1000092795``). An image entry
without a usable ``sentences`` list, or without ``filename``/``split``, is one rejected row
(``images[i]``). Images: ``<image_root>/<filename>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, NON_UTF8, Problem, ReadContext, Reject, Row, check_int, expect_list, load_json,
    missing_keys, record_has_surrogates,
)

DATASET = "flickr30k"
IMAGE_SOURCE = "flickr30k"
COLUMNS = ()
IMAGES_REPEAT = True
SPLITS = ("train", "val", "test")


def input_files(sources) -> dict[str, Path]:
    return {"karpathy": sources.flickr30k.karpathy}


def photo_id(filename: str) -> str:
    """The Flickr photo id of an image file name (its stem)."""
    return Path(filename).stem


def _entry_problem(entry: Any, clean: bool) -> Problem | None:
    """Why an image entry as a whole cannot give rows (then it is one rejected row)."""
    if not clean and isinstance(entry, Mapping) and record_has_surrogates(
            {k: v for k, v in entry.items() if k != "sentences"}):
        return NON_UTF8, "image entry holds bytes that are not UTF-8"
    problem = missing_keys(entry, ("filename", "split", "sentences"))
    if problem:
        return problem
    if not isinstance(entry["sentences"], list):
        return MALFORMED_ROW, "sentences should be a list"
    if not isinstance(entry["filename"], str) or not photo_id(entry["filename"]):
        return MALFORMED_ROW, f"filename should be '<photo_id>.jpg', got {entry['filename']!r}"
    return None


def _sentence(sent: Any, split: Any, clean: bool, ctx: ReadContext) -> Problem | None:
    if not clean and record_has_surrogates(sent):
        return NON_UTF8, "sentence holds bytes that are not UTF-8"
    problem = missing_keys(sent, ("sentid", "raw")) or check_int(sent, "sentid") or ctx.check_text(sent["raw"], "raw")
    if problem:
        return problem
    if split not in SPLITS:
        return BAD_LABEL, f"split {split!r} is not one of {SPLITS}"
    return None


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per sentence (plus one Reject per unusable image entry)."""
    src = ctx.sources.flickr30k
    path = Path(src.karpathy)
    doc, clean = load_json(path)
    source, root = str(path), Path(src.image_root)
    for i, entry in enumerate(ctx.bar(expect_list(doc, path, "images"), desc="flickr30k")):
        problem = _entry_problem(entry, clean)
        if problem:
            yield Reject(problem[0], problem[1], entry, source, f"images[{i}]")
            continue
        image_id = photo_id(entry["filename"])
        image_path = str(root / entry["filename"])
        for j, sent in enumerate(entry["sentences"]):
            locator = f"images[{i}].sentences[{j}]"
            problem = _sentence(sent, entry["split"], clean, ctx)
            if problem:
                yield Reject(problem[0], problem[1], sent, source, locator)
                continue
            values = {
                "example_id": f"flickr30k:{sent['sentid']}", "split": entry["split"], "image_source": IMAGE_SOURCE,
                "image_id": image_id, "image_path": image_path, "url": None, "text": sent["raw"].strip(),
            }
            yield Row(values, sent, source, locator, (image_path,))
