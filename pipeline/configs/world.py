"""``mini_world:`` and ``sources:`` sections: what the raw inputs are and where they lie.

``sources`` names the original files of every dataset in its real, published layout. With
``world: mini`` they point into ``data/raw/mini/`` (written by the ``mini_world`` stage); with
``world: real`` they point at real downloads and every path must exist.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.configs import must_exist


@dataclass(frozen=True)
class MiniWorldConfig:
    """Size and look of the generated mini world. Same values and seed => byte-identical tree."""

    out_dir: Path = Path("data/raw/mini")
    image_size: int = 192
    jpeg_quality: int = 90
    n_coco: int = 400
    n_vg_only: int = 150
    n_flickr30k: int = 200
    n_cc: int = 300
    n_sbu: int = 300
    n_vcr: int = 150
    n_nlvr2_pairs: int = 200
    captions_per_image: int = 5
    max_objects: int = 5
    n_planted_each: int = 6
    n_vqa_test: int = 50  # COCO test2015 images carrying the VQA test questions
    vqa_questions_per_image: int = 3
    n_refcoco_images: int = 120  # COCO train2014 images with RefCOCO+ refs (val/testA/testB ~10% each)
    # naming: expressions the detector's class names answer; comparing: comparing ones first where a scene has them
    refcoco_expressions: Literal["naming", "comparing"] = "naming"


@dataclass(frozen=True)
class CocoSource:
    captions_train: Path = must_exist()
    captions_val: Path = must_exist()
    instances_train: Path = must_exist()
    instances_val: Path = must_exist()
    karpathy: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class VgSource:
    image_data: Path = must_exist()
    region_descriptions: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class Flickr30kSource:
    karpathy: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class CcSource:
    train_tsv: Path = must_exist()
    val_tsv: Path = must_exist()
    # downloaded images, named <sha1 of the raw URL>.jpg (img2dataset-style key)
    image_root: Path = must_exist()


@dataclass(frozen=True)
class SbuSource:
    urls: Path = must_exist()
    captions: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class VqaSource:
    questions_train: Path = must_exist()
    questions_val: Path = must_exist()
    questions_test: Path = must_exist()
    annotations_train: Path = must_exist()
    annotations_val: Path = must_exist()


@dataclass(frozen=True)
class VcrSource:
    train: Path = must_exist()
    val: Path = must_exist()
    test: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class Nlvr2Source:
    train: Path = must_exist()
    dev: Path = must_exist()
    test: Path = must_exist()
    image_root: Path = must_exist()


@dataclass(frozen=True)
class SnliVeSource:
    train: Path = must_exist()
    dev: Path = must_exist()
    test: Path = must_exist()


@dataclass(frozen=True)
class RefcocoSource:
    refs: Path = must_exist()
    instances: Path = must_exist()
    variant: str = "refcoco+"


@dataclass(frozen=True)
class SourcesConfig:
    coco: CocoSource = field(default_factory=CocoSource)
    vg: VgSource = field(default_factory=VgSource)
    flickr30k: Flickr30kSource = field(default_factory=Flickr30kSource)
    cc: CcSource = field(default_factory=CcSource)
    sbu: SbuSource = field(default_factory=SbuSource)
    vqa: VqaSource = field(default_factory=VqaSource)
    vcr: VcrSource = field(default_factory=VcrSource)
    nlvr2: Nlvr2Source = field(default_factory=Nlvr2Source)
    snli_ve: SnliVeSource = field(default_factory=SnliVeSource)
    refcoco: RefcocoSource = field(default_factory=RefcocoSource)
