"""``decontaminate:`` section: which eval splits count, near-duplicate detection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# UNITER's rules (DESIGN.md §6): Karpathy val is *not* excluded: it becomes the pretraining val set.
DEFAULT_EVAL_SPLITS: dict[str, tuple[str, ...]] = {
    "coco": ("test",),
    "refcoco": ("val", "testA", "testB", "test"),
    "vqa": ("test",),  # VQA fine-tunes on train+val and tests on test2015 images
    "flickr30k": ("train", "val", "test"),
    "nlvr2": ("dev", "test"),
    "snli_ve": ("dev", "test"),
    "vcr": ("val", "test"),
}


@dataclass(frozen=True)
class DecontaminateConfig:
    eval_splits: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_EVAL_SPLITS))
    pretrain_datasets: tuple[str, ...] = ("coco", "vg", "cc", "sbu")
    # pHash near-duplicate search (reason `near_duplicate`) over every image on disk
    near_duplicates: bool = True
    # largest Hamming distance (bits of the 64-bit pHash, 0..32) counted as the same image
    phash_max_distance: int = 4
    # processes hashing images (hashes are cached in <data>/cache/phash.parquet)
    workers: int = 2
    # VG images whose coco_id is a pretraining-val (Karpathy val) COCO image go to VG val, as in UNITER
    vg_val_from_coco: bool = True
    # removed images shown with thumbnails in each HTML/Markdown report
    report_samples: int = 24
