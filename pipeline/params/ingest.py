"""``ingest:`` section: raw annotations -> normalized manifests + rejects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.params.checks import MAX_COUNT, bounded, checked

DATASETS = ("coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco")

Dataset = Literal["coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco"]


@dataclass(frozen=True)
class IngestConfig:
    # which datasets `python -m pipeline ingest` (no ITEM) processes, in this order
    datasets: tuple[Dataset, ...] = DATASETS
    # check every image a row needs with pipeline.common.image_io (reasons missing_image / unreadable_image)
    check_images: bool = True
    # decode each image completely (catches corruption inside the data); false: header + end marker only
    full_image_check: bool = True
    # images whose header announces more pixels than this are unreadable_image (decompression bombs)
    max_image_pixels: int = bounded(100_000_000, 1, 10**12)
    # text (caption, question, ...) shorter than this after strip is missing_caption
    min_text_chars: int = bounded(1, 1, MAX_COUNT)
    # text longer than this after strip is text_too_long
    max_text_chars: int = bounded(1000, 1, MAX_COUNT)
    # rows per parquet row group and per processing chunk (memory is bounded by this, not the input)
    chunk_rows: int = bounded(100_000, 1, 10_000_000)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        short = self.max_text_chars < self.min_text_chars
        return checked(max_text_chars=f"must be >= ingest.min_text_chars ({self.min_text_chars}), "
                                      f"got {self.max_text_chars}" if short else None)
