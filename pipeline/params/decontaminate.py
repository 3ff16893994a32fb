"""``decontaminate:`` section: which eval splits count, near-duplicate detection."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from pipeline.params.checks import MAX_COUNT, bounded, checked, subset_problem
from pipeline.params.finetune import TASK_SPLITS

# Eval splits that no fine-tuning task scores. The splits the tasks score (TASK_SPLITS, dev and test)
# join them by construction (effective_eval_splits). Karpathy val is not listed: UNITER used it as the
# pretraining val set, but VQA val (all of val2014) contains it, so it leaves pretraining with VQA val.
DEFAULT_EVAL_SPLITS: dict[str, tuple[str, ...]] = {
    "coco": ("test",),
    "refcoco": ("val", "testA", "testB", "test"),
    "vqa": ("test",),
    "flickr30k": ("train", "val", "test"),
    "nlvr2": ("dev", "test"),
    "snli_ve": ("dev", "test"),
    "vcr": ("val", "test"),
}


# the datasets UNITER pretrains on; their manifests are the ones decontamination cleans
PRETRAIN_DATASETS = ("coco", "vg", "cc", "sbu")


def pretrain_corpora(ingested: Sequence[str], cleaned: Sequence[str]) -> tuple[str, ...]:
    """The pretraining corpora build_dbs and pretrain use, in :data:`PRETRAIN_DATASETS` order: those
    that ``ingest.datasets`` (``ingested``) names and ``decontaminate.pretrain_datasets`` (``cleaned``)
    cleans. A corpus named by neither is not used (COCO + VG is UNITER's in-domain pretraining)."""
    return tuple(d for d in PRETRAIN_DATASETS if d in ingested and d in cleaned)


@dataclass(frozen=True)
class DecontaminateConfig:
    eval_splits: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_EVAL_SPLITS))
    pretrain_datasets: tuple[str, ...] = PRETRAIN_DATASETS
    # pHash near-duplicate search (reason `near_duplicate`) over every image on disk
    near_duplicates: bool = True
    # largest Hamming distance (bits of the 64-bit pHash, 0..32) counted as the same image
    phash_max_distance: int = bounded(4, 0, 32)
    # processes hashing images (hashes are cached in <data>/cache/phash.parquet)
    workers: int = bounded(2, 1, 256)
    # VG images whose coco_id is a pretraining-val COCO image go to VG val, as in UNITER
    vg_val_from_coco: bool = True
    # COCO pretraining-val images: the Karpathy val images left after decontamination, topped up to
    # this many by a seeded draw of clean COCO train images (all their captions move to val)
    min_val_images: int = bounded(40, 0, MAX_COUNT)
    # tasks whose dev split may stay in pretraining (UNITER kept VQA val2014: [vqa]); their dev rows
    # are marked in results.md. A test split never stays.
    keep_dev_in_pretraining: tuple[str, ...] = ()
    # removed images shown with thumbnails in each HTML/Markdown report
    report_samples: int = bounded(24, 0, MAX_COUNT)

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        return checked(eval_splits=subset_problem(self.eval_splits, DEFAULT_EVAL_SPLITS, nonempty=False),
                       pretrain_datasets=subset_problem(self.pretrain_datasets, PRETRAIN_DATASETS),
                       keep_dev_in_pretraining=subset_problem(self.keep_dev_in_pretraining, TASK_SPLITS,
                                                              nonempty=False))


def eval_split_origins(eval_splits: Mapping[str, tuple[str, ...]], tasks: tuple[str, ...],
                       keep_dev: tuple[str, ...] = ()) -> dict[str, dict[str, list[str]]]:
    """``{dataset: {split: [origin, ...]}}``: every split whose images leave pretraining, and why.

    Origins are ``"decontaminate.eval_splits"`` and ``"finetune <task> dev|test"`` for each of
    ``tasks`` (:data:`TASK_SPLITS`); the dev splits of ``keep_dev`` tasks are left out.
    """
    out: dict[str, dict[str, list[str]]] = {}
    for dataset, splits in eval_splits.items():
        for split in splits:
            out.setdefault(dataset, {}).setdefault(split, []).append("decontaminate.eval_splits")
    for task in tasks:
        ts = TASK_SPLITS[task]
        for role, splits in (("dev", () if task in keep_dev else ts.dev), ("test", ts.test)):
            for split in splits:
                out.setdefault(ts.dataset, {}).setdefault(split, []).append(f"finetune {task} {role}")
    return {d: dict(sorted(s.items())) for d, s in sorted(out.items())}


def effective_eval_splits(eval_splits: Mapping[str, tuple[str, ...]], tasks: tuple[str, ...],
                          keep_dev: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """``{dataset: splits}`` that decontamination removes: :func:`eval_split_origins` without the origins."""
    return {d: tuple(s) for d, s in eval_split_origins(eval_splits, tasks, keep_dev).items()}
