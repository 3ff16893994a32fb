"""Pretraining inputs: per-task train streams and fixed held-out batches, from the LMDB stores.

The datasets, sampler and collate are pipeline/pretrain/datasets.py and pipeline/training/batching.py,
the text DBs a stage reads (:class:`TextSource`) pipeline/stores/text_sources.py; this module only
decides which text DBs feed which task, seeds them, shards them over ranks and wraps them in
resumable :class:`BatchStream`s.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from pipeline.params.pretrain import DOMAIN_DATASETS, FIRST_STAGE_TASKS
from pipeline.pretrain.datasets import PretrainDataset
from pipeline.stores.readers import ImageDbGroup
from pipeline.training.batching import TokenBucketSampler, collate_pretrain
from pipeline.training.streams import BatchStream
from pipeline.training.task_mix import stream_dataset, stream_task

log = logging.getLogger(__name__)

# separates the held-out RNG streams from the training ones (the same batches in every run)
VAL_SEED_OFFSET = 7_777
PRETRAIN_DATASETS = tuple(d for names in DOMAIN_DATASETS.values() for d in names)


def task_seed(seed: int, task: str) -> int:
    """Each task's sampler shuffles with its own stream of the root seed."""
    return seed * 31 + FIRST_STAGE_TASKS.index(task) + 1


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
