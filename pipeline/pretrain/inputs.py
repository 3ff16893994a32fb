"""Pretraining inputs: per-task train streams and fixed held-out batches, from the LMDB stores.

The datasets, sampler and collate are pipeline/pretrain/datasets.py and pipeline/training/batching.py; this
module only decides which text DBs feed which task, seeds them, shards them over ranks and wraps
them in resumable :class:`BatchStream`s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from pipeline.params.pretrain import DATASET_CHOICES, DOMAIN_DATASETS
from pipeline.pretrain.datasets import TASKS, PretrainDataset
from pipeline.stores.vcr_views import GoldAnswerView, GoldRationaleView
from pipeline.stores.readers import ImageDbGroup, TextDb
from pipeline.training.batching import TokenBucketSampler, collate_pretrain
from pipeline.training.streams import BatchStream
from pipeline.training.task_mix import stream_dataset, stream_task

log = logging.getLogger(__name__)

# separates the held-out RNG streams from the training ones (the same batches in every run)
VAL_SEED_OFFSET = 7_777
# pretrain.datasets -> the text DB domains of the first pretraining stage
DOMAINS = DATASET_CHOICES
PRETRAIN_DATASETS = tuple(d for names in DOMAIN_DATASETS.values() for d in names)


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


def task_seed(seed: int, task: str) -> int:
    """Each task's sampler shuffles with its own stream of the root seed."""
    return seed * 31 + TASKS.index(task) + 1


def stream_seed(seed: int, stream: str) -> int:
    """``task_seed``, made distinct per dataset for a ``"<task>/<dataset>"`` stream."""
    dataset = stream_dataset(stream)
    offset = 0 if dataset is None else 1_000 * (1 + sorted(PRETRAIN_DATASETS).index(dataset))
    return task_seed(seed, stream_task(stream)) + offset


def train_streams(txt_dbs: Sequence[Any], img_dbs: ImageDbGroup, streams: Sequence[str], *, seed: int,
                  masking: str, mask_prob: float, itm_neg_prob: float, batch_tokens: int, rank: int,
                  world_size: int, num_workers: int) -> dict[str, BatchStream]:
    """One endless, resumable stream per name in ``streams`` (``TaskSchedule.streams``): ``"<task>"``
    over every example, or ``"<task>/<dataset>"`` over that dataset's; each rank gets a disjoint
    share of every epoch."""
    out = {}
    for name in streams:
        task, dataset = stream_task(name), stream_dataset(name)
        ds = PretrainDataset(txt_dbs, img_dbs, task=task, seed=seed, masking=masking, mask_prob=mask_prob,
                             itm_neg_prob=itm_neg_prob, datasets=None if dataset is None else (dataset,))
        sampler = TokenBucketSampler(ds.txt_lens, ds.img_lens, batch_tokens=batch_tokens,
                                     seed=stream_seed(seed, name), rank=rank, world_size=world_size, uneven="pad")
        out[name] = BatchStream(ds, sampler, collate_pretrain, seed=stream_seed(seed, name),
                                num_workers=num_workers, name=name)
        log.info("stream %s: %d examples, %d batches per epoch on this rank", name, len(ds),
                 len(sampler.rank_batches(0)))
    return out


def held_out_batches(txt_dbs: Sequence[Any], img_dbs: ImageDbGroup, tasks: Sequence[str], *, seed: int,
                     mask_prob: float, itm_neg_prob: float, batch_tokens: int, n_batches: int | None, rank: int,
                     world_size: int) -> dict[str, list[dict[str, Any]]]:
    """This rank's share of ``n_batches`` fixed held-out batches per task (None: every example once).

    The batches depend only on the val DBs, the seed and the budget, never on the run's masking
    scheme (always conditional) or world size: two runs (say conditional vs joint masking) are
    measured on identical inputs. Batch k goes to rank k % world_size.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        ds = PretrainDataset(txt_dbs, img_dbs, task=task, seed=seed + VAL_SEED_OFFSET, masking="conditional",
                             mask_prob=mask_prob, itm_neg_prob=itm_neg_prob)
        sampler = TokenBucketSampler(ds.txt_lens, ds.img_lens, batch_tokens=batch_tokens,
                                     seed=task_seed(seed + VAL_SEED_OFFSET, task))
        chosen = sampler.global_batches(0)[:n_batches]  # [:None]: all of them
        out[task] = [collate_pretrain([ds[i] for i in batch]) for batch in chosen[rank::world_size]]
    return out
