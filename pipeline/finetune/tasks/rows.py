"""Reading task examples from the stores and packing them into batches of model rows.

A downstream example becomes one or more *rows* (one encoder sequence each): VQA, SNLI-VE and
RefCOCO+ give one, NLVR2-pair two (one per image), VCR four (one per choice), retrieval one per
candidate. A dataset item is ``{"id": example id, "rows": [row, ...], "target": ...}`` where a
row holds ``input_ids`` i64 [lt] (``[CLS] ... [SEP]``), ``img_feat`` [n, D] and ``img_pos`` [n, 7]
(numpy, as stored) and optionally ``img_type_ids`` i64 [n]. :func:`collate_rows` flattens the rows
of a batch, in item order, into the batch of docs/design.md §10 (through
``pipeline.training.batching.collate_pretrain``) and the task adds its targets.

Token budgets: an item's ``txt_lens``/``img_lens`` entries are its longest row's text length and
region count times its number of rows, so TokenBucketSampler's B x (max text + max regions) bounds
the padded size of all the rows of a batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from pipeline.stores.readers import ImageDbGroup, TextDb
from pipeline.training.batching import TokenBucketSampler, collate_pretrain

_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts (SplitMix64 steps), for per-example generators."""
    x = 0
    for part in parts:
        x = (x ^ (int(part) & _MASK64)) & _MASK64
        x = (x + 0x9E3779B97F4A7C15) & _MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 31
    return x & ((1 << 63) - 1)


class Regions:
    """Concatenated regions of qualified image ids (``"<img_db>/<image_id>"``), as stored."""

    def __init__(self, img_dbs: ImageDbGroup) -> None:
        self.img_dbs = img_dbs

    def count(self, image_ids: Sequence[str]) -> int:
        return sum(self.img_dbs.num_regions(q) for q in image_ids)

    def get(self, image_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """``features`` [n, D], ``norm_bb`` [n, 7], ``boxes`` f32 [n, 4] (pixels) of the images, in order."""
        records = [self.img_dbs[q] for q in image_ids]
        keys = ("features", "norm_bb", "boxes")
        if len(records) == 1:
            return {k: records[0][k] for k in keys}
        return {k: np.concatenate([r[k] for r in records]) for k in keys}


def text_row(special: dict[str, int], *parts: Sequence[int]) -> torch.Tensor:
    """``[CLS] part1 [SEP] part2 [SEP] ...`` as i64 [sum(len) + 1 + len(parts)]."""
    ids = [special["cls"]]
    for part in parts:
        ids.extend(int(i) for i in part)
        ids.append(special["sep"])
    return torch.tensor(ids, dtype=torch.long)


def row(input_ids: torch.Tensor, regions: dict[str, np.ndarray], **extra: Any) -> dict[str, Any]:
    return {"task": "finetune", "input_ids": input_ids, "img_feat": regions["features"],
            "img_pos": regions["norm_bb"], **extra}


def collate_rows(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Items -> batch: docs/design.md §10 keys over every row (item order, then row order), ``ids`` (list of
    example ids), ``rows_per_item`` (list of int) and, when rows carry them, ``img_type_ids`` i64 [R, Li]
    (padding takes the first real type of the row)."""
    rows = [r for it in items for r in it["rows"]]
    batch = collate_pretrain(rows)
    batch.pop("task", None)
    if "img_type_ids" in rows[0]:
        li = batch["img_feat"].shape[1]
        types = torch.ones((len(rows), li), dtype=torch.long)
        for b, r in enumerate(rows):
            t = torch.as_tensor(r["img_type_ids"], dtype=torch.long)
            types[b, : len(t)] = t
        batch["img_type_ids"] = types
    batch["ids"] = [it["id"] for it in items]
    batch["rows_per_item"] = [len(it["rows"]) for it in items]
    return batch


class TaskDataset(Dataset):
    """Items of one text DB, given a function that builds an item from (index, example id, record).

    ``txt_lens``/``img_lens`` (int [N]) are filled from the side files without opening the DB:
    ``row_len(eid)`` gives (text tokens of the longest row incl. special tokens, regions, rows).
    ``ids`` are the examples to use (e.g. only the labelled ones), in the DB's sorted order.
    """

    def __init__(self, txt_db: TextDb, ids: Sequence[str], *, build: Callable[[int, str, dict], dict[str, Any]],
                 row_len: Callable[[str], tuple[int, int, int]]) -> None:
        self.db, self.ids, self.build = txt_db, list(ids), build
        lens = np.array([row_len(e) for e in self.ids], dtype=np.int64).reshape(-1, 3)
        self.txt_lens = lens[:, 0] * lens[:, 2]
        self.img_lens = lens[:, 1] * lens[:, 2]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        eid = self.ids[index]
        return self.build(index, eid, self.db[eid])


def eval_batches(dataset: TaskDataset, collate: Callable[[list[dict]], dict[str, Any]], *,
                 batch_tokens: int) -> Iterator[dict[str, Any]]:
    """Every item of ``dataset`` once, in length-sorted batches of at most ``batch_tokens`` (no shuffle)."""
    if len(dataset) == 0:
        return
    sampler = TokenBucketSampler(dataset.txt_lens, dataset.img_lens, batch_tokens=batch_tokens, shuffle=False)
    for indices in sampler.global_batches(0):
        yield collate([dataset[i] for i in indices])


def fixed_batches(dataset: TaskDataset, collate: Callable[[list[dict]], dict[str, Any]], *, batch_tokens: int,
                  n_batches: int, seed: int) -> list[dict[str, Any]]:
    """``n_batches`` held-out batches chosen by ``seed`` only (the same in every run of the task)."""
    if len(dataset) == 0 or n_batches <= 0:
        return []
    sampler = TokenBucketSampler(dataset.txt_lens, dataset.img_lens, batch_tokens=batch_tokens, seed=seed)
    return [collate([dataset[i] for i in b]) for b in sampler.global_batches(0)[:n_batches]]

