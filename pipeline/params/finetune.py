"""``finetune:`` section: downstream tasks, their training budgets and the shared fine-tuning knobs;
where a seed sweep (``python -m pipeline seeds``) writes its runs."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from pipeline.params import deepspeed as deepspeed_params
from pipeline.params.checks import MAX_COUNT, MAX_STEPS, MAX_TOKENS, betas_problem, bounded, checked, must_exist, \
    subset_problem, zero_stage_problem

TASKS = ("vqa", "vcr", "nlvr2", "snli_ve", "retrieval_flickr", "refcoco_plus")


@dataclass(frozen=True)
class TaskSplits:
    """The evaluation splits of one task, by the split names of the ingested dataset's manifest.

    ``dev`` is where choices are made (budgets, learning rates); ``test`` is only reported. Both are
    scored, so decontamination removes the images of both from every pretraining manifest.
    """

    dataset: str
    dev: tuple[str, ...]
    test: tuple[str, ...]

    @property
    def scored(self) -> tuple[str, ...]:
        return (*self.dev, *self.test)


TASK_SPLITS: dict[str, TaskSplits] = {
    "vqa": TaskSplits("vqa", dev=("val",), test=("test",)),
    "vcr": TaskSplits("vcr", dev=("val",), test=("test",)),
    "nlvr2": TaskSplits("nlvr2", dev=("dev",), test=("test",)),
    "snli_ve": TaskSplits("snli_ve", dev=("dev",), test=("test",)),
    "retrieval_flickr": TaskSplits("flickr30k", dev=("val",), test=("test",)),
    "refcoco_plus": TaskSplits("refcoco", dev=("val",), test=("testA", "testB")),
}


# Named budgets of the reference's fine-tuning configs: ``finetune.per_task.<task>: {preset: NAME}``
# fills every budget key the entry leaves null or out (an explicit value wins, as with pretrain.recipe).
# uniter_vqa_base: ChenRocks/UNITER config/train-vqa-base-4gpu.json (num_train_steps 6000, learning_rate
# 8e-5, warmup_steps 600 then linear decay to 0; train_batch_size 5120 padded tokens a GPU x 4 GPUs x
# gradient_accumulation_steps 5 = 102,400 tokens an optimizer step, here one micro batch on one rank).
# Its other choices are this section's defaults (betas, weight_decay 0.01, grad_clip 2.0, model.dropout
# 0.1); lr_mul 10 is head_lr_mul. What still differs is in docs/real-data.md.
TASK_PRESETS: dict[str, tuple[str, dict[str, float | int]]] = {
    "uniter_vqa_base": ("vqa", {"steps": 6000, "lr": 8e-5, "batch_tokens": 102_400, "warmup_steps": 600,
                                "head_lr_mul": 10.0}),
}


def apply_task_presets(raw: dict) -> list[str]:
    """Fill the budget keys of each ``finetune.per_task`` entry that names a ``preset`` where they are
    null or absent, and drop ``preset`` (``raw`` in place: the values it gave are what the run records);
    returns a message for each preset name that is not one of its task's."""
    per_task = (raw.get("finetune") or {}).get("per_task") if isinstance(raw.get("finetune"), dict) else None
    problems = []
    for task, entry in (per_task.items() if isinstance(per_task, dict) else ()):
        name = entry.pop("preset", None) if isinstance(entry, dict) else None
        if name is None:
            continue
        owner, values = TASK_PRESETS.get(name, ("", {}))
        if owner != task:
            known = [n for n, (t, _) in TASK_PRESETS.items() if t == task]
            problems.append(f"finetune.per_task.{task}.preset: {name!r} is not a preset of {task} (those: {known})")
            continue
        for key, value in values.items():
            if entry.get(key) is None:
                entry[key] = value
    return problems


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """One task's budget. No defaults: each task's values live in params.yaml only (a default here
    would be a second, drifting copy of them)."""

    # optimizer steps (the scratch start's too, unless finetune.scratch_per_task names the task)
    steps: int = bounded(MISSING, 1, MAX_STEPS)
    lr: float = bounded(MISSING, 0, 1, lo_open=True)  # peak learning rate
    # training micro batch: padded text tokens + regions, all rows of an example
    batch_tokens: int = bounded(MISSING, 1, MAX_TOKENS)
    warmup_steps: int = bounded(MISSING, 0, MAX_STEPS)  # linear warmup, then linear decay to 0 at the last step
    # the task head's lr as a multiple of lr, on the same schedule (UNITER's lr_mul); 1: one rate throughout
    # the one default here: a --set of a whole budget may leave it out
    head_lr_mul: float = bounded(1.0, 0, 1000, lo_open=True)


