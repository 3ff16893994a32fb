"""``decontaminate:`` section: which eval splits count, near-duplicate detection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from pipeline.configs import MAX_COUNT, bounded, checked, subset_problem

# UNITER's rules (docs/design.md §7): Karpathy val is *not* excluded: it becomes the pretraining val set.
DEFAULT_EVAL_SPLITS: dict[str, tuple[str, ...]] = {
    "coco": ("test",),
    "refcoco": ("val", "testA", "testB", "test"),
    "vqa": ("test",),  # VQA fine-tunes on train+val and tests on test2015 images
    "flickr30k": ("train", "val", "test"),
    "nlvr2": ("dev", "test"),
    "snli_ve": ("dev", "test"),
    "vcr": ("val", "test"),
}


# the datasets UNITER pretrains on; their manifests are the ones decontamination cleans
PRETRAIN_DATASETS = ("coco", "vg", "cc", "sbu")


@dataclass(frozen=True)
class DecontaminateConfig:
    eval_splits: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_EVAL_SPLITS))
    pretrain_datasets: tuple[str, ...] = PRETRAIN_DATASETS
    # pHash near-duplicate search (reason `near_duplicate`) over every image on disk
    near_duplicates: bool = True
    # largest Hamming distance (bits of the 64-bit pHash, 0..32) counted as the same image
    phash_max_distance: int = bounded(4, 0, 32)
    # processes hashing images (hashes are cached in <data>/cache/phash.parquet)
    workers: int = bounded(2, 1, 256)
    # VG images whose coco_id is a pretraining-val (Karpathy val) COCO image go to VG val, as in UNITER
    vg_val_from_coco: bool = True
    # removed images shown with thumbnails in each HTML/Markdown report
    report_samples: int = bounded(24, 0, MAX_COUNT)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        return checked(eval_splits=subset_problem(self.eval_splits, DEFAULT_EVAL_SPLITS, nonempty=False),
                       pretrain_datasets=subset_problem(self.pretrain_datasets, PRETRAIN_DATASETS))
