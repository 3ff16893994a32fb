"""Pretraining datasets: one per task (mlm, mrfr, mrc, mrc_kl, itm) over text + image DBs.

An example is ``[CLS] text [SEP]`` plus the regions of its image(s) (VCR: given boxes then
detected boxes, concatenated). A record that carries ``txt_type_ids`` (the VCR views of
pipeline/stores/vcr_views.py) is already laid out, [CLS] and [SEP]s included, and keeps its
segment types. Masking goes through ``model.masking.mask_example``: conditional
by default (mlm masks text only, mrm tasks regions only), ``masking="joint"`` masks both for
the ablation. ITM swaps in another image of the dataset with probability ``itm_neg_prob``.

Every random draw of example ``i`` comes from a generator seeded by (seed, epoch, task, i) (and
the datasets, when the dataset is restricted to some), so an example is the same whichever worker
loads it and a resumed run sees the same masks.

``datasets=("coco",)`` keeps the examples of those pretraining datasets only (each pretraining
dataset's images are its own image source: coco, vg, cc, sbu), one dataset's stream as UNITER keeps
one loader per (task, dataset); its ITM negatives then come from that dataset's images, as UNITER's do.

>>> ds = open_pretrain_dataset("mlm", ["data/db/txt/pretrain_indomain_train"], "data/db/img", seed=1)
>>> sampler = TokenBucketSampler(ds.txt_lens, ds.img_lens, batch_tokens=4096, seed=1)  # pipeline.training.batching
>>> loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_pretrain, num_workers=2)
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from model.masking import mask_example
from pipeline.params.pretrain import FIRST_STAGE_TASKS
from pipeline.stores.readers import ImageDbGroup, TextDb

_MASK64 = (1 << 64) - 1


def example_dataset(image_ids: Sequence[str]) -> str:
    """The pretraining dataset of an example, from its qualified image ids (``["vg/12"]`` -> ``"vg"``):
    COCO, VG, CC and SBU each read their own image source (pipeline/ingest/sources)."""
    return image_ids[0].split("/", 1)[0]


def _splitmix64(x: int) -> int:
    """A 64-bit mixing step (SplitMix64): distinct inputs give well-spread, unrelated seeds."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)
MRM_TASKS = ("mrfr", "mrc", "mrc_kl")


