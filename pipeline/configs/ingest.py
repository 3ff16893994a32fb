"""``ingest:`` section: raw annotations -> normalized manifests + rejects."""

from __future__ import annotations

from dataclasses import dataclass

DATASETS = ("coco", "vg", "flickr30k", "cc", "sbu", "vqa", "vcr", "nlvr2", "snli_ve", "refcoco")


@dataclass(frozen=True)
class IngestConfig:
    datasets: tuple[str, ...] = DATASETS
    # open every image header and reject unreadable files (reason `unreadable_image`)
    check_images: bool = True
    min_text_chars: int = 1
    max_text_chars: int = 1000
    chunk_rows: int = 100_000
