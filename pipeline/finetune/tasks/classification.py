"""Single-label classification tasks over ``<task>_{train,dev,test}`` text DBs (NLVR2, SNLI-VE).

What these tasks share: training on ``train``, holding out ``dev``, accuracy on the dev and test
splits of ``TASK_SPLITS`` by the argmax of the head's logits against the example's ``label``, and
the chance level of always answering the most frequent training label. A subclass says how an
example becomes rows (``dataset``) and which ``model.tasks`` head it trains (``build_model``).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from pipeline.finetune.tasks.base import EvalResult, FinetuneTask, percent, predict, scored_items
from pipeline.finetune.tasks.rows import TaskDataset, eval_batches


class ClassificationTask(FinetuneTask):
    """Base of the tasks scored by accuracy on one int ``label`` per example (-1: unlabeled).

    The text DBs are named after the task (``<name>_train``, ``<name>_dev``, ``<name>_test``);
    a subclass implements :meth:`dataset` and ``build_model``.
    """

    def dataset(self, split: str) -> TaskDataset:
        """The labelled examples of DB ``<name>_<split>``, one item per example with ``target`` = label."""
        raise NotImplementedError

    def text_dbs(self) -> list[str]:
        return [f"{self.name}_train", *(f"{self.name}_{s}" for s in self.splits.scored)]

    def train_dataset(self, stream: str) -> TaskDataset:
        return self.dataset("train")

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(self.dev_split)

    def hits(self, model: nn.Module, dataset: TaskDataset, device: torch.device) -> dict[str, float]:
        """{example id: 1.0 when its argmax class (logits [items, classes]) equals its target, else 0.0}."""
        out: dict[str, float] = {}
        batches = eval_batches(dataset, self.collate, batch_tokens=self.ctx.cfg.eval_batch_tokens)
        for batch, result in predict(model, batches, device):
            right = (result.logits.argmax(-1).cpu() == batch["targets"]).tolist()
            out.update((e, float(ok)) for e, ok in zip(batch["ids"], right))
        return out

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        """``{split: {"accuracy": percent, "examples": n}}`` for dev and test, with per-item scores; no artifacts."""
        metrics, items = {}, {}
        for split in self.splits.scored:
            ds = self.dataset(split)
            hits = self.hits(model, ds, device)
            metrics[split] = {"accuracy": percent(sum(hits.values()), len(ds)), "examples": len(ds)}
            items[f"{split}/accuracy"] = scored_items(ds.db, hits)
        return EvalResult(metrics=metrics, artifacts={}, items=items)

    def chance(self) -> dict[str, float]:
        """Always answering the most frequent training label: ``{"<split>/accuracy": percent}``."""
        train = self.db(f"{self.name}_train")
        majority = Counter(int(train[e]["label"]) for e in self.labelled(f"{self.name}_train")).most_common(1)[0][0]
        out = {}
        for split in self.splits.scored:
            db = self.db(f"{self.name}_{split}")
            ids = self.labelled(f"{self.name}_{split}")
            out[f"{split}/accuracy"] = percent(sum(int(db[e]["label"]) == majority for e in ids), len(ids))
        return out