class PretrainDataset(Dataset):
    """Examples of one pretraining ``task`` drawn from one or more text DBs.

    ``ds[i]`` -> dict: ``task``; ``input_ids`` i64 [lt] (masked for mlm); ``txt_type_ids`` i64 [lt]
    when the record has them; ``img_feat`` f16
    [n, D], ``img_pos`` f16 [n, 7] (numpy; the collate converts); plus ``txt_labels`` i64 [lt]
    (mlm, or any masked task under joint masking), ``img_masked`` bool [n] and
    ``img_soft_labels`` f16 [n, C+1] (mrfr/mrc/mrc_kl, or joint), ``itm_target`` (itm: 1 =
    matched, 0 = swapped image).
    ``txt_lens`` / ``img_lens`` (int [N]) are what :class:`TokenBucketSampler` needs.
    """

    def __init__(self, txt_dbs: Sequence[TextDb], img_dbs: ImageDbGroup, *, task: str, seed: int = 0,
                 masking: Literal["conditional", "joint"] = "conditional", mask_prob: float = 0.15,
                 itm_neg_prob: float = 0.5, datasets: Sequence[str] | None = None) -> None:
        if task not in FIRST_STAGE_TASKS:
            raise ValueError(f"unknown pretraining task {task!r}; expected one of {FIRST_STAGE_TASKS}")
        if masking not in ("conditional", "joint"):
            raise ValueError(f"masking must be conditional or joint, got {masking!r}")
        digests = {db.meta["tokenizer_sha256"] for db in txt_dbs}
        if len(digests) != 1:
            raise ValueError(f"text DBs {[db.name for db in txt_dbs]} were tokenized with different vocabularies")
        self.txt_dbs, self.img_dbs = list(txt_dbs), img_dbs
        self.task, self.seed, self.masking = task, seed, masking
        self.mask_prob, self.itm_neg_prob = mask_prob, itm_neg_prob
        meta = self.txt_dbs[0].meta
        self.special = meta["special_ids"]
        self.vocab_size = int(meta["vocab_size"])
        self.datasets = tuple(datasets) if datasets is not None else None
        # compact index (numpy, not per-example Python objects): real text DBs hold millions of rows
        positions = [self._kept(db) for db in self.txt_dbs]
        if not sum(len(p) for p in positions):
            raise ValueError(f"text DBs {[db.name for db in txt_dbs]} hold no example of dataset(s) {list(datasets)}")
        self._db_of = np.concatenate([np.full(len(p), d, dtype=np.int32) for d, p in enumerate(positions)])
        self._pos = np.concatenate(positions)
        kept = [[db.ids[i] for i in p] for db, p in zip(self.txt_dbs, positions)]
        self.txt_lens = np.concatenate([np.fromiter((db.id2len[e] + 2 for e in ids), np.int64, len(ids))
                                        for db, ids in zip(self.txt_dbs, kept)])
        self.img_lens = np.concatenate([
            np.fromiter((sum(img_dbs.num_regions(q) for q in db.txt2img[e]) for e in ids), np.int64, len(ids))
            for db, ids in zip(self.txt_dbs, kept)])
        self.image_pool = sorted({tuple(db.txt2img[e]) for db, ids in zip(self.txt_dbs, kept) for e in ids}) \
            if task == "itm" else []
        if task == "itm" and len(self.image_pool) < 2:
            raise ValueError("itm needs at least two distinct images to draw negatives from")
        self.epoch = 0

    def _kept(self, db: TextDb) -> np.ndarray:
        """Positions in ``db.ids`` of the examples this dataset keeps (all, or those of ``datasets``)."""
        if self.datasets is None:
            return np.arange(len(db), dtype=np.int64)
        return np.array([i for i, e in enumerate(db.ids) if example_dataset(db.txt2img[e]) in self.datasets],
                        dtype=np.int64)

    def __len__(self) -> int:
        return len(self._pos)

    def example(self, index: int) -> tuple[int, str]:
        """(text DB position, example id) of example ``index``."""
        d = int(self._db_of[index])
        return d, self.txt_dbs[d].ids[int(self._pos[index])]

    def image_ids(self, index: int) -> tuple[str, ...]:
        """The qualified image ids of example ``index`` (before any ITM swap)."""
        d, eid = self.example(index)
        return tuple(self.txt_dbs[d].txt2img[eid])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def generator(self, index: int) -> torch.Generator:
        """The generator of example ``index`` in this epoch (independent of worker and order)."""
        key = 0
        parts = [self.seed, self.epoch, FIRST_STAGE_TASKS.index(self.task), index]
        if self.datasets is not None:  # one dataset's stream: masks independent of another's at the same index
            parts.append(zlib.crc32(",".join(self.datasets).encode()))
        for part in parts:
            key = _splitmix64(key ^ (part & _MASK64))
        return torch.Generator().manual_seed(key)

    def _negative_images(self, own: tuple[str, ...], g: torch.Generator) -> tuple[str, ...]:
        while True:
            cand = self.image_pool[int(torch.randint(len(self.image_pool), (1,), generator=g))]
            if cand != own:
                return cand

    def _regions(self, image_ids: Sequence[str]) -> dict[str, np.ndarray]:
        records = [self.img_dbs[q] for q in image_ids]
        keys = ("features", "norm_bb", "soft_labels")
        if len(records) == 1:
            return {k: records[0][k] for k in keys}
        return {k: np.concatenate([r[k] for r in records]) for k in keys}

    def __getitem__(self, index: int) -> dict[str, Any]:
        d, eid = self.example(index)
        record = self.txt_dbs[d][eid]
        g = self.generator(index)
        images, itm_target = tuple(record["image_ids"]), 1
        if self.task == "itm" and float(torch.rand(1, generator=g)) < self.itm_neg_prob:
            images, itm_target = self._negative_images(images, g), 0
        regions = self._regions(images)
        text = torch.from_numpy(np.asarray(record["input_ids"], dtype=np.int64))
        out: dict[str, Any] = {"task": self.task, "img_feat": regions["features"], "img_pos": regions["norm_bb"]}
        if "txt_type_ids" in record:  # laid out by its view
            ids, out["txt_type_ids"] = text, torch.as_tensor(record["txt_type_ids"], dtype=torch.long)
            if out["txt_type_ids"].shape != ids.shape:
                raise ValueError(f"{self.txt_dbs[d].name}: example {eid} has {len(ids)} input_ids but "
                                 f"{len(out['txt_type_ids'])} txt_type_ids")
        else:
            ids = torch.cat([torch.tensor([self.special["cls"]]), text, torch.tensor([self.special["sep"]])])
        if self.task == "itm":
            out.update(input_ids=ids, itm_target=itm_target)
            return out
        masked = mask_example(ids, len(regions["features"]), task=self.task, scheme=self.masking,
                              mask_prob=self.mask_prob, vocab_size=self.vocab_size,
                              mask_token_id=self.special["mask"], special_ids=self.special.values(), generator=g)
        out["input_ids"] = masked.input_ids
        if self.task == "mlm" or self.masking == "joint":
            out["txt_labels"] = masked.txt_labels
        if self.task in MRM_TASKS or self.masking == "joint":
            out["img_masked"] = masked.img_masked
            out["img_soft_labels"] = regions["soft_labels"]
        return out


def open_pretrain_dataset(task: str, txt_db_dirs: Sequence[Path | str], img_db_root: Path | str,
                          **kwargs: Any) -> PretrainDataset:
    """Open the text DBs and every image DB their ``meta.json`` names under ``img_db_root``."""
    txt_dbs = [TextDb(p) for p in txt_db_dirs]
    names = sorted({n for db in txt_dbs for n in db.img_db_names})
    return PretrainDataset(txt_dbs, ImageDbGroup(img_db_root, names), task=task, **kwargs)
