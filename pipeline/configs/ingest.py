"""``ingest:`` section: raw annotations -> normalized manifests + rejects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DATASETS = ("coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco")

Dataset = Literal["coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco"]


@dataclass(frozen=True)
class IngestConfig:
    # which datasets `python -m pipeline ingest` (no ITEM) processes, in this order
    datasets: tuple[Dataset, ...] = DATASETS
    # check every image a row needs with pipeline.image_io (reasons missing_image / unreadable_image)
    check_images: bool = True
    # decode each image completely (catches corruption inside the data); false: header + end marker only
    full_image_check: bool = True
    # images whose header announces more pixels than this are unreadable_image (decompression bombs)
    max_image_pixels: int = 100_000_000
    # text (caption, question, ...) shorter than this after strip is missing_caption
    min_text_chars: int = 1
    # text longer than this after strip is text_too_long
    max_text_chars: int = 1000
    # rows per parquet row group and per processing chunk (memory is bounded by this, not the input)
    chunk_rows: int = 100_000
