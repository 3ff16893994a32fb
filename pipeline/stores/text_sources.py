"""The text DBs a training stage reads, each plain or through a VCR view, and the image DBs they use.

Pretraining's plan names them (pipeline/pretrain/plan.py); fine-tuning's scratch start opens the
first pretraining stage's to fit its region projection as that stage did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from pipeline.params.parser import Params, ParamsError
from pipeline.params.pretrain import DATASET_CHOICES, DOMAIN_DATASETS
from pipeline.stores.readers import ImageDbGroup, TextDb
from pipeline.stores.vcr_views import GoldAnswerView, GoldRationaleView

# pretrain.datasets -> the text DB domains of the first pretraining stage
DOMAINS = DATASET_CHOICES


@dataclass(frozen=True)
class TextSource:
    """One pretraining text dataset: a text DB directory, optionally read through a view."""

    path: Path
    view: Literal["plain", "gold_answer", "gold_rationale"] = "plain"

    def open(self) -> TextDb | GoldAnswerView | GoldRationaleView:
        if not (self.path / "meta.json").exists():
            raise FileNotFoundError(f"text DB {self.path} not found (run the build_dbs stage first)")
        db = TextDb(self.path)
        views = {"gold_answer": GoldAnswerView, "gold_rationale": GoldRationaleView}
        return views[self.view](db) if self.view in views else db


def first_stage_corpora(params: Params) -> tuple[str, ...] | None:
    """The corpora the first stage draws from: those of ``pretrain.datasets`` that build_dbs built
    (``Params.pretrain_corpora``; COCO + VG alone is UNITER's in-domain pretraining); None with
    UNITER's release, whose DBs are not built from ``ingest.datasets``. Raises ParamsError for none."""
    if params.build_dbs.source != "extract":
        return None
    corpora = params.pretrain_corpora()
    if not params.pretrain.dataset_names(corpora):
        raise ParamsError(f"pretrain.datasets: {params.pretrain.datasets} draws from "
                          f"{', '.join(params.pretrain.dataset_names())}, none of which is a pretraining corpus "
                          f"in use ({', '.join(corpora) or 'none'}: those ingest.datasets and "
                          "decontaminate.pretrain_datasets both name)")
    return corpora


def first_stage_sources(txt_root: Path, datasets: str, split: str,
                        corpora: Sequence[str] | None = None) -> tuple[TextSource, ...]:
    """The first pretraining stage's text DBs of ``split`` (train | val) for ``pretrain.datasets``; with
    ``corpora`` (``Params.pretrain_corpora``) only the domains build_dbs built from them."""
    return tuple(TextSource(txt_root / f"pretrain_{d}_{split}") for d in DOMAINS[datasets]
                 if corpora is None or set(DOMAIN_DATASETS[d]) & set(corpora))


def open_sources(sources: Sequence[TextSource], img_root: Path) -> tuple[list[Any], ImageDbGroup]:
    """Open the text DBs (or views) and every image DB they reference."""
    txt_dbs = [s.open() for s in sources]
    names = sorted({n for db in txt_dbs for n in db.img_db_names})
    missing = [n for n in names if not (img_root / n / "meta.json").exists()]
    if missing:
        raise FileNotFoundError(f"image DB(s) {missing} referenced by {[str(s.path) for s in sources]} "
                                f"not found under {img_root}")
    return txt_dbs, ImageDbGroup(img_root, names)
