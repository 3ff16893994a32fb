"""``extract:`` section: Faster R-CNN region extraction and the mini-world detector."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.params.checks import MAX_COUNT, MAX_STEPS, bounded, checked, must_exist, subset_problem

IMAGE_SOURCES = ("coco", "vg", "flickr30k", "cc", "sbu", "vcr", "nlvr2")
# the given-box feature set an image source's extraction also writes (RefCOCO+ / VCR boxes)
GIVEN_BOX_SETS = {"coco": "coco_gt", "vcr": "vcr_gt"}
# the dataset whose manifest gives each set's boxes: without it in ingest.datasets the set is not extracted
GIVEN_BOX_DATASETS = {"coco_gt": "refcoco", "vcr_gt": "vcr"}


@dataclass(frozen=True)
class DetectorTrainConfig:
    """Fitting the narrow C4 detector to the mini world's boxes (docs/design.md §8)."""

    max_minutes: float = bounded(0.0, 0, 7 * 24 * 60)  # wall-clock cap (0: none, iterations only)
    max_iters: int = bounded(1200, 1, MAX_STEPS)
    ims_per_batch: int = bounded(4, 1, 1024)
    lr: float = bounded(2e-3, 0, 1, lo_open=True)
    holdout_images: int = bounded(40, 1, MAX_COUNT)  # COCO train2014 images kept out of training to score it


@dataclass(frozen=True)
class ExtractConfig:
    sources: tuple[str, ...] = IMAGE_SOURCES
    # `mini`: narrow R50-C4 fitted to the mini world; `butd_r101`: bottom-up-attention R101-C4
    detector: Literal["mini", "butd_r101"] = "mini"
    # a file of `detector`'s weights; null: the mini detector train_detector writes (butd_r101 needs one)
    weights: Path | None = must_exist(None, kind="file")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: Literal["bf16", "fp16", "none"] = "bf16"  # autocast dtype on CUDA (a CPU extracts in fp32)
    workers: int = bounded(0, 0, 256)  # detector processes; 0: one per CPU core (CPU) or per GPU (CUDA)
    # tasks one source's shards are split over (`extract SOURCE:k/K`); > 1: `extract SOURCE` merges them
    parts: int = bounded(1, 1, 4096)
    shard_size: int = bounded(1000, 1, MAX_COUNT)  # images per shard file
    batch_size: int = bounded(8, 1, 4096)
    conf_th: float = bounded(0.2, 0, 1)  # class confidence a kept box needs (min_boxes are kept anyway)
    min_boxes: int = bounded(10, 0, 1000)
    max_boxes: int = bounded(100, 1, 1000)
    # RPN proposals per image that the res5 head scores (most of extraction's compute); null: the
    # detector's own (300 butd_r101, 100 mini). The kept regions are chosen among them
    proposals: int | None = bounded(None, 1, 100_000)
    train: DetectorTrainConfig = field(default_factory=DetectorTrainConfig)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        few = f"must be >= extract.min_boxes ({self.min_boxes}), got {self.max_boxes}"
        too_few_proposals = self.proposals is not None and self.proposals < self.min_boxes
        return checked(sources=subset_problem(self.sources, IMAGE_SOURCES),
                       max_boxes=few if self.max_boxes < self.min_boxes else None,
                       proposals=f"must be >= extract.min_boxes ({self.min_boxes}): the kept regions are chosen "
                       f"among the proposals, got {self.proposals}" if too_few_proposals else None,
                       weights="butd_r101 has no weights of its own: set extract.weights to its file"
                       if self.detector == "butd_r101" and self.weights is None else None)
