"""RefCOCO+: the expression picks one region; accuracy = the picked box overlaps the target at IoU >= 0.5.

Text DBs ``refcoco_plus_{train,val,testA,testB}``: ``image_ids`` (detected boxes, ``coco``),
``gt_image_ids`` (the image's ground-truth boxes, ``coco_gt``), ``target_box`` (x1, y1, x2, y2
pixels) and ``target_index`` (the ground-truth box that is the target, -1 if none).
Training uses the ground-truth boxes (CE over regions, target ``target_index``). Evaluation scores
val (dev), testA, testB and both test splits pooled (``testA+testB``, the reported score), each
twice: over the ground-truth boxes (``gt_accuracy``) and over the detector's boxes
(``det_accuracy``), taking the highest-scoring region's box. Chance level: the expected accuracy
of picking a region uniformly at random (the share of regions at IoU >= 0.5), per split and mode.
Reference level (``references``): the class oracle, which is told the target's detector class and
picks the most confident box of that class. It scores what naming the class alone can score: where
it is near 100, the expressions ask for nothing beyond the class and no start can gain much.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import UniterForRefExp
from pipeline.training.paired import pooled_items
from pipeline.finetune.tasks.base import EvalResult, FinetuneTask, percent, predict, scored_items
from pipeline.finetune.tasks.rows import TaskDataset, eval_batches, row, text_row

MODES = ("gt", "det")
IOU_THRESHOLD = 0.5


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes ``a`` [m, 4] and ``b`` [n, 4] (x1, y1, x2, y2) -> [m, n]."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(-1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(-1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def class_oracle_pick(soft_labels: np.ndarray, target_class: int) -> int:
    """The region the class oracle picks: the most confident one whose top class is ``target_class``.

    soft_labels: [n, C] each region's class distribution. Returns its index, or -1 if no region's
    top class is ``target_class``.
    """
    probs = np.asarray(soft_labels, np.float64)
    same = np.flatnonzero(probs.argmax(1) == target_class)
    return int(same[probs[same, target_class].argmax()]) if len(same) else -1


class RefcocoPlusTask(FinetuneTask):
    name = "refcoco_plus"
    streams = ("refcoco_plus",)
    headline = (("RefCOCO+ {split} acc (detected boxes)", "det_accuracy"),)

    def text_dbs(self) -> list[str]:
        return ["refcoco_plus_train", *(f"refcoco_plus_{s}" for s in self.splits.scored)]

    def score_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """(metrics key, splits pooled under it): every scored split, then test's splits together."""
        groups = [(s, (s,)) for s in self.splits.scored]
        if len(self.splits.test) > 1:
            groups.append((self.test_split, self.splits.test))
        return groups

    def extra_image_dbs(self) -> list[str]:
        gt = self.db("refcoco_plus_train").meta.get("gt_img_db")
        if not gt:
            raise FileNotFoundError(f"{self.db('refcoco_plus_train').path}: built without ground-truth boxes "
                                    "(no coco_gt image DB); RefCOCO+ trains on them")
        return [gt]

    @property
    def gt_img_db(self) -> str:
        return self.extra_image_dbs()[0]

    def images(self, db, eid: str, mode: str) -> list[str]:
        """The example's qualified image id: detected boxes, or the same image in the ground-truth DB."""
        detected = db.txt2img[eid]
        if mode == "det":
            return detected
        return [f"{self.gt_img_db}/{q.partition('/')[2]}" for q in detected]

    def dataset(self, split: str, mode: str, *, with_target_only: bool = False) -> TaskDataset:
        """Examples of ``split`` over ``mode``'s boxes; ``with_target_only``: those whose target is
        one of the ground-truth boxes (training needs a region index)."""
        db = self.db(f"refcoco_plus_{split}")
        regions, special = self.regions, self.special

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            reg = regions.get(self.images(db, eid, mode))
            return {"id": eid, "rows": [row(text_row(special, rec["input_ids"]), reg)],
                    "target": int(rec["target_index"]), "boxes": np.asarray(reg["boxes"]),
                    "target_box": np.asarray(rec["target_box"])}

        def row_len(eid: str) -> tuple[int, int, int]:
            return db.id2len[eid] + 2, regions.count(self.images(db, eid, mode)), 1

        ids = [e for e in db.ids if int(db[e]["target_index"]) >= 0] if with_target_only else db.ids
        return TaskDataset(db, ids, build=build, row_len=row_len)

    def train_dataset(self, stream: str) -> TaskDataset:
        return self.dataset("train", "gt", with_target_only=True)

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.dataset(self.dev_split, "gt", with_target_only=True)

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().collate(items)
        batch["boxes"] = [it["boxes"] for it in items]
        batch["target_boxes"] = [it["target_box"] for it in items]
        return batch

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        return UniterForRefExp(config, img_dim=img_dim)

    def hits(self, model: nn.Module, split: str, mode: str, device: torch.device) -> dict[str, float]:
        """{expression id: 1.0 when its picked box hits the target, else 0.0} of ``split`` over ``mode``'s boxes."""
        ds = self.dataset(split, mode)
        hits: dict[str, float] = {}
        for batch, out in predict(model, eval_batches(ds, self.collate, batch_tokens=self.ctx.cfg.eval_batch_tokens),
                                  device):
            for eid, pick, boxes, target in zip(batch["ids"], out.logits.argmax(-1).tolist(), batch["boxes"],
                                                batch["target_boxes"]):
                hits[eid] = float(box_iou(boxes[pick], target)[0, 0] >= IOU_THRESHOLD)
        return hits

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        per_split = {(s, m): self.hits(model, s, m, device) for s in self.splits.scored for m in MODES}
        metrics: dict[str, dict[str, Any]] = {}
        items: dict[str, dict[str, list]] = {}
        for key, group in self.score_groups():
            for mode in MODES:
                scored = pooled_items({s: scored_items(self.db(f"refcoco_plus_{s}"), per_split[(s, mode)])
                                       for s in group})
                metrics.setdefault(key, {})[f"{mode}_accuracy"] = percent(sum(scored["scores"]), len(scored["ids"]))
                metrics[key][f"{mode}_examples"] = len(scored["ids"])
                items[f"{key}/{mode}_accuracy"] = scored
        return EvalResult(metrics=metrics, artifacts={}, items=items)

    def chance(self) -> dict[str, float]:
        shares: dict[tuple[str, str], list[float]] = {}
        for split in self.splits.scored:
            db = self.db(f"refcoco_plus_{split}")
            for mode in MODES:
                for e in db.ids:
                    boxes = self.regions.get(self.images(db, e, mode))["boxes"]
                    hit = box_iou(boxes, db[e]["target_box"])[:, 0] >= IOU_THRESHOLD
                    shares.setdefault((split, mode), []).append(float(hit.mean()))
        out = {}
        for key, group in self.score_groups():
            for mode in MODES:
                pooled_shares = [v for s in group for v in shares.get((s, mode), [])]
                out[f"{key}/{mode}_accuracy"] = percent(sum(pooled_shares), len(pooled_shares))
        return out

    def references(self) -> dict[str, dict[str, Any]]:
        """The class oracle's accuracy per split and mode. The target's class is the top class of its
        ground-truth box; an expression whose target is not a ground-truth box counts as a miss."""
        oracle: dict[str, Any] = {"label": "class oracle (told the target's detector class, picks the most "
                                           "confident box of that class)"}
        counts: dict[tuple[str, str], tuple[int, int]] = {}
        for split in self.splits.scored:
            db = self.db(f"refcoco_plus_{split}")
            hits = dict.fromkeys(MODES, 0)
            for e in db.ids:
                rec = db[e]
                target_index = int(rec["target_index"])
                if target_index < 0:
                    continue
                gt = self.img_dbs[self.images(db, e, "gt")[0]]
                target_class = int(np.asarray(gt["soft_labels"])[target_index].argmax())
                for mode in MODES:
                    regions = gt if mode == "gt" else self.img_dbs[self.images(db, e, mode)[0]]
                    pick = class_oracle_pick(regions["soft_labels"], target_class)
                    hits[mode] += int(pick >= 0 and box_iou(regions["boxes"][pick], rec["target_box"])[0, 0]
                                      >= IOU_THRESHOLD)
            counts.update({(split, mode): (hits[mode], len(db.ids)) for mode in MODES})
        for key, group in self.score_groups():
            for mode in MODES:
                hit, n = (sum(counts[(s, mode)][k] for s in group) for k in (0, 1))
                oracle[f"{key}/{mode}_accuracy"] = percent(hit, n)
        return {"class_oracle": oracle}
