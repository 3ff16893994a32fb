"""NLVR2: is the statement true of the image pair? ``finetune.nlvr2_variant`` picks the input layout.

- ``pair`` and ``pair_biattn`` (default): two rows per example, ``[CLS] statement [SEP]`` with the
  left image's regions, then with the right image's (``model.tasks.nlvr2``: row 2i / 2i+1).
- ``triplet``: one row, the statement with the left regions then the right ones.
With ``finetune.nlvr2_image_types`` (default, UNITER) the left image's regions carry segment type
1 and the right image's type 2 in every variant; without, both carry the region type 1.
Text DBs ``nlvr2_{train,dev,test}`` (``image_ids`` = [left, right], ``label`` 1 true / 0 false /
-1 unlabeled). Metrics: accuracy on dev and test; chance = the majority training label.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from model.config import UniterConfig
from model.tasks import UniterForNlvr2
from model.tasks.nlvr2 import LEFT_IMAGE_TYPE, RIGHT_IMAGE_TYPE
from pipeline.finetune.tasks.classification import ClassificationTask
from pipeline.finetune.tasks.rows import TaskDataset, row, text_row


class Nlvr2Task(ClassificationTask):
    name = "nlvr2"
    streams = ("nlvr2",)
    headline = (("NLVR2 {split} acc", "accuracy"),)

    @property
    def variant(self) -> str:
        return self.ctx.cfg.nlvr2_variant

    def dataset(self, split: str) -> TaskDataset:
        db = self.db(f"nlvr2_{split}")
        regions, special, triplet = self.regions, self.special, self.variant == "triplet"
        image_types = self.ctx.cfg.nlvr2_image_types

        def typed(regs: dict[str, np.ndarray], side: int) -> dict[str, Any]:
            return {"img_type_ids": [side] * len(regs["features"])} if image_types else {}

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            images = rec["image_ids"]
            if len(images) != 2:
                raise ValueError(f"{db.path}: example {eid} has {len(images)} images, expected a pair")
            text = text_row(special, rec["input_ids"])
            left, right = regions.get(images[:1]), regions.get(images[1:])
            sides = typed(left, LEFT_IMAGE_TYPE), typed(right, RIGHT_IMAGE_TYPE)
            if triplet:
                both = {k: np.concatenate([left[k], right[k]]) for k in ("features", "norm_bb")}
                types = {k: v + sides[1][k] for k, v in sides[0].items()}
                rows = [row(text, both, **types)]
            else:
                rows = [row(text, left, **sides[0]), row(text, right, **sides[1])]
            return {"id": eid, "rows": rows, "target": int(rec["label"])}

        def row_len(eid: str) -> tuple[int, int, int]:
            left, right = (regions.count([q]) for q in db.txt2img[eid])
            if triplet:
                return db.id2len[eid] + 2, left + right, 1
            return db.id2len[eid] + 2, max(left, right), 2

        return TaskDataset(db, self.labelled(f"nlvr2_{split}"), build=build, row_len=row_len)

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        cfg = self.ctx.cfg
        return UniterForNlvr2(config, img_dim=img_dim, variant=self.variant,  # type: ignore[arg-type]
                              image_types=cfg.nlvr2_image_types, head=cfg.nlvr2_head)  # type: ignore[arg-type]

    def model_info(self) -> dict[str, Any]:
        return {"variant": self.variant, "head": self.ctx.cfg.nlvr2_head}
