"""``finetune:`` section: downstream tasks and their training budgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

TASKS = ("vqa", "vcr", "nlvr2", "snli_ve", "retrieval_flickr", "refcoco_plus")


@dataclass(frozen=True)
class TaskConfig:
    steps: int = 300
    lr: float = 5e-5
    batch_tokens: int = 4096


@dataclass(frozen=True)
class FinetuneConfig:
    tasks: tuple[str, ...] = TASKS
    per_task: Mapping[str, TaskConfig] = field(default_factory=lambda: {t: TaskConfig() for t in TASKS})
    nlvr2_variant: Literal["triplet", "pair", "pair_biattn"] = "pair_biattn"
    retrieval_hard_negatives: int = 8
    compare_scratch: bool = True
