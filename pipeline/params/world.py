"""``mini_world:`` and ``sources:`` sections: what the raw inputs are and where they lie.

``sources`` names the original files of every dataset in its real, published layout. With
``world: mini`` they point into ``data/raw/mini/`` (written by the ``mini_world`` stage); with
``world: real`` they point at real downloads, and only the paths that the configured stages read
must exist (``pipeline.params.inputs.source_needs``: a user with COCO, VG, CC and SBU alone leaves the
other datasets out of ``ingest.datasets`` and ``extract.sources``); a missing one is named with the
stage that needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.params.checks import MAX_COUNT, bounded, checked, must_exist


# The version of the mini world's generator (pipeline/mini_world/) and its defaults: bumped with any
# change to what it writes, only by the rule of docs/rig.md (committed before the runs that test it,
# decided on dev or pretraining held-out metrics). Every _run.json records it (rig.mini_world_version).
MINI_WORLD_VERSION = 1

# Id pools the COCO writer draws from without replacement (pipeline/mini_world/coco.py): real
# COCO's id ranges, so the generated ids look real. A world asking for more ids cannot be drawn.
COCO_IMAGE_IDS, COCO_CAPTION_IDS, COCO_INSTANCE_IDS = 581_929, 900_000, 2_200_000


@dataclass(frozen=True)
class MiniWorldConfig:
    """Size and look of the generated mini world. Same values and seed => byte-identical tree."""

    out_dir: Path = Path("data/raw/mini")
    image_size: int = bounded(192, 32, 4096)  # pixels per side
    jpeg_quality: int = bounded(90, 1, 100)
    n_coco: int = bounded(400, 1, MAX_COUNT)
    n_vg_only: int = bounded(150, 1, MAX_COUNT)
    n_flickr30k: int = bounded(200, 1, MAX_COUNT)
    n_cc: int = bounded(300, 1, MAX_COUNT)
    n_sbu: int = bounded(300, 1, MAX_COUNT)
    n_vcr: int = bounded(150, 1, MAX_COUNT)
    n_nlvr2_pairs: int = bounded(200, 1, MAX_COUNT)
    # test items added after the whole world is written, from streams of their own (nothing else
    # moves): COCO test2015 images with VQA questions beyond n_vqa_test, RefCOCO+ test images, VCR test images and NLVR2
    # test pairs beyond the 15% of n_vcr / n_nlvr2_pairs, so that a gain's interval can resolve
    # 2 points (pipeline/mini_world/eval_extension.py)
    n_vqa_test_extra: int = bounded(447, 0, MAX_COUNT)
    n_refcoco_test_extra: int = bounded(482, 0, MAX_COUNT)  # COCO train2014 images, testA and testB alternately
    n_vcr_test_extra: int = bounded(710, 0, MAX_COUNT)
    n_nlvr2_test_extra_pairs: int = bounded(424, 0, MAX_COUNT)
    # Flickr30k photos with SNLI-VE test items only (outside the Karpathy file: retrieval's gallery keeps its size)
    n_snli_ve_test_extra: int = bounded(268, 0, MAX_COUNT)
    # COCO train2014 images with RefCOCO+ val refs, drawn before RefCOCO+'s extra test images: a dev
    # split large enough to size RefCOCO+'s test split from (docs/decisions.md#eval-protocol)
    n_refcoco_val_extra: int = bounded(132, 0, MAX_COUNT)
    captions_per_image: int = bounded(5, 1, 100)
    max_objects: int = bounded(5, 1, 100)
    n_planted_each: int = bounded(6, 1, 1000)
    # COCO test2015 images carrying the VQA test questions: about as many as VQA val has (~130 images),
    # so a test score is as precise as the dev score choices are made on
    n_vqa_test: int = bounded(130, 1, MAX_COUNT)
    vqa_questions_per_image: int = bounded(3, 1, 100)
    # COCO train2014 images with RefCOCO+ refs (val/testA/testB ~10% each)
    n_refcoco_images: int = bounded(120, 1, MAX_COUNT)
    # naming: expressions the detector's class names answer; comparing: comparing ones first where a scene has them
    refcoco_expressions: Literal["naming", "comparing"] = "naming"
    # colour-shape kinds that no RefCOCO+ train expression refers to (val and test still do), the
    # first n of a fixed order that spreads them over colours and shapes: a fine-tuning split that
    # leaves part of what its test asks to pretraining (pipeline/mini_world/refcoco.py)
    refcoco_unseen_kinds: int = bounded(12, 0, 29)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        def pool(need: int, size: int, what: str) -> str | None:
            return f"needs {need} {what} ids, more than the {size} the COCO writer draws from" if need > size else None

        refcoco_extra = self.n_refcoco_test_extra + self.n_refcoco_val_extra
        with_refcoco = "(mini_world.n_coco + mini_world.n_refcoco_test_extra + mini_world.n_refcoco_val_extra)"
        return checked(
            n_coco=pool(self.n_coco + self.n_vqa_test + self.n_vqa_test_extra + refcoco_extra,
                        COCO_IMAGE_IDS, "image (mini_world.n_coco + mini_world.n_vqa_test + "
                        "mini_world.n_vqa_test_extra + mini_world.n_refcoco_test_extra + "
                        "mini_world.n_refcoco_val_extra)"),
            captions_per_image=pool((self.n_coco + refcoco_extra) * self.captions_per_image, COCO_CAPTION_IDS,
                                    f"caption ({with_refcoco} * mini_world.captions_per_image)"),
            max_objects=pool((self.n_coco + refcoco_extra) * self.max_objects, COCO_INSTANCE_IDS,
                             f"instance ({with_refcoco} * mini_world.max_objects)"),
        )


# what each sources path must be (the path check says so before a reader opens it)
FILE, DIR = "file", "dir"


@dataclass(frozen=True)
class CocoSource:
    captions_train: Path = must_exist(kind=FILE)
    captions_val: Path = must_exist(kind=FILE)
    instances_train: Path = must_exist(kind=FILE)
    instances_val: Path = must_exist(kind=FILE)
    karpathy: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)
    # image_info_test2015.json: the URLs of the test2015 images (VQA test), which decontamination
    # needs and the VQA questions do not carry; null: those images are known by their id only
    image_info_test: Path | None = must_exist(kind=FILE)


@dataclass(frozen=True)
class VgSource:
    image_data: Path = must_exist(kind=FILE)
    region_descriptions: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)


@dataclass(frozen=True)
class Flickr30kSource:
    karpathy: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)


# How downloaded web images (CC, SBU) lie below image_root (pipeline/ingest/sources/web_images.py):
# img2dataset: its "files" output, shards NNNNN/<key>.jpg + NNNNN.parquet mapping url -> key, status;
# sha1: one flat folder of <sha1 of the URL's UTF-8 bytes, hex>.jpg
ImageLayout = Literal["img2dataset", "sha1"]


@dataclass(frozen=True)
class CcSource:
    train_tsv: Path = must_exist(kind=FILE)
    # null: the training TSV only (build_dbs then holds out outdomain_val_size)
    val_tsv: Path | None = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)  # the downloaded images (the download@cc stage's output folder)
    image_layout: ImageLayout = "img2dataset"


@dataclass(frozen=True)
class SbuSource:
    urls: Path = must_exist(kind=FILE)
    captions: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)
    image_layout: ImageLayout = "img2dataset"


@dataclass(frozen=True)
class DownloadConfig:
    """How ``download@cc`` / ``download@sbu`` run img2dataset (world: real; pipeline/ingest/download.py)."""

    # the img2dataset executable: a venv of its own (`make setup-download`), its pins fight ours (pandas<3)
    command: str = ".venv-img2dataset/bin/img2dataset"
    processes: int = bounded(4, 1, 1024)  # img2dataset processes_count
    threads: int = bounded(64, 1, 4096)  # img2dataset thread_count (per process)
    timeout_s: int = bounded(10, 1, 3600)  # per image request
    retries: int = bounded(0, 0, 100)  # extra tries per image after a failed request
    samples_per_shard: int = bounded(10_000, 1, MAX_COUNT)  # img2dataset number_sample_per_shard


@dataclass(frozen=True)
class VqaSource:
    questions_train: Path = must_exist(kind=FILE)
    questions_val: Path = must_exist(kind=FILE)
    questions_test: Path = must_exist(kind=FILE)
    annotations_train: Path = must_exist(kind=FILE)
    annotations_val: Path = must_exist(kind=FILE)
    # the test answers as an evaluation server holds them (the mini world writes one under eval_server/);
    # null on real data, whose test answers are not public: the test split is then predicted, not scored
    annotations_test: Path | None = must_exist(kind=FILE)


@dataclass(frozen=True)
class VcrSource:
    train: Path = must_exist(kind=FILE)
    val: Path = must_exist(kind=FILE)
    test: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)
    # the test labels as the leaderboard holds them (jsonl of annot_id, answer_label, rationale_label;
    # the mini world writes one under eval_server/); null on real data: test is predicted, not scored
    test_labels: Path | None = must_exist(kind=FILE)


@dataclass(frozen=True)
class Nlvr2Source:
    train: Path = must_exist(kind=FILE)
    dev: Path = must_exist(kind=FILE)
    test: Path = must_exist(kind=FILE)
    image_root: Path = must_exist(kind=DIR)


@dataclass(frozen=True)
class SnliVeSource:
    train: Path = must_exist(kind=FILE)
    dev: Path = must_exist(kind=FILE)
    test: Path = must_exist(kind=FILE)


@dataclass(frozen=True)
class RefcocoSource:
    refs: Path = must_exist(kind=FILE)
    instances: Path = must_exist(kind=FILE)
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
    download: DownloadConfig = field(default_factory=DownloadConfig)
