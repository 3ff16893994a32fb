"""Which of the release's LMDBs become which of this project's DBs, and how image names map to ids.

Names are those of UNITER's download scripts (``scripts/download_*.sh``): image DB directories
``coco_{train2014,val2014,test2015}``, ``vg``, ``flickr30k``, ``nlvr2_{train,dev,test}``; text DBs
``pretrain_{coco,vg}_*``, ``itm_{coco,flickr30k}_*``, ``vqa_*``, ``nlvr2_*``, ``ve_*``. The release
has no CC/SBU DBs, and its VCR and RefCOCO DBs use layouts (paired gt/detected images, instance
files) this importer does not convert: those are reported as skipped, never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.stores.text_db_builder import SNLI_LABELS

# release image DB directory -> this project's image DB (its image source, as in pipeline/ingest/sources)
IMAGE_DIRS = {
    "coco_train2014": "coco", "coco_val2014": "coco", "coco_test2015": "coco",
    "vg": "vg", "flickr30k": "flickr30k",
    "nlvr2_train": "nlvr2", "nlvr2_dev": "nlvr2", "nlvr2_test": "nlvr2",
}

# the release's image DB directories and text DBs that no DB of this project is made from (VCR's
# gt/detected image pairs, RefCOCO's instance files): reported as not converted; any other name is an error
NOT_CONVERTED_IMAGE_DIRS = re.compile(r"vcr(_gt)?_(train|val|test)|re_coco_(gt|det)")
NOT_CONVERTED_TEXT_DBS = re.compile(r"vcr_(train|val|test)|refcoco(\+|g)?_(train|val|test|testA|testB)")

# UNITER's VE labels (its utils/misc.py VE_IDX2ENT): index -> name; this project orders them as SNLI_LABELS
UNITER_VE_LABELS = ("contradiction", "entailment", "neutral")
VE_LABEL_MAP = {i: SNLI_LABELS.index(name) for i, name in enumerate(UNITER_VE_LABELS)}


@dataclass(frozen=True)
class TextTarget:
    """One text DB of this project and the release DBs (``txt_db/<name>.db``) merged into it."""

    name: str
    task: str  # how targets convert: pretrain | retrieval | vqa | nlvr2 | snli_ve
    split: str
    sources: tuple[str, ...]
    image_layout: str = "single"


def _targets() -> tuple[TextTarget, ...]:
    out = [
        TextTarget("pretrain_indomain_train", "pretrain", "train",
                   ("pretrain_coco_train", "pretrain_coco_restval", "pretrain_vg_train")),
        TextTarget("pretrain_indomain_val", "pretrain", "val", ("pretrain_coco_val", "pretrain_vg_val")),
        TextTarget("retrieval_coco_train", "retrieval", "train", ("itm_coco_train", "itm_coco_restval")),
        # UNITER's VQA training set: train, val minus its 'devval' hold-out, and VG questions
        TextTarget("vqa_train", "vqa", "train", ("vqa_train", "vqa_trainval", "vqa_vg")),
        TextTarget("vqa_val", "vqa", "val", ("vqa_devval",)),
        TextTarget("vqa_test", "vqa", "test", ("vqa_test",)),
        TextTarget("nlvr2_test", "nlvr2", "test", ("nlvr2_test1",), "pair"),
    ]
    out += [TextTarget(f"retrieval_coco_{s}", "retrieval", s, (f"itm_coco_{s}",)) for s in ("val", "test")]
    out += [TextTarget(f"retrieval_flickr_{s}", "retrieval", s, (f"itm_flickr30k_{s}",))
            for s in ("train", "val", "test")]
    out += [TextTarget(f"nlvr2_{s}", "nlvr2", s, (f"nlvr2_{s}",), "pair") for s in ("train", "dev")]
    out += [TextTarget(f"snli_ve_{s}", "snli_ve", s, (f"ve_{s}",)) for s in ("train", "dev", "test")]
    return tuple(sorted(out, key=lambda t: t.name))


TEXT_TARGETS = _targets()
TEXT_SOURCES = {src: t for t in TEXT_TARGETS for src in t.sources}

_DIGITS = re.compile(r"0*(\d+)")


def image_id(fname: str, release_dir: str) -> str | None:
    """A release image name -> this project's image id in ``IMAGE_DIRS[release_dir]``, or None.

    ``coco_train2014_000000000009.npz`` -> ``9`` (COCO, VG and Flickr ids are numbers, written
    without zero padding as the ingest readers do); ``nlvr2_train-10171-0-img0.npz`` ->
    ``train-10171-0-img0`` (NLVR2's own image name). The name must end in ``.npz`` and start with
    the directory's name or its image source's, followed by ``_``.
    """
    source = IMAGE_DIRS[release_dir]
    if not fname.endswith(".npz"):
        return None
    stem = fname[: -len(".npz")]
    for prefix in sorted({f"{release_dir}_", f"{source}_"}, key=len, reverse=True):
        if stem.startswith(prefix) and len(stem) > len(prefix):
            rest = stem[len(prefix):]
            digits = _DIGITS.fullmatch(rest)
            return digits.group(1) if digits else rest
    return None
