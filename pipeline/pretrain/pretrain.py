"""Stages ``pretrain``, ``pretrain_masking`` and ``pretrain_vcr``: UNITER pretraining on a DeepSpeed engine.

``pretrain`` reads the pretraining text DBs (``data/db/txt/pretrain_{indomain,outdomain}_{train,val}``
by ``pretrain.datasets``) and the image DBs they name; ``pretrain_vcr`` starts from the first
stage's export and reads the VCR text (Q→A from ``vcr_qa_<split>``, QA→R from
``vcr_qar_<split>``: two datasets, laid out as fine-tuning lays them out, segment types 0 / 2 / 3;
pipeline/pretrain/vcr_views.py) with MLM + MRFR + MRC-kl, no ITM. Each writes

- ``data/models/<name>/``: ``model.safetensors`` (consolidated fp32), ``model_config.json``,
  ``eval.json`` (held-out metrics before and after pretraining), ``_run.json``;
- ``data/metrics/<name>/``: dvclive (``metrics.json``, ``plots/metrics/{train,val}/**.tsv``);
- ``data/checkpoints/<name>/`` while it runs: a killed run resumes there; removed at the end.

``<name>`` is ``pretrain.out_name`` (``pretrain``), ``<out_name>_vcr`` for the second stage.
``pretrain_masking`` is the masking ablation the results table reports: the first stage again with
the other masking (joint when ``pretrain.masking`` is conditional, and the reverse), same seed,
data order and held-out batches, written to ``<out_name>_masking_ablation``.
With ``pretrain.world_size > 1`` or a hostfile, the stage re-launches itself on every rank
through the ``deepspeed`` launcher.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from pipeline.params.parser import Params, dump_params, to_dict
from pipeline.params.pretrain import output_name
from pipeline.common.ownership import preflight, remove_owned
from pipeline.common.runinfo import RunRecord, atomic_dir, atomic_write_json, file_digest
from pipeline.training.checkpointing import db_fingerprint
from pipeline.training.launch import in_launched_worker, launch_workers, process_group
from pipeline.training.loop import LoopResult
from pipeline.training.task_mix import TaskSchedule
from pipeline.training.trainer import RunSettings, Trainer

log = logging.getLogger(__name__)

FIRST_STAGE_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl", "itm")
VCR_TASKS = ("mlm", "mrfr", "mrc", "mrc_kl")  # no ITM in the second stage
FIRST_STAGE_EVAL = ("itm", "mlm", "mrc_kl")  # always measured: the baseline and masking comparisons need them
BASELINE_FILE = "baseline.json"
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
    from pipeline.pretrain.inputs import TextSource, first_stage_sources

    cfg, data = params.pretrain, Path(params.paths.data)
    txt = data / "db" / "txt"
    masking = cfg.masking
    if stage in ("pretrain", "pretrain_masking"):
        name = output_name(stage, cfg.out_name)
        if stage == "pretrain_masking":
            masking = OTHER_MASKING[cfg.masking]
        train, val = (first_stage_sources(txt, cfg.datasets, split) for split in ("train", "val"))
        mix, steps, lr, warmup, init = cfg.mix_ratio, cfg.steps, cfg.optim.lr, cfg.optim.warmup_steps, None
        grad_clip = cfg.optim.grad_clip
        first_mix, first_steps = cfg.first_phase()
        drawn = {t for t, r in mix.items() if r > 0}  # the first phase only draws from these
        eval_tasks = tuple(sorted(set(FIRST_STAGE_EVAL) | drawn))
        dataset_ratio = cfg.dataset_weights()
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


def check_params(params: Params, plan: StagePlan) -> None:
    """Reject settings the stage cannot run with, naming the params key."""
    cfg = params.pretrain
    first = plan.stage != "pretrain_vcr"
    allowed = FIRST_STAGE_TASKS if first else VCR_TASKS
    key = "pretrain.mix_ratio" if first else "pretrain.vcr.mix_ratio"
    unknown = sorted(set(plan.mix_ratio) - set(allowed))
    if unknown:
        raise ValueError(f"{key}: task(s) {unknown} not allowed in {plan.stage}; expected a subset of {list(allowed)}")
    if not any(r > 0 for r in plan.mix_ratio.values()):
        raise ValueError(f"{key}: at least one task needs a ratio > 0")
    if first and cfg.first_phase_steps:
        unknown = sorted(set(cfg.first_phase_mix) - set(allowed))
        if unknown:
            raise ValueError(f"pretrain.first_phase_mix: task(s) {unknown} not allowed; expected a subset of "
                             f"{list(allowed)}")
        if not any(r > 0 for r in cfg.first_phase_mix.values()):
            raise ValueError("pretrain.first_phase_mix: at least one task needs a ratio > 0")
    checks = [
        (plan.steps >= 1, "steps must be >= 1"), (cfg.batch_tokens > 0, "pretrain.batch_tokens must be > 0"),
        (cfg.optim.grad_accum >= 1, "pretrain.optim.grad_accum must be >= 1"),
        # ZeRO-3 fails in backward on this model (DeepSpeed 0.19.8: "active_backward_submodules is
        # empty"), even with the borrowed decoder weights registered as external parameters
        (cfg.zero_stage in (0, 1, 2), "pretrain.zero_stage must be 0, 1 or 2 (ZeRO-3 is not supported)"),
        (cfg.world_size >= 1, "pretrain.world_size must be >= 1"),
        (cfg.keep_checkpoints >= 1, "pretrain.keep_checkpoints must be >= 1"),
        (cfg.log_every >= 1, "pretrain.log_every must be >= 1"),
        (min(cfg.val_every, cfg.checkpoint_every, cfg.val_batches, cfg.num_workers) >= 0,
         "pretrain.val_every, checkpoint_every, val_batches and num_workers must be >= 0"),
        (0 < cfg.mask_prob < 1 and 0 <= cfg.itm_neg_prob <= 1, "pretrain.mask_prob in (0, 1), itm_neg_prob in [0, 1]"),
        (cfg.hostfile is None or Path(cfg.hostfile).exists(), f"pretrain.hostfile {cfg.hostfile} does not exist"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def run(params: Params) -> None:
    """Stage ``pretrain``: first-stage pretraining."""
    _run(params, plan_stage(params, "pretrain"))


def run_masking_ablation(params: Params) -> None:
    """Stage ``pretrain_masking``: the first stage with the other masking (the results table's ablation)."""
    _run(params, plan_stage(params, "pretrain_masking"))


def run_vcr(params: Params) -> None:
    """Stage ``pretrain_vcr``: second-stage pretraining on VCR text, from the first stage's export."""
    _run(params, plan_stage(params, "pretrain_vcr"))


def _run(params: Params, plan: StagePlan) -> None:
    check_params(params, plan)
    preflight(plan.ckpt_dir, plan.out_dir, plan.metrics_dir)
    cfg = params.pretrain
    if in_launched_worker() or (cfg.world_size == 1 and cfg.hostfile is None):
        train_rank(params, plan)
        return
    # Every rank re-reads exactly these params (written beside, not inside, the checkpoint dir,
    # which rank 0 may clear while slower ranks are still starting).
    params_file = plan.ckpt_dir.parent / f"{plan.name}.launch_params.yaml"
    dump_params(params, params_file)
    launch_workers(stage=plan.stage, params_file=params_file, world_size=cfg.world_size, hostfile=cfg.hostfile,
                   master_port=cfg.master_port)
    params_file.unlink(missing_ok=True)


def _fingerprint(params: Params, plan: StagePlan, world_size: int, img_names: list[str]) -> dict[str, Any]:
    inputs = {str(s.path): db_fingerprint(s.path) for s in plan.train_sources}
    inputs.update({n: db_fingerprint(plan.img_root / n) for n in img_names})
    if plan.init_from is not None:
        inputs["init"] = file_digest(plan.init_from / "model.safetensors")
    return {"stage": plan.stage, "params": params.section_digest("seed", "model", "pretrain"),
            "world_size": world_size, "inputs": inputs}


def _flat(prefix: str, obj: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj if isinstance(obj, (int, float, str, bool)) or obj is None else str(obj)
    return out


def _by_task(metrics: Mapping[str, float], prefix: str) -> dict[str, dict[str, float]]:
    """``{"val/mlm/mlm_acc": x}`` -> ``{"mlm": {"mlm_acc": x}}``."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        head, task, metric = key.split("/", 2)
        if head == prefix:
            out.setdefault(task, {})[metric] = value
    return {t: dict(sorted(m.items())) for t, m in sorted(out.items())}


def _baseline(trainer: Trainer, engine, val, plan: StagePlan) -> dict[str, float]:
    """Held-out metrics of the model before this stage trained it (computed once, kept with the checkpoints)."""
    from pipeline.training.metrics import evaluate

    path = plan.ckpt_dir / BASELINE_FILE
    if trainer.resume_step is not None and path.exists():
        return json.loads(path.read_text())
    metrics = evaluate(engine, val, prepare=trainer.prepare, module=engine.module)
    if trainer.dist.is_main:
        atomic_write_json(path, metrics)
    return metrics


@dataclass
class Trained:
    """What one rank's run of a pretraining stage produced, for :func:`_export`."""

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


def run_settings(params: Params, plan: StagePlan, fingerprint: Mapping[str, Any]) -> RunSettings:
    """The harness's settings for one pretraining stage."""
    cfg = params.pretrain
    logged = _flat("", {"model": to_dict(params.model), "pretrain": to_dict(cfg),
                        "stage": {"name": plan.stage, "masking": plan.masking}}, {})
    return RunSettings(stage=plan.stage, desc=plan.stage, ckpt_dir=plan.ckpt_dir, metrics_dir=plan.metrics_dir,
                       fingerprint=fingerprint, logged_params=logged, steps=plan.steps, lr=plan.lr,
                       warmup_steps=plan.warmup_steps, grad_clip=plan.grad_clip, betas=tuple(cfg.optim.betas),
                       weight_decay=cfg.optim.weight_decay, zero_stage=cfg.zero_stage,
                       keep_checkpoints=cfg.keep_checkpoints, log_every=cfg.log_every, val_every=cfg.val_every,
                       checkpoint_every=cfg.checkpoint_every, grad_accum=cfg.optim.grad_accum,
                       deepspeed=cfg.deepspeed)


def train_rank(params: Params, plan: StagePlan) -> None:
    """Train this rank (one of ``world_size``); rank 0 writes the metrics and the outputs."""
    from pipeline.pretrain.inputs import held_out_batches, open_sources, train_streams
    from pipeline.training.engine import resolve_device, resolve_precision

    cfg, started = params.pretrain, time.time()
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with process_group(device.type) as dist:
        precision = resolve_precision(cfg.precision, device)
        train_dbs, img_dbs = open_sources(plan.train_sources, plan.img_root)
        val_dbs, val_img_dbs = open_sources(plan.val_sources, plan.img_root)
        model, spec, region_fit = _build_model(params, plan, train_dbs, img_dbs)
        schedule = TaskSchedule(plan.mix_ratio, seed=params.seed, first_phase_mix=plan.first_phase_mix,
                                first_phase_steps=plan.first_phase_steps, dataset_ratio=plan.dataset_ratio)
        streams = train_streams(train_dbs, img_dbs, schedule.streams, seed=params.seed, masking=plan.masking,
                                mask_prob=cfg.mask_prob, itm_neg_prob=cfg.itm_neg_prob, batch_tokens=cfg.batch_tokens,
                                rank=dist.rank, world_size=dist.world_size, num_workers=cfg.num_workers)
        def held_out(n_batches: int | None) -> dict[str, list[dict[str, Any]]]:
            return held_out_batches(val_dbs, val_img_dbs, plan.eval_tasks, seed=params.seed, mask_prob=cfg.mask_prob,
                                    itm_neg_prob=cfg.itm_neg_prob, batch_tokens=cfg.batch_tokens,
                                    n_batches=n_batches, rank=dist.rank, world_size=dist.world_size)

        val = held_out(cfg.val_batches)  # the val curves
        final_val = held_out(cfg.eval_batches or None) if cfg.val_batches else {}  # eval.json
        trainer = Trainer(run_settings(params, plan, _fingerprint(params, plan, dist.world_size, sorted(img_dbs.dbs))),
                          dist=dist, device=device, precision=precision)
        engine = trainer.build_engine(model, dropout_seed=params.seed * 1000 + dist.rank)
        baseline_start = time.time()
        baseline = _baseline(trainer, engine, final_val, plan) if cfg.val_batches else {}
        loop_start = time.time()
        loop = trainer.fit(engine, schedule=schedule, streams=streams, val_batches=val if cfg.val_batches else {})
        final, text_only, eval_timings = _final_eval(trainer, engine, final_val)
        # _run.json's wall-time split; the loop timed its own phases, "export" is added by _export
        loop.timings_s = {"startup": round(baseline_start - started, 3),
                          "baseline_eval": round(loop_start - baseline_start, 3), **loop.timings_s, **eval_timings}
        _export(params, plan, trainer, Trained(engine=engine, spec=spec, txt_meta=train_dbs[0].meta, loop=loop,
                                               baseline=baseline, final=final, text_only=text_only,
                                               held_out=final_val, schedule=schedule, streams=streams,
                                               region_fit=region_fit), started)


def _final_eval(trainer: Trainer, engine, val: Mapping[str, list[dict[str, Any]]]):
    """eval.json's metrics of the trained model on ``val``: as it is, and (MLM) with the image
    masked out; returns both and their wall times."""
    from pipeline.training.metrics import evaluate

    final_start = time.time()
    final = evaluate(engine, val, prepare=trainer.prepare, module=engine.module) if val else {}
    text_only_start = time.time()
    text_only = {}
    if "mlm" in val:  # the same decision on every rank: evaluate is a collective
        def without_image(batch: dict[str, Any]) -> dict[str, Any]:
            return trainer.prepare({**batch, "img_mask": torch.zeros_like(batch["img_mask"])})

        text_only = evaluate(engine, {"mlm": val["mlm"]}, prepare=without_image, module=engine.module,
                             prefix="val_text_only")
    return final, text_only, {"final_eval": round(text_only_start - final_start, 3),
                              "text_only_eval": round(time.time() - text_only_start, 3)}


def _build_model(params: Params, plan: StagePlan, train_dbs: list[Any], img_dbs):
    from pipeline.pretrain.model_io import build_model, model_from_export, spec_from_params

    txt_meta = train_dbs[0].meta
    vocab = int(txt_meta["vocab_size"]) + int(txt_meta.get("obj_tags", {}).get("extra_vocab", 0))
    if plan.init_from is not None:
        model, spec = model_from_export(plan.init_from, vocab_size=vocab, img_dim=img_dbs.feature_dim,
                                        num_classes=img_dbs.num_classes, dropout=params.model.dropout,
                                        mrc_kl_reduction=params.pretrain.mrc_kl_reduction)
        if plan.stage == "pretrain_vcr":  # UNITER's answer / rationale segment types, started from the text type
            from model.config import TEXT_TYPE, VCR_TYPE_VOCAB

            model.uniter.grow_type_vocab(VCR_TYPE_VOCAB, from_type=TEXT_TYPE)
            spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, type_vocab_size=VCR_TYPE_VOCAB))
        log.info("%s: starting from %s", plan.stage, plan.init_from)
        return model, spec, None
    cfg = params.pretrain
    spec = spec_from_params(params.model, vocab_size=vocab, img_dim=img_dbs.feature_dim,
                            num_classes=img_dbs.num_classes, wra_weight=cfg.wra_weight if cfg.wra else 0.0,
                            mrc_kl_reduction=cfg.mrc_kl_reduction, wra_words=cfg.wra_words)
    model = build_model(spec, bert_checkpoint=params.model.bert_checkpoint, init_from_bert=params.model.init_from_bert,
                        seed=params.seed)
    region_fit = None
    if params.model.region_init == "class_names":
        from pipeline.pretrain.region_init import init_region_projection, training_image_keys

        # fitted on this stage's training images only: never an eval image, even one in the same DB
        region_fit = init_region_projection(model.uniter, img_dbs, txt_meta, image_keys=training_image_keys(train_dbs),
                                            max_images=params.model.region_init_images, seed=params.seed)
    return model, spec, region_fit


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
        "first_phase": {"steps": plan.first_phase_steps, "mix_ratio": dict(sorted(plan.first_phase_mix.items()))}
        if plan.first_phase_steps else None,
        "held_out": held_out,
        "no_pretraining": _by_task(run.baseline, "val"), "pretrained": _by_task(run.final, "val"),
        "pretrained_text_only": _by_task(run.text_only, "val_text_only"),
    }


def _run_record(params: Params, plan: StagePlan, run: Trained, digests: list[Any], world_size: int) -> RunRecord:
    """_run.json: inputs, step counts (per task and stream, every rank's task digest) and sizes."""
    from pipeline.pretrain.model_io import MODEL_FILE

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
    record.extra["outputs"] = {"metrics": str(plan.metrics_dir)}
    return record


def _export(params: Params, plan: StagePlan, trainer: Trainer, run: Trained, started: float) -> None:
    """Rank 0 writes ``data/models/<name>/`` atomically; then the checkpoints are dropped."""
    import torch.distributed as tdist

    from pipeline.training.checkpointing import save_safetensors
    from pipeline.pretrain.model_io import CONFIG_FILE, MODEL_FILE, model_json

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
            atomic_write_json(tmp / CONFIG_FILE, model_json(run.spec, run.txt_meta, stage=plan.stage,
                                                            steps=plan.steps))
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
