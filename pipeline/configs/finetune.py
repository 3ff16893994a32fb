"""``finetune:`` section: downstream tasks, their training budgets and the shared fine-tuning knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

TASKS = ("vqa", "vcr", "nlvr2", "snli_ve", "retrieval_flickr", "refcoco_plus")


@dataclass(frozen=True)
class TaskConfig:
    steps: int = 300  # optimizer steps (the same budget for the pretrained and the scratch start)
    lr: float = 5e-5  # peak learning rate
    batch_tokens: int = 4096  # training micro batch: padded text tokens + regions, all rows of an example
    warmup_steps: int = 30  # linear warmup, then linear decay to 0 at the last step


@dataclass(frozen=True)
class FinetuneConfig:
    tasks: tuple[str, ...] = TASKS
    per_task: Mapping[str, TaskConfig] = field(default_factory=lambda: {t: TaskConfig() for t in TASKS})
    nlvr2_variant: Literal["triplet", "pair", "pair_biattn"] = "pair_biattn"
    retrieval_hard_negatives: int = 8  # negatives per query trained on: the hardest of the pool
    retrieval_neg_pool: int = 32  # random negatives per query scored without gradients
    retrieval_eval_captions: int = 0  # captions per image ranked in evaluation; 0: all (Flickr30k: 5)
    compare_scratch: bool = True  # also fine-tune from a non-pretrained start with the same budget
    scratch_init: Literal["bert", "random"] = "bert"  # that start: BERT text weights only, or all random
    eval_batch_tokens: int = 16384  # evaluation batches (no gradients, so larger)
    log_every: int = 10
    val_batches: int = 2  # fixed held-out batches per stream (dvclive val curves); 0: none
    val_every: int = 50  # held-out loss every N steps; 0: only at the end
    checkpoint_every: int = 100  # 0: only at the end
    keep_checkpoints: int = 1
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    grad_clip: float = 2.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    zero_stage: int = 0  # fine-tuning runs on one rank, where ZeRO partitions nothing
