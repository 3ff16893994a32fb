"""NLVR2: ``train.json``, ``dev.json``, ``test1.json`` (JSON lines despite the extension).

One manifest row per statement (locator ``line N``): ``identifier`` is ``<split>-<set>-<pair>-<n>``;
the pair's two images are ``<pair id>-img0.png`` / ``-img1.png`` under
``<image_root>/<file stem>/`` (the real train set nests them one more level, in the record's
``directory``; that location is used when the flat one does not exist). ``label`` "True"/"False"
becomes a bool (absent = unlabelled, null). ``left_url``/``right_url`` are optional; the right
one is kept as ``url_2`` because decontamination matches eval images by URL.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from pipeline.common.source_records import (
    BAD_LABEL, MALFORMED_ROW, Problem, ReadContext, Reject, Row, check_url, jsonl_records, missing_keys,
)

DATASET = "nlvr2"
IMAGE_SOURCE = "nlvr2"
COLUMNS = (
    pa.field("image_id_2", pa.string(), nullable=False),
    pa.field("image_path_2", pa.string(), nullable=False),
    pa.field("url_2", pa.string()),
    pa.field("label", pa.bool_()),
)
IMAGES_REPEAT = True
IDENTIFIER_RE = re.compile(r"(?P<pair>[A-Za-z0-9_]+-\d+-\d+)-\d+\Z")
LABELS = {"True": True, "true": True, True: True, "False": False, "false": False, False: False}


def input_files(sources) -> dict[str, Path]:
    return {"train": sources.nlvr2.train, "dev": sources.nlvr2.dev, "test": sources.nlvr2.test}


def _label(record: dict) -> Problem | bool | None:
    if record.get("label") is None:
        return None
    value = record["label"]
    if not isinstance(value, (str, bool)) or value not in LABELS:
        return BAD_LABEL, f"label {value!r} is not True/False"
    return LABELS[value]


def _record(record: dict, ctx: ReadContext) -> Problem | dict:
    problem = missing_keys(record, ("identifier", "sentence"))
    if problem:
        return problem
    ident = record["identifier"]
    match = IDENTIFIER_RE.match(ident) if isinstance(ident, str) else None
    if match is None:
        return MALFORMED_ROW, f"identifier {ident!r} is not '<split>-<set>-<pair>-<n>'"
    problem = (ctx.check_text(record["sentence"], "sentence") or check_url(record.get("left_url"), "left_url",
               nullable=True) or check_url(record.get("right_url"), "right_url", nullable=True))
    if problem:
        return problem
    label = _label(record)
    if isinstance(label, tuple):
        return label
    return {"pair": match["pair"], "label": label}


def _pair_dir(root: Path, record: dict, pair: str) -> Path:
    directory = record.get("directory")
    if directory is not None and not (root / f"{pair}-img0.png").exists():
        return root / str(directory)
    return root


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per line of train, dev and test1 (split names as in params: train/dev/test)."""
    src = ctx.sources.nlvr2
    for split, path in (("train", src.train), ("dev", src.dev), ("test", src.test)):
        path = Path(path)
        source, split_root = str(path), Path(src.image_root) / path.stem
        for item in jsonl_records(path, ctx, f"nlvr2 {split}"):
            if isinstance(item, Reject):
                yield item
                continue
            locator, record, line = item
            found = _record(record, ctx)
            if isinstance(found, tuple):
                yield Reject(found[0], found[1], line, source, locator)
                continue
            pair = found["pair"]
            folder = _pair_dir(split_root, record, pair)
            left, right = str(folder / f"{pair}-img0.png"), str(folder / f"{pair}-img1.png")
            values = {
                "example_id": f"nlvr2:{record['identifier']}", "split": split, "image_source": IMAGE_SOURCE,
                "image_id": f"{pair}-img0", "image_path": left, "url": record.get("left_url"),
                "text": record["sentence"].strip(), "image_id_2": f"{pair}-img1", "image_path_2": right,
                "url_2": record.get("right_url"), "label": found["label"],
            }
            yield Row(values, line, source, locator, (left, right))
