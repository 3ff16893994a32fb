"""SNLI-VE: ``snli_ve_{train,dev,test}.jsonl``.

One manifest row per hypothesis (locator ``line N``): text = ``sentence2`` (the hypothesis),
``premise`` = ``sentence1`` (the Flickr30k caption the pair came from), ``label`` =
``gold_label`` (entailment|neutral|contradiction, anything else is ``bad_label``), example id =
``pairID``. The image is a Flickr30k image named by ``Flikr30kID`` (sic, the real field name):
``<flickr30k image_root>/<photo_id>.jpg``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa

from pipeline.ingest.sources.flickr30k import photo_id
from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, Problem, ReadContext, Reject, Row, jsonl_records, missing_keys,
)

DATASET = "snli_ve"
IMAGE_SOURCE = "flickr30k"
COLUMNS = (
    pa.field("premise", pa.string()),
    pa.field("label", pa.string(), nullable=False),
)
IMAGES_REPEAT = True
LABELS = ("entailment", "neutral", "contradiction")


def input_files(sources) -> dict[str, Path]:
    return {"train": sources.snli_ve.train, "dev": sources.snli_ve.dev, "test": sources.snli_ve.test}


def _record(record: dict, ctx: ReadContext) -> Problem | None:
    problem = missing_keys(record, ("Flikr30kID", "sentence1", "sentence2", "gold_label", "pairID"))
    if problem:
        return problem
    if not isinstance(record["pairID"], str) or not record["pairID"]:
        return MALFORMED_ROW, f"pairID should be a non-empty string, got {record['pairID']!r}"
    name = record["Flikr30kID"]
    if not isinstance(name, str) or not photo_id(name):
        return MALFORMED_ROW, f"Flikr30kID should be '<photo_id>.jpg', got {name!r}"
    if record["sentence1"] is not None and not isinstance(record["sentence1"], str):
        return MALFORMED_ROW, "sentence1 should be a string"
    problem = ctx.check_text(record["sentence2"], "sentence2")
    if problem:
        return problem
    if record["gold_label"] not in LABELS:
        return BAD_LABEL, f"gold_label {record['gold_label']!r} is not one of {LABELS}"
    return None


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per line of train, dev and test."""
    src = ctx.sources.snli_ve
    root = Path(ctx.sources.flickr30k.image_root)
    for split, path in (("train", src.train), ("dev", src.dev), ("test", src.test)):
        source = str(path)
        for item in jsonl_records(Path(path), ctx, f"snli_ve {split}"):
            if isinstance(item, Reject):
                yield item
                continue
            locator, record, line = item
            problem = _record(record, ctx)
            if problem:
                yield Reject(problem[0], problem[1], line, source, locator)
                continue
            image_path = str(root / record["Flikr30kID"])
            premise = record["sentence1"]
            values = {
                "example_id": f"snli_ve:{record['pairID']}", "split": split, "image_source": IMAGE_SOURCE,
                "image_id": photo_id(record["Flikr30kID"]), "image_path": image_path, "url": None,
                "text": record["sentence2"].strip(), "premise": premise.strip() if premise else premise,
                "label": record["gold_label"],
            }
            yield Row(values, line, source, locator, (image_path,))
