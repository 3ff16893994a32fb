"""SNLI-VE: does the premise image entail, contradict or stay neutral to the hypothesis? 3-way on [CLS].

Text DBs ``snli_ve_{train,dev,test}`` (``label`` = index into ``entailment, neutral, contradiction``).
Metrics: accuracy on dev and test, and its chance level (the most frequent training label).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from model.config import UniterConfig
from model.tasks import SNLI_VE_LABELS, UniterForSnliVe
from pipeline.finetune.tasks.classification import ClassificationTask
from pipeline.finetune.tasks.rows import TaskDataset, row, text_row


class SnliVeTask(ClassificationTask):
    name = "snli_ve"
    streams = ("snli_ve",)
    headline = (("SNLI-VE {split} acc", "accuracy"),)

    def dataset(self, split: str) -> TaskDataset:
        db = self.db(f"snli_ve_{split}")
        regions = self.regions

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            images = rec["image_ids"]
            return {"id": eid, "rows": [row(text_row(self.special, rec["input_ids"]), regions.get(images))],
                    "target": int(rec["label"])}

        def row_len(eid: str) -> tuple[int, int, int]:
            return db.id2len[eid] + 2, regions.count(db.txt2img[eid]), 1

        return TaskDataset(db, self.labelled(f"snli_ve_{split}"), build=build, row_len=row_len)

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        return UniterForSnliVe(config, img_dim=img_dim, loss=self.ctx.cfg.snli_ve_loss)

    def model_info(self) -> dict[str, Any]:
        return {"labels": list(SNLI_VE_LABELS)}
