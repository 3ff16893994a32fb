"""SBU Captioned Photos: ``SBU_captioned_photo_dataset_urls.txt`` + ``..._captions.txt``.

Two parallel text files: line N of the URL file is the photo whose caption is line N of the
captions file. Both are streamed line by line as bytes in lockstep. A line present in only one
file (the files disagree in length) is a ``malformed_row``. The raw row of a reject is the URL line
and the caption line joined by a newline. Images: below ``image_root`` in the layout of
``sources.sbu.image_layout`` (pipeline/ingest/sources/web_images.py); ``image_id`` is the sha1 of the URL,
and a repeated URL is a ``duplicate_id`` (first wins).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator

from pipeline.common.source_records import (
    MALFORMED_ROW, NON_UTF8, ReadContext, Reject, Row, check_url, decode_line, iter_lines, skip_bom,
)
from pipeline.ingest.sources.web_images import resolve, url_key

DATASET = "sbu"
IMAGE_SOURCE = "sbu"
COLUMNS = ()
IMAGES_REPEAT = False


def input_files(sources) -> dict[str, Path]:
    return {"urls": sources.sbu.urls, "captions": sources.sbu.captions}


def _plain_lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        for line in skip_bom(fh):
            yield line.rstrip(b"\r\n")


def read(ctx: ReadContext) -> Iterator[Row | Reject]:
    """One Row or Reject per line pair (locator ``line N``, 1-based); split is always ``train``."""
    src = ctx.sources.sbu
    return resolve(parse(ctx), Path(src.image_root), src.image_layout, ctx=ctx)


def parse(ctx: ReadContext) -> Iterator[Row | Reject]:
    """The line pairs as Rows (``image_path`` not yet known: None) or Rejects."""
    src = ctx.sources.sbu
    urls_path, captions_path = Path(src.urls), Path(src.captions)
    url_file, caption_file = str(urls_path), str(captions_path)
    check_text = ctx.check_text
    numbered_urls = iter_lines(urls_path, ctx, "sbu")
    captions = _plain_lines(captions_path)
    for lineno, (numbered, caption_line) in enumerate(itertools.zip_longest(numbered_urls, captions), 1):
        url_line = numbered[1] if numbered is not None else None
        locator = f"line {lineno}"
        if url_line is None or caption_line is None:
            present, missing = (caption_file, url_file) if url_line is None else (url_file, caption_file)
            raw = caption_line if url_line is None else url_line
            yield Reject(MALFORMED_ROW, f"no line {lineno} in {Path(missing).name} (files differ in length)",
                         raw, present, locator)
            continue
        raw = url_line + b"\n" + caption_line
        url, caption = decode_line(url_line), decode_line(caption_line)
        if url is None or caption is None:
            bad_file = url_file if url is None else caption_file
            yield Reject(NON_UTF8, f"line is not valid UTF-8 in {Path(bad_file).name}", raw, bad_file, locator)
            continue
        url, caption = url.strip(), caption.strip()
        problem = check_url(url, "url")
        if problem:
            yield Reject(problem[0], problem[1], raw, url_file, locator)
            continue
        problem = check_text(caption, "caption")
        if problem:
            yield Reject(problem[0], problem[1], raw, caption_file, locator)
            continue
        digest = url_key(url)
        values = {
            "example_id": f"sbu:{digest}", "split": "train", "image_source": IMAGE_SOURCE, "image_id": digest,
            "image_path": None, "url": url, "text": caption,
        }
        yield Row(values, raw, url_file, locator, key=int(digest[:16], 16))