@dataclass(frozen=True)
class DivergenceGuardConfig:
    """``finetune.divergence_guard``: a start whose dev score was at least ``above_chance`` points
    above chance and ends keeping at most ``kept`` of that margin *diverged*; the stage then fails
    naming the task, the start and the step (``pipeline.finetune.guard``)."""

    checks: int = bounded(2, 0, 1000)  # dev evaluations spread over each run, besides the final one; 0: no guard
    above_chance: float = bounded(10.0, 0, 100, lo_open=True)  # dev points above chance that count as learned
    kept: float = bounded(0.25, 0, 1, hi_open=True)  # share of that margin at most left at the end: diverged


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    tasks: tuple[str, ...] = TASKS
    per_task: Mapping[str, TaskConfig]  # task -> its budget (params.yaml)
    # task -> the non-pretrained start's own budget, chosen on dev by `budgets TASK --start scratch`
    # under the pretrained start's rule and grid; a task not listed: its per_task budget for both starts
    scratch_per_task: Mapping[str, TaskConfig]  # (params.yaml; {}: none of its own)
    nlvr2_variant: Literal["triplet", "pair", "pair_biattn"] = "pair_biattn"
    nlvr2_image_types: bool = True  # left / right image regions get segment types 1 / 2 (UNITER); false: both 1
    nlvr2_head: Literal["linear", "mlp"] = "linear"  # linear: one Linear to 2 classes (UNITER); mlp: the answer MLP
    vcr_loss: Literal["row", "softmax"] = "row"  # row: 2-way right/wrong CE per choice (UNITER); softmax over the 4
    snli_ve_loss: Literal["bce", "ce"] = "bce"  # bce: one-hot BCE over the 3 classes (UNITER's VQA head); ce: softmax
    retrieval_loss: Literal["hinge", "softmax"] = "hinge"  # hinge on sigmoid scores (UNITER); softmax over 1 + N
    retrieval_margin: float = bounded(0.2, 0, 1)  # the hinge's margin (UNITER: 0.2)
    retrieval_hard_negatives: int = bounded(3, 1, 10_000)  # negatives per query trained on: the hardest of the pool
    retrieval_neg_pool: int = bounded(8, 1, 10_000)  # random negatives per query scored without gradients
    # captions per image ranked in evaluation; 0: all (Flickr30k: 5)
    retrieval_eval_captions: int = bounded(2, 0, 1000)
    # seed of the heads' start, batch order and dropout; null: the root `seed`. A fine-tuning seed
    # sweep (`make seeds`) varies only this, so the pretrained model and the data stay the same
    seed: int | None = bounded(None, 0, 2**32 - 1)
    compare_scratch: bool = True  # also fine-tune from a non-pretrained start with the same budget
    scratch_init: Literal["bert", "random"] = "bert"  # that start: BERT text weights only, or all random
    # that start's region projection: random (the paper's no-pretraining row) | as_pretraining (the
    # fit `model.region_init` gave the pretraining stage, so the gain leaves that fit out)
    scratch_region_init: Literal["random", "as_pretraining"] = "random"
    # on CPU, train both starts at once, each in its own process with half the cores (faster than
    # one process using all of them); on GPU they run one after the other
    parallel_starts: bool = True
    eval_batch_tokens: int = bounded(8192, 1, MAX_TOKENS)  # evaluation batches (no gradients, so larger)
    log_every: int = bounded(5, 1, MAX_STEPS)
    val_batches: int = bounded(2, 0, MAX_COUNT)  # fixed held-out batches per stream (dvclive val curves); 0: none
    val_every: int = bounded(0, 0, MAX_STEPS)  # held-out loss every N steps; 0: only at the end
    checkpoint_every: int = bounded(100, 0, MAX_STEPS)  # 0: only at the end
    keep_checkpoints: int = bounded(1, 1, 1000)
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = bounded(0.01, 0, 1)
    grad_clip: float = bounded(2.0, 0, 1e6)  # global gradient norm (0: no clipping)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 on GPU; on CPU bf16 autocast where the CPU has native bf16, else fp32
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    zero_stage: int = 0  # 0..3; fine-tuning runs on one rank, where ZeRO partitions nothing
    # merged over the DeepSpeed config the engine builds, as pretrain.deepspeed: a mapping or a JSON
    # file below deploy/deepspeed/ (params/deepspeed.py)
    deepspeed: Mapping[str, Any] | Path = must_exist(default_factory=dict)
    divergence_guard: DivergenceGuardConfig = field(default_factory=DivergenceGuardConfig)

    def budget(self, task: str, init: str) -> TaskConfig:
        """The budget ``task`` trains with from start ``init`` ("pretrained" or "scratch")."""
        if init == "scratch" and task in self.scratch_per_task:
            return self.scratch_per_task[task]
        return self.per_task[task]

    def problems(self) -> list[tuple[str, str]]:
        """Keys of this section that are wrong, as (key, message); the parser raises on them."""
        missing = [t for t in self.tasks if t in TASKS and t not in self.per_task]  # unknown ones: `tasks` says so
        pool = None
        if self.retrieval_neg_pool < self.retrieval_hard_negatives:
            pool = (f"retrieval_neg_pool must be >= finetune.retrieval_hard_negatives "
                    f"({self.retrieval_hard_negatives}), got {self.retrieval_neg_pool}")
        return checked(
            tasks=subset_problem(self.tasks, TASKS, nonempty=False),
            per_task=subset_problem(self.per_task, TASKS, nonempty=False)
            or (f"has no entry for task(s) {missing} of finetune.tasks" if missing else None),
            scratch_per_task=subset_problem(self.scratch_per_task, TASKS, nonempty=False),
            retrieval_neg_pool=pool,
            betas=betas_problem(self.betas),
            zero_stage=zero_stage_problem(self.zero_stage, (0, 1, 2, 3)),
            deepspeed=deepspeed_params.problem(self.deepspeed, "finetune"),
        )


def seed_sweep_dir(data: Path, task: str) -> Path:
    """Where ``python -m pipeline seeds`` writes ``task``'s sweep when ``--out`` is not given:
    ``<data>/seeds/<task>`` (``report split-size`` reads it there)."""
    return data / "seeds" / task


def seed_root(out: Path, seed: int) -> Path:
    return out / f"seed{seed}"


def seed_roots(out: Path) -> dict[int, Path]:
    """{seed: its data root} of the seeds a sweep into ``out`` has run (:func:`seed_root`), by seed."""
    roots = {int(p.name[4:]): p for p in out.glob("seed*") if p.is_dir() and p.name[4:].isdigit()}
    return dict(sorted(roots.items()))
