"""SNLI-VE: does the premise image entail, contradict or stay neutral to the hypothesis? 3-way on [CLS].

Text DBs ``snli_ve_{train,dev,test}`` (``label`` = index into ``entailment, neutral, contradiction``).
Metrics: accuracy on dev and test, and its chance level (the most frequent training label).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import SNLI_VE_LABELS, UniterForSnliVe
from pipeline.tasks.base import EvalResult, FinetuneTask, percent
from pipeline.tasks.data import TaskDataset, row, text_row

EVAL_SPLITS = ("dev", "test")


class SnliVeTask(FinetuneTask):
    name = "snli_ve"
    streams = ("snli_ve",)
    summary = (("SNLI-VE test acc", "test/accuracy"),)

    def text_dbs(self) -> list[str]:
        return ["snli_ve_train", *(f"snli_ve_{s}" for s in EVAL_SPLITS)]

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

    def train_dataset(self, stream: str) -> TaskDataset:
        return self.dataset("train")

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(EVAL_SPLITS[0])

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        return UniterForSnliVe(config, img_dim=img_dim)

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        metrics = {}
        for split in EVAL_SPLITS:
            ds = self.dataset(split)
            metrics[split] = {"accuracy": percent(self.correct(model, ds, device), len(ds)), "examples": len(ds)}
        return EvalResult(metrics=metrics, artifacts={})

    def chance(self) -> dict[str, float]:
        """Always answering the most frequent training label."""
        train = self.db("snli_ve_train")
        majority = Counter(int(train[e]["label"]) for e in self.labelled("snli_ve_train")).most_common(1)[0][0]
        out = {}
        for split in EVAL_SPLITS:
            db = self.db(f"snli_ve_{split}")
            ids = self.labelled(f"snli_ve_{split}")
            out[f"{split}/accuracy"] = percent(sum(int(db[e]["label"]) == majority for e in ids), len(ids))
        return out

    def model_info(self) -> dict[str, Any]:
        return {"labels": list(SNLI_VE_LABELS)}
