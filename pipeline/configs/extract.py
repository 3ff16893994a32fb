"""``extract:`` section: Faster R-CNN region extraction and the mini-world detector."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

IMAGE_SOURCES = ("coco", "vg", "flickr30k", "cc", "sbu", "vcr", "nlvr2")


@dataclass(frozen=True)
class DetectorTrainConfig:
    """Fitting the narrow C4 detector to the mini world's boxes (DESIGN.md §7)."""

    max_minutes: float = 10.0
    max_iters: int = 3100
    ims_per_batch: int = 4
    lr: float = 1e-3
    holdout_images: int = 40


@dataclass(frozen=True)
class ExtractConfig:
    sources: tuple[str, ...] = IMAGE_SOURCES
    # `mini`: narrow R50-C4 fitted to the mini world; `butd_r101`: bottom-up-attention R101-C4
    detector: Literal["mini", "butd_r101"] = "mini"
    weights: Path | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: Literal["bf16", "fp16", "none"] = "bf16"  # autocast dtype on CUDA (ignored on CPU)
    workers: int = 1
    shard_size: int = 1000
    batch_size: int = 8
    conf_th: float = 0.2
    min_boxes: int = 10
    max_boxes: int = 100
    train: DetectorTrainConfig = field(default_factory=DetectorTrainConfig)
