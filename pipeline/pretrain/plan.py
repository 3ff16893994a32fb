"""What a pretraining stage trains on and where it writes, resolved from params.

:func:`plan_stage` turns ``params.pretrain`` into a :class:`StagePlan` for ``pretrain``,
``pretrain_masking`` or ``pretrain_vcr``. Every key it reads was range-checked when params were
parsed (pipeline/params/pretrain.py), the task mixes included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipeline.params.parser import Params
from pipeline.params.pretrain import output_name

FIRST_STAGE_EVAL = ("itm", "mlm", "mrc_kl")  # always measured: the baseline and masking comparisons need them
OTHER_MASKING = {"conditional": "joint", "joint": "conditional"}


@dataclass(frozen=True)
class StagePlan:
    """What one stage trains on and where it writes (resolved from params)."""

    stage: str
    name: str
    masking: str  # conditional | joint: how this stage's training batches are masked
    out_dir: Path
    metrics_dir: Path
    ckpt_dir: Path
    train_sources: tuple[Any, ...]
    val_sources: tuple[Any, ...]
    img_root: Path
    mix_ratio: Mapping[str, float]
    first_phase_mix: Mapping[str, float]  # what steps 1..first_phase_steps draw from (first stage only)
    first_phase_steps: int
    # dataset -> share of the steps (UNITER's fixed ratios); None: the datasets merged, in proportion to size
    dataset_ratio: Mapping[str, float] | None
    eval_tasks: tuple[str, ...]
    steps: int
    lr: float
    grad_clip: float  # 0: none
    warmup_steps: int
    init_from: Path | None  # VCR: the first stage's export directory


def plan_stage(params: Params, stage: str) -> StagePlan:
    from pipeline.stores.text_sources import TextSource, first_stage_corpora, first_stage_sources

    cfg, data = params.pretrain, Path(params.paths.data)
    txt = data / "db" / "txt"
    masking = cfg.masking
    if stage in ("pretrain", "pretrain_masking"):
        name = output_name(stage, cfg.out_name)
        if stage == "pretrain_masking":
            masking = OTHER_MASKING[cfg.masking]
        corpora = first_stage_corpora(params)
        train, val = (first_stage_sources(txt, cfg.datasets, split, corpora) for split in ("train", "val"))
        mix, steps, lr, warmup, init = cfg.mix_ratio, cfg.steps, cfg.optim.lr, cfg.optim.warmup_steps, None
        grad_clip = cfg.optim.grad_clip
        first_mix, first_steps = cfg.first_phase()
        drawn = {t for t, r in mix.items() if r > 0}  # the first phase only draws from these
        eval_tasks = tuple(sorted(set(FIRST_STAGE_EVAL) | drawn))
        dataset_ratio = cfg.dataset_weights(corpora)
    elif stage == "pretrain_vcr":
        name = output_name(stage, cfg.out_name)
        view_dbs = {"qa": ("vcr_qa", "gold_answer"), "qar": ("vcr_qar", "gold_rationale")}
        bad = [v for v in cfg.vcr.views if v not in view_dbs]
        if bad or not cfg.vcr.views:
            raise ValueError(f"pretrain.vcr.views: expected a non-empty subset of {sorted(view_dbs)}, got {list(cfg.vcr.views)}")
        train = tuple(TextSource(txt / f"{view_dbs[v][0]}_train", view_dbs[v][1]) for v in cfg.vcr.views)
        val = tuple(TextSource(txt / f"{view_dbs[v][0]}_val", view_dbs[v][1]) for v in cfg.vcr.views)
        mix, steps, lr, warmup = cfg.vcr.mix_ratio, cfg.vcr.steps, cfg.vcr.lr, cfg.vcr.warmup_steps
        grad_clip = cfg.vcr.grad_clip
        first_mix, first_steps = {}, 0
        # both views merged into one stream per task (UNITER's pretrain_vcr.py builds a loader per view,
        # but under one name per task, so its MetaLoader keeps the QA->R loader only; docs/fidelity.md)
        dataset_ratio = None
        init = data / "models" / output_name("pretrain", cfg.out_name)
        eval_tasks = tuple(sorted(t for t, r in mix.items() if r > 0))
    else:
        raise ValueError(f"unknown pretraining stage {stage!r}")
    return StagePlan(stage=stage, name=name, masking=masking, out_dir=data / "models" / name,
                     metrics_dir=data / "metrics" / name, ckpt_dir=data / "checkpoints" / name,
                     train_sources=train, val_sources=val,
                     img_root=data / "db" / "img", mix_ratio=dict(mix), first_phase_mix=first_mix,
                     first_phase_steps=first_steps, dataset_ratio=dataset_ratio, eval_tasks=eval_tasks,
                     steps=steps, lr=lr, grad_clip=grad_clip,
                     warmup_steps=warmup, init_from=init)


def recipe_departures(params: Params) -> dict[str, Any]:
    """The recipe-governed keys (``params.pretrain.RECIPE_DEFAULTS``) set away from ``pretrain.recipe``'s value."""
    from pipeline.params.pretrain import RECIPE_DEFAULTS, recipe_overrides

    values = {}
    for key in RECIPE_DEFAULTS:
        value: Any = params
        for part in key.split("."):
            value = getattr(value, part)
        values[key] = value
    return recipe_overrides(values, params.pretrain.recipe)

