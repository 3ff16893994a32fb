"""The text DBs a training stage reads, each plain or through a VCR view, and the image DBs they use.

Pretraining's plan names them (pipeline/pretrain/plan.py); fine-tuning's scratch start opens the
first pretraining stage's to fit its region projection as that stage did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from pipeline.params.pretrain import DATASET_CHOICES
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


def first_stage_sources(txt_root: Path, datasets: str, split: str) -> tuple[TextSource, ...]:
    """The first pretraining stage's text DBs of ``split`` (train | val) for ``pretrain.datasets``."""
    return tuple(TextSource(txt_root / f"pretrain_{d}_{split}") for d in DOMAINS[datasets])


def open_sources(sources: Sequence[TextSource], img_root: Path) -> tuple[list[Any], ImageDbGroup]:
    """Open the text DBs (or views) and every image DB they reference."""
    txt_dbs = [s.open() for s in sources]
    names = sorted({n for db in txt_dbs for n in db.img_db_names})
    missing = [n for n in names if not (img_root / n / "meta.json").exists()]
    if missing:
        raise FileNotFoundError(f"image DB(s) {missing} referenced by {[str(s.path) for s in sources]} "
                                f"not found under {img_root}")
    return txt_dbs, ImageDbGroup(img_root, names)
