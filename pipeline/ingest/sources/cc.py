"""Conceptual Captions: ``Train_GCC-training.tsv`` / ``Validation_GCC-1.1.0-Validation.tsv``.

Format: one ``caption<TAB>url`` pair per line, no header, no quoting (captions may contain quote
characters). The 3.3M-line training file is streamed line by line as bytes, so a line that is not
UTF-8 is rejected on its own (``non_utf8``) and memory stays constant. Images are the downloaded
copies below ``image_root``, found by URL in img2dataset's shards or by the URL's SHA-1
(``sources.cc.image_layout``; pipeline/ingest/sources/web_images.py). The URL is the pair's identity
(``image_id`` = sha1 of the URL in both layouts): a URL seen again is a ``duplicate_id`` (the first
line wins).
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Iterator

from pipeline.common.source_records import (MALFORMED_ROW, NON_UTF8, URL_RE, ReadContext, Reject, Row, check_url,
                                             iter_lines)
from pipeline.ingest.sources.web_images import resolve

DATASET = "cc"
IMAGE_SOURCE = "cc"
COLUMNS = ()  # the core columns only
IMAGES_REPEAT = False  # one image per URL: no point caching image checks


def input_files(sources) -> dict[str, Path]:
    files = {"train_tsv": sources.cc.train_tsv, "val_tsv": sources.cc.val_tsv}
    return {key: path for key, path in files.items() if path is not None}  # val_tsv may be null


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """Every line of the train then the val TSV, as a Row or a Reject (one per line)."""
    src = ctx.sources.cc
    return resolve(parse(ctx), Path(src.image_root), src.image_layout, ctx=ctx)


def parse(ctx: ReadContext) -> Iterator[Row | Reject]:
    """Both TSVs' lines (the training TSV's alone when ``val_tsv`` is null) as Rows (``image_path`` not
    yet known: None) or Rejects; the download@ stage reads the URLs to fetch from these Rows."""
    src = ctx.sources.cc
    return itertools.chain.from_iterable(
        read_tsv(Path(path), split, ctx) for split, path in (("train", src.train_tsv), ("val", src.val_tsv))
        if path is not None)


def read_tsv(path: Path, split: str, ctx: ReadContext) -> Iterator[Row | Reject]:
    """One CC TSV file: yields a Row or a Reject for each line (locator ``line N``, 1-based).

    The common case (a valid line) takes an inlined fast path: this loop runs 3.3M times.
    """
    source = str(path)
    min_chars, max_chars = max(1, ctx.min_text_chars), ctx.max_text_chars
    url_match, sha1 = URL_RE.match, hashlib.sha1
    for lineno, line in iter_lines(path, ctx, f"cc {split}"):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            yield Reject(NON_UTF8, "line is not valid UTF-8", line, source, f"line {lineno}")
            continue
        fields = text.split("\t")
        if len(fields) != 2:
            detail = f"expected 2 tab-separated fields (caption, url), got {len(fields)}"
            yield Reject(MALFORMED_ROW, detail, line, source, f"line {lineno}")
            continue
        caption, url = fields[0].strip(), fields[1].strip()
        if not min_chars <= len(caption) <= max_chars or url_match(url) is None:
            problem = ctx.check_text(caption, "caption") or check_url(url, "url")
            yield Reject(problem[0], problem[1], line, source, f"line {lineno}")
            continue
        digest = sha1(url.encode("utf-8")).hexdigest()
        values = {
            "example_id": f"cc:{digest}", "split": split, "image_source": IMAGE_SOURCE,
            "image_id": digest, "image_path": None, "url": url, "text": caption,
        }
        yield Row(values, line, source, f"line {lineno}", key=int(digest[:16], 16))
