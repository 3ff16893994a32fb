"""What a pretraining stage leaves behind: ``data/models/<name>/`` (weights, model config,
eval.json, _run.json), written by rank 0 once every rank has trained."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.common.ownership import atomic_dir, remove_owned
from pipeline.common.runinfo import RunRecord, atomic_write_json
from pipeline.params.parser import Params
from pipeline.pretrain.plan import StagePlan, recipe_departures
from pipeline.training.loop import LoopResult
from pipeline.training.task_mix import TaskSchedule
from pipeline.training.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class Trained:
    """What one rank's run of a pretraining stage produced, for :func:`export`."""

    engine: Any
    spec: Any  # model_io.ModelSpec: the export's model_config.json
    txt_meta: Mapping[str, Any]  # the first training text DB's meta (tokenizer, vocabulary)
    loop: LoopResult
    baseline: dict[str, float]  # eval.json's held-out metrics before training ...
    final: dict[str, float]  # ... after it ...
    text_only: dict[str, float]  # ... and after it with the image masked out (MLM)
    held_out: dict[str, list[dict[str, Any]]]  # the held-out batches those metrics are over
    schedule: TaskSchedule
    streams: Mapping[str, Any]
    region_fit: Any  # the region projection's fit report (None: not fitted here)
    uniter_checkpoint: dict[str, Any] | None = None  # the release file it started from (uniter_start)



def _by_task(metrics: Mapping[str, float], prefix: str) -> dict[str, dict[str, float]]:
    """``{"val/mlm/mlm_acc": x}`` -> ``{"mlm": {"mlm_acc": x}}``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        head, task, metric = key.split("/", 2)
        if head == prefix:
            out.setdefault(task, {})[metric] = value
    return {t: dict(sorted(m.items())) for t, m in sorted(out.items())}


def _held_out_counts(val: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """This rank's held-out batches, examples and (ITM) matched pairs per task: the majority-class
    rate ``max(p, 1 - p)`` of ITM is the accuracy a model gets without looking at the pairs."""
    out = {}
    for task, batches in val.items():
        counts = {"batches": len(batches), "examples": sum(int(b["input_ids"].shape[0]) for b in batches)}
        if task == "itm":
            counts["matched"] = sum(int(b["itm_targets"].sum()) for b in batches)
        out[task] = counts
    return out


def _eval_report(params: Params, plan: StagePlan, run: Trained, held_out: Mapping[str, Any],
                 world_size: int) -> dict[str, Any]:
    """eval.json: what the stage trained on and its held-out metrics before and after training."""
    from pipeline.training.engine import resolve_precision

    cfg = params.pretrain
    return {
        "stage": plan.stage, "steps": plan.steps, "masking": plan.masking, "wra": cfg.wra,
        "datasets": list(cfg.vcr.views) if plan.stage == "pretrain_vcr" else cfg.datasets,
        "mix_ratio": dict(sorted(plan.mix_ratio.items())), "world_size": world_size,
        "recipe": cfg.recipe, "recipe_overrides": recipe_departures(params),
        "dataset_ratio": dict(sorted(plan.dataset_ratio.items())) if plan.dataset_ratio else "size",
        "precision": resolve_precision(cfg.precision, run.engine.device),
        "first_phase": {"steps": plan.first_phase_steps, "mix_ratio": dict(sorted(plan.first_phase_mix.items())),
                        "dropout": cfg.first_phase_dropout} if plan.first_phase_steps else None,
        "held_out": held_out,
        "no_pretraining": _by_task(run.baseline, "val"), "pretrained": _by_task(run.final, "val"),
        "pretrained_text_only": _by_task(run.text_only, "val_text_only"),
    }


def _run_record(params: Params, plan: StagePlan, run: Trained, digests: list[Any], world_size: int) -> RunRecord:
    """_run.json: inputs, step counts (per task and stream, every rank's task digest) and sizes."""
    from pipeline.training.model_io import MODEL_FILE

    record = RunRecord(plan.stage, params.section_digest("seed", "model", "pretrain"))
    for s in plan.train_sources + plan.val_sources:
        record.inputs[s.path.name] = s.path
    if plan.init_from is not None:
        record.inputs["init"] = plan.init_from / MODEL_FILE
    record.counts = {"steps": plan.steps, "resumed_from_step": run.loop.start_step,
                     "task_steps": run.schedule.counts(plan.steps),
                     "stream_steps": run.schedule.stream_counts(plan.steps), "world_size": world_size,
                     "task_sequence_sha256_by_rank": digests,
                     "train_examples": {t: len(s.dataset) for t, s in run.streams.items()},
                     "parameters": sum(p.numel() for p in run.engine.module.parameters()),
                     "region_init": (run.region_fit or params.model.region_init) if plan.init_from is None else None}
    if run.uniter_checkpoint is not None:
        record.counts["region_init"] = None  # the file's projection
        record.inputs["uniter_checkpoint"] = params.model.uniter_checkpoint
        record.extra["uniter_checkpoint"] = run.uniter_checkpoint
    record.extra["outputs"] = {"metrics": str(plan.metrics_dir)}
    return record


def export(params: Params, plan: StagePlan, trainer: Trainer, run: Trained, started: float) -> None:
    """Rank 0 writes ``data/models/<name>/`` atomically; then the checkpoints are dropped."""
    import torch.distributed as tdist

    from pipeline.training.checkpointing import save_safetensors
    from pipeline.training.model_io import CONFIG_FILE, MODEL_FILE, model_json

    dist, export_start = trainer.dist, time.time()
    digests: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(digests, run.loop.task_digest)  # every rank must have run the same tasks
    shares: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(shares, _held_out_counts(run.held_out))
    if dist.is_main:
        state = trainer.final_state(run.engine)
        held_out = {t: {k: sum(share[t][k] for share in shares) for k in shares[0][t]} for t in shares[0]}
        report = _eval_report(params, plan, run, held_out, dist.world_size)
        record = _run_record(params, plan, run, digests, dist.world_size)
        with atomic_dir(plan.out_dir, stage=plan.stage) as tmp:
            save_safetensors(state, tmp / MODEL_FILE)
            start = {"uniter_checkpoint": run.uniter_checkpoint} if run.uniter_checkpoint else {}
            atomic_write_json(tmp / CONFIG_FILE, model_json(run.spec, run.txt_meta, stage=plan.stage,
                                                            steps=plan.steps, **start))
            atomic_write_json(tmp / "eval.json", report)
            record.extra["timings_s"] = {**run.loop.timings_s, "export": round(time.time() - export_start, 3)}
            record.write(tmp)
    tdist.barrier()
    if dist.is_main:
        remove_owned(plan.ckpt_dir)
        final = report["pretrained"]
        summary = ", ".join(f"{t} {k}={v:.3f}" for t, m in final.items() for k, v in m.items() if k.endswith("acc"))
        log.info("%s: %d steps on %d rank(s) in %.0fs (resumed from step %d); held-out %s -> %s", plan.stage,
                 plan.steps, dist.world_size, time.time() - started, run.loop.start_step, summary or "-",
                 plan.out_dir)
