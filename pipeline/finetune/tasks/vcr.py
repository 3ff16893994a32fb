"""VCR: score each of the four choices; Q→A, QA→R and Q→AR accuracy.

Two training streams over the text DBs of build_dbs, alternating by a seeded schedule:
- ``qa`` (``vcr_qa_<split>``): row k = ``[CLS] question [SEP] answer_k [SEP]``, target ``label``;
- ``qar`` (``vcr_qar_<split>``): row k = ``[CLS] question [SEP] gold answer [SEP] rationale_k [SEP]``.
Every row sees the example's regions: the given boxes (``vcr_gt``, object tag k = region k) then
the detected ones (``vcr``). The model starts from the second-stage (VCR) pretraining export.
Q→AR counts a question right when both its answer and its rationale are picked right. Scored on
val (dev) and on test when its labels are here: real VCR test labels are not public (a leaderboard
scores them), so only the mini world's evaluation-server file (``sources.vcr.test_labels``) gives them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import UniterForVcr
from pipeline.finetune.tasks.base import EvalResult, FinetuneTask, percent, predict, scored_items
from pipeline.finetune.tasks.rows import TaskDataset, eval_batches, row
from pipeline.stores.vcr_views import vcr_sequence

NUM_CHOICES = 4
VIEW_DB = {"qa": "vcr_qa", "qar": "vcr_qar"}


def q2ar_scores(qa_right: set[str], qar_right: set[str], qa_ids: list[str], qar_ids: list[str]) -> dict[str, float]:
    """{question id: 1.0 or 0.0} of Q→AR over the questions scored for both an answer and a
    rationale: right only when both were picked right."""
    both = set(qa_ids) & set(qar_ids)
    return {e: float(e in qa_right and e in qar_right) for e in sorted(both)}


def vcr_accuracies(qa_right: set[str], qar_right: set[str], qa_ids: list[str], qar_ids: list[str]) -> dict[str, float]:
    """Q→A over the questions scored for answers, QA→R over those scored for rationales, Q→AR
    (:func:`q2ar_scores`) over those scored for both."""
    q2ar = q2ar_scores(qa_right, qar_right, qa_ids, qar_ids)
    return {"q2a": percent(len(qa_right & set(qa_ids)), len(qa_ids)),
            "qa2r": percent(len(qar_right & set(qar_ids)), len(qar_ids)),
            "q2ar": percent(sum(q2ar.values()), len(q2ar)), "questions": len(q2ar)}


class VcrTask(FinetuneTask):
    name = "vcr"
    init_stage = "pretrain_vcr"
    streams = ("qa", "qar")
    headline = (("VCR {split} Q→AR", "q2ar"),)

    def text_dbs(self) -> list[str]:
        return [f"{VIEW_DB[v]}_{s}" for s in ("train", *self.splits.scored) for v in self.streams]

    def test_labels_here(self) -> bool:
        return all(self.dataset(v, self.test_split).ids for v in self.streams)

    def scored_splits(self) -> list[str]:
        return [self.dev_split, *([self.test_split] if self.test_labelled() else [])]

    def dataset(self, view: str, split: str) -> TaskDataset:
        db = self.db(f"{VIEW_DB[view]}_{split}")
        regions, special = self.regions, self.special

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            choices = rec["choices"]
            if len(choices) != NUM_CHOICES:
                raise ValueError(f"{db.path}: example {eid} has {len(choices)} choices, expected {NUM_CHOICES}")
            reg = regions.get(rec["image_ids"])
            if view == "qa":
                texts = [vcr_sequence(special, rec["input_ids"], c) for c in choices]
            else:
                gold = rec["answer_choices"][int(rec["answer_label"])]
                texts = [vcr_sequence(special, rec["input_ids"], gold, c) for c in choices]
            rows = [row(ids, reg, txt_type_ids=types) for ids, types in texts]
            return {"id": eid, "rows": rows, "target": int(rec["label"])}

        specials = 3 if view == "qa" else 4

        def row_len(eid: str) -> tuple[int, int, int]:
            return db.id2len[eid] + specials, regions.count(db.txt2img[eid]), NUM_CHOICES

        keys = ("label", "answer_label") if view == "qar" else ("label",)  # QA→R needs the gold answer too
        return TaskDataset(db, self.labelled(db.name, *keys), build=build, row_len=row_len)

    def train_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(stream, "train")

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(stream, self.dev_split)

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        return UniterForVcr(config, img_dim=img_dim, loss=self.ctx.cfg.vcr_loss)

    def correct_ids(self, model: nn.Module, view: str, split: str, device: torch.device) -> tuple[set[str], int]:
        """(ids of the examples whose choice was picked right, examples scored) for one view of ``split``."""
        ds = self.dataset(view, split)
        right: set[str] = set()
        for batch, out in predict(model, eval_batches(ds, self.collate, batch_tokens=self.ctx.cfg.eval_batch_tokens),
                                  device):
            picks = out.logits.view(len(batch["ids"]), NUM_CHOICES).argmax(-1).cpu()
            right.update(e for e, ok in zip(batch["ids"], (picks == batch["targets"]).tolist()) if ok)
        return right, len(ds)

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        metrics, items = {}, {}
        for split in self.scored_splits():
            qa_right, _ = self.correct_ids(model, "qa", split, device)
            qar_right, _ = self.correct_ids(model, "qar", split, device)
            qa, qar = self.dataset("qa", split), self.dataset("qar", split)
            metrics[split] = vcr_accuracies(qa_right, qar_right, qa.ids, qar.ids)
            items[f"{split}/q2ar"] = scored_items(qa.db, q2ar_scores(qa_right, qar_right, qa.ids, qar.ids))
        return EvalResult(metrics=metrics, artifacts={}, items=items)

    def chance(self) -> dict[str, float]:
        p = 100.0 / NUM_CHOICES
        levels = {"q2a": p, "qa2r": p, "q2ar": p / NUM_CHOICES}
        return {f"{s}/{m}": v for s in self.scored_splits() for m, v in levels.items()}
