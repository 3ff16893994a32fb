"""Image-text retrieval (Flickr30k, Karpathy splits) with hard negatives; R@1/5/10 both ways.

Training alternates two streams over the captions of ``retrieval_flickr_train``:
- ``t2i``: the caption with its image and ``retrieval_neg_pool`` random other images;
- ``i2t``: the caption's image with the caption and as many random captions of other images.
The model scores every candidate without gradients (eval mode) and trains on the positive plus
the ``retrieval_hard_negatives`` highest-scoring negatives (UNITER's hard-negative fine-tuning,
train_itm_hard_negatives.py), with ``finetune.retrieval_loss``: the hinge on sigmoid scores
(UNITER) or the softmax over the 1 + N candidates.

Evaluation ranks every image for every caption (image retrieval, IR) and every caption for every
image (text retrieval, TR) on the val (dev) and test splits in streamed blocks (``retrieval_eval``). The
pretrained start is evaluated before training too, its score being the pretrained ITM head
(``UniterForRetrieval.init_from_pretraining``): zero-shot retrieval.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from model.config import UniterConfig
from model.tasks import TaskOutput, UniterForRetrieval
from pipeline.training.paired import group_key, item_scores
from pipeline.finetune.tasks.base import EvalResult, FinetuneTask
from pipeline.finetune.tasks.retrieval_eval import (RECALL_KS, chance_recall, query_hits, recall_at_k,
                                                     streaming_topk)
from pipeline.finetune.tasks.rows import TaskDataset, mix_seed, row, text_row
from pipeline.training.engine import cast_batch

ROW_KEYS = ("input_ids", "txt_mask", "img_feat", "img_pos", "img_mask")


class RetrievalTask(FinetuneTask):
    name = "retrieval_flickr"
    streams = ("t2i", "i2t")
    headline = (("Flickr {split} IR R@1", "ir_r1"), ("Flickr {split} TR R@1", "tr_r1"))
    has_zero_shot = True
    start_heads = ("itm",)  # the scorer starts from the ITM classifier (load_pretrained)
    db_prefix = "retrieval_flickr"

    def text_dbs(self) -> list[str]:
        return [f"{self.db_prefix}_{s}" for s in ("train", *self.splits.scored)]

    def images_of(self, split: str) -> tuple[list[str], list[int]]:
        """(sorted image ids, image index of every caption in ``db.ids`` order)."""
        db = self.db(f"{self.db_prefix}_{split}")
        images = sorted({db.txt2img[e][0] for e in db.ids})
        where = {q: i for i, q in enumerate(images)}
        return images, [where[db.txt2img[e][0]] for e in db.ids]

    def train_dataset(self, stream: str) -> TaskDataset:
        return self.pool_dataset("train", stream)

    def held_out_dataset(self, stream: str) -> TaskDataset:
        return self.pool_dataset(self.dev_split, stream)

    def pool_dataset(self, split: str, stream: str) -> TaskDataset:
        """Items = captions; rows = the positive pair then the pool of random negatives."""
        db = self.db(f"{self.db_prefix}_{split}")
        images, image_of = self.images_of(split)
        regions, special, stream_id = self.regions, self.special, self.streams.index(stream)
        pool = min(self.ctx.cfg.retrieval_neg_pool, len(images) - 1)
        if pool < 1:
            raise ValueError(f"{db.path}: retrieval needs at least two images, found {len(images)}")
        trained_rows = 1 + min(self.ctx.cfg.retrieval_hard_negatives, pool)
        max_txt = max(db.id2len.values()) + 2
        max_img = max(regions.count([q]) for q in images)

        def build(index: int, eid: str, rec: dict[str, Any]) -> dict[str, Any]:
            # the pool of example ``index`` depends on (seed, epoch, stream, index) only: exact resume
            g = np.random.default_rng(mix_seed(self.ctx.seed, ds.epoch, stream_id, index))
            own = image_of[index]
            text = text_row(special, rec["input_ids"])
            if stream == "t2i":
                others = g.choice(len(images) - 1, size=pool, replace=False)
                negatives = [images[i + (i >= own)] for i in others.tolist()]  # skip the own image
                rows = [row(text, regions.get([q])) for q in [images[own], *negatives]]
            else:
                candidates = np.flatnonzero(np.asarray(image_of) != own)
                picked = g.choice(candidates, size=min(pool, len(candidates)), replace=False)
                reg = regions.get([images[own]])
                texts = [text] + [text_row(special, db[db.ids[i]]["input_ids"]) for i in picked.tolist()]
                rows = [row(t, reg) for t in texts]
            return {"id": eid, "rows": rows, "target": 0}

        def row_len(eid: str) -> tuple[int, int, int]:
            if stream == "t2i":
                return db.id2len[eid] + 2, max_img, trained_rows
            return max_txt, regions.count(db.txt2img[eid]), trained_rows

        ds = TaskDataset(db, db.ids, build=build, row_len=row_len)  # ``build`` reads ds.epoch
        return ds

    def collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        sizes = {len(it["rows"]) for it in items}
        if len(sizes) != 1:
            raise ValueError(f"retrieval items in one batch must have equal candidate counts, got {sorted(sizes)}")
        return super().collate(items)

    def build_model(self, config: UniterConfig, *, img_dim: int) -> nn.Module:
        cfg = self.ctx.cfg
        return UniterForRetrieval(config, img_dim=img_dim, loss=cfg.retrieval_loss, margin=cfg.retrieval_margin)

    def load_pretrained(self, model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
        model.init_from_pretraining(state)  # encoder + the ITM head as the scorer

    def train_forward(self, model: nn.Module, batch: dict[str, Any], stream: str) -> TaskOutput:
        """Score the pool without gradients, then train on the positive + the hardest negatives."""
        groups = len(batch["ids"])
        rows = batch["input_ids"].shape[0]
        per_group = rows // groups
        was_training = model.training
        with torch.no_grad():
            model.eval()
            scores = model({k: batch[k] for k in ROW_KEYS}).logits.view(groups, per_group)
            model.train(was_training)
        n_hard = min(self.ctx.cfg.retrieval_hard_negatives, per_group - 1)
        hardest = scores[:, 1:].float().topk(n_hard, dim=1).indices + 1
        chosen = torch.cat([torch.zeros_like(hardest[:, :1]), hardest], dim=1)
        chosen = (chosen + torch.arange(groups, device=chosen.device)[:, None] * per_group).flatten()
        sub = {k: batch[k][chosen] for k in ROW_KEYS}
        sub["targets"] = torch.zeros(groups, dtype=torch.long, device=chosen.device)
        return model(sub)

    # -- evaluation ------------------------------------------------------------------------------

    def eval_texts(self, split: str) -> tuple[list[str], list[str], list[int]]:
        """(caption ids, image ids, image index of each caption) ranked in evaluation: every image of
        ``split``, with its first ``retrieval_eval_captions`` captions (all when 0)."""
        db = self.db(f"{self.db_prefix}_{split}")
        images, image_of = self.images_of(split)
        limit = self.ctx.cfg.retrieval_eval_captions
        kept, seen = [], [0] * len(images)
        for eid, i in zip(db.ids, image_of):
            if limit <= 0 or seen[i] < limit:
                kept.append((eid, i))
                seen[i] += 1
        return [e for e, _ in kept], images, [i for _, i in kept]

    def evaluate(self, model: nn.Module, device: torch.device, *, artifacts: bool = True) -> EvalResult:
        metrics, items = {}, {}
        for split in self.splits.scored:
            metrics[split], split_items = self.ranking_metrics(model, split, device)
            items.update({f"{split}/{name}": v for name, v in split_items.items()})
        return EvalResult(metrics=metrics, artifacts={}, items=items)

    def ranking_metrics(self, model: nn.Module, split: str,
                        device: torch.device) -> tuple[dict[str, Any], dict[str, dict[str, list]]]:
        """R@1/5/10 both ways and their mean on ``split``, with the numbers of texts and images ranked;
        and the per-query R@1 hits (``ir_r1``: one item per caption, ``tr_r1``: one per image), each
        query grouped by its image."""
        db = self.db(f"{self.db_prefix}_{split}")
        captions, images, image_of = self.eval_texts(split)
        texts = _pad([text_row(self.special, db[e]["input_ids"]) for e in captions])
        feats = [self.regions.get([q]) for q in images]
        img = _pad_regions(feats)
        rows_per_call = max(1, self.ctx.cfg.eval_batch_tokens // (texts["input_ids"].shape[1] + img["img_feat"].shape[1]))
        image_block = min(len(images), rows_per_call)
        text_block = max(1, rows_per_call // image_block)

        was_training = model.training
        model.eval()

        @torch.no_grad()
        def score_block(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
            n_t, n_i = len(t), len(i)
            batch = {k: v[t].repeat_interleave(n_i, 0) for k, v in texts.items()}
            batch.update({k: v[i].repeat(n_t, *([1] * (v.dim() - 1))) for k, v in img.items()})
            batch = _trim(batch)
            batch["img_feat"] = batch["img_feat"].float()
            return model(cast_batch(batch, device, "fp32")).logits.view(n_t, n_i)

        try:
            t_top, i_top, _ = streaming_topk(score_block, len(captions), len(images), text_block=text_block,
                                             image_block=image_block)
        finally:
            model.train(was_training)
        captions_of: list[set[int]] = [set() for _ in images]
        for t, i in enumerate(image_of):
            captions_of[i].add(t)
        image_of_text = [{i} for i in image_of]
        ir = recall_at_k(t_top, image_of_text)
        tr = recall_at_k(i_top, captions_of)
        metrics = {**{f"ir_{k}": v for k, v in ir.items()}, **{f"tr_{k}": v for k, v in tr.items()}}
        metrics["r_mean"] = round(sum(metrics.values()) / len(metrics), 4)
        metrics.update(texts=len(captions), images=len(images))
        items = {"ir_r1": item_scores(captions, [group_key([images[i]]) for i in image_of],
                                      query_hits(t_top, image_of_text, 1)),
                 "tr_r1": item_scores(images, [group_key([q]) for q in images], query_hits(i_top, captions_of, 1))}
        return metrics, items

    def chance(self) -> dict[str, float]:
        out = {}
        for split in self.splits.scored:
            _, images, image_of = self.eval_texts(split)
            counts = np.bincount(np.asarray(image_of), minlength=len(images)).tolist()
            ir = chance_recall(len(images), [1] * len(image_of))
            tr = chance_recall(len(image_of), counts)
            out.update({f"{split}/ir_r{k}": ir[f"r{k}"] for k in RECALL_KS})
            out.update({f"{split}/tr_r{k}": tr[f"r{k}"] for k in RECALL_KS})
        return out


def _pad(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    length = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
    lens = torch.tensor([len(r) for r in rows])
    return {"input_ids": ids, "txt_mask": torch.arange(length)[None, :] < lens[:, None]}


def _pad_regions(regions: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Every image's regions, padded once: ``img_feat`` kept in float16 (the stored precision)."""
    li = max(len(r["features"]) for r in regions)
    dim = regions[0]["features"].shape[1]
    feat = torch.zeros((len(regions), li, dim), dtype=torch.float16)
    pos = torch.zeros((len(regions), li, 7), dtype=torch.float32)
    for b, r in enumerate(regions):
        n = len(r["features"])
        feat[b, :n] = torch.from_numpy(np.array(r["features"], dtype=np.float16))
        pos[b, :n] = torch.from_numpy(np.array(r["norm_bb"], dtype=np.float32))
    lens = torch.tensor([len(r["features"]) for r in regions])
    return {"img_feat": feat, "img_pos": pos, "img_mask": torch.arange(li)[None, :] < lens[:, None]}


def _trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Cut text and region padding to the longest row of this block."""
    lt = int(batch["txt_mask"].sum(1).max())
    li = int(batch["img_mask"].sum(1).max())
    out = {k: batch[k][:, :lt] for k in ("input_ids", "txt_mask")}
    out.update({k: batch[k][:, :li] for k in ("img_feat", "img_pos", "img_mask")})
    return out
