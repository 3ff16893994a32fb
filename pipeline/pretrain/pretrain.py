"""Stages ``pretrain``, ``pretrain_masking`` and ``pretrain_vcr``: UNITER pretraining on a DeepSpeed engine.

``pretrain`` reads the pretraining text DBs (``data/db/txt/pretrain_{indomain,outdomain}_{train,val}``
by ``pretrain.datasets``) and the image DBs they name; ``pretrain_vcr`` starts from the first
stage's export and reads the VCR text (Q→A from ``vcr_qa_<split>``, QA→R from
``vcr_qar_<split>``: two datasets, laid out as fine-tuning lays them out, segment types 0 / 2 / 3;
pipeline/stores/vcr_views.py) with MLM + MRFR + MRC-kl, no ITM. Each writes

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
from typing import Any, Mapping

import torch

from pipeline.common.ownership import preflight, remove_stale_temps
from pipeline.common.runinfo import atomic_write_json, file_digest
from pipeline.params import deepspeed as deepspeed_params
from pipeline.params.parser import Params, dump_params, to_dict
from pipeline.pretrain.export import Trained, export
from pipeline.pretrain.plan import StagePlan, plan_stage
from pipeline.training.checkpointing import db_fingerprint
from pipeline.training.launch import in_launched_worker, launch_workers, process_group
from pipeline.training.task_mix import TaskSchedule
from pipeline.training.trainer import RunSettings, Trainer

log = logging.getLogger(__name__)

BASELINE_FILE = "baseline.json"


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
    preflight(plan.ckpt_dir, plan.out_dir, plan.metrics_dir)
    if not in_launched_worker():  # the lock holder: what a killed export left goes now, not after training
        remove_stale_temps(plan.out_dir)
    cfg = params.pretrain
    if in_launched_worker() or (cfg.world_size == 1 and cfg.hostfile is None):
        train_rank(params, plan)  # a release file is checked there, before the rank writes anything
        return
    if _from_release(params, plan):  # checked here once, so that a bad file stops before any rank starts
        from pipeline.stores.text_sources import open_sources
        from pipeline.pretrain.uniter_start import uniter_start

        uniter_start(params, plan, *open_sources(plan.train_sources, plan.img_root))
    # Every rank re-reads exactly these params (written beside, not inside, the checkpoint dir,
    # which rank 0 may clear while slower ranks are still starting).
    params_file = plan.ckpt_dir.parent / f"{plan.name}.launch_params.yaml"
    dump_params(params, params_file)
    launch_workers(stage=plan.stage, params_file=params_file, world_size=cfg.world_size, hostfile=cfg.hostfile,
                   master_port=cfg.master_port)
    params_file.unlink(missing_ok=True)


def _from_release(params: Params, plan: StagePlan) -> bool:
    """Whether this stage starts from ``model.uniter_checkpoint`` (the first stage only)."""
    return plan.init_from is None and params.model.uniter_checkpoint is not None


def _fingerprint(params: Params, plan: StagePlan, world_size: int, img_names: list[str]) -> dict[str, Any]:
    inputs = {str(s.path): db_fingerprint(s.path) for s in plan.train_sources}
    inputs.update({n: db_fingerprint(plan.img_root / n) for n in img_names})
    if plan.init_from is not None:
        inputs["init"] = file_digest(plan.init_from / "model.safetensors")
    if _from_release(params, plan):
        inputs["uniter_checkpoint"] = file_digest(params.model.uniter_checkpoint)
    return {"stage": plan.stage, "params": params.section_digest("seed", "model", "pretrain"),
            "world_size": world_size, "inputs": inputs}


def _flat(prefix: str, obj: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = obj if isinstance(obj, (int, float, str, bool)) or obj is None else str(obj)
    return out


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
                       first_phase_dropout=cfg.first_phase_dropout if plan.first_phase_steps else None,
                       deepspeed=deepspeed_params.resolve(cfg.deepspeed))


def train_rank(params: Params, plan: StagePlan) -> None:
    """Train this rank (one of ``world_size``); rank 0 writes the metrics and the outputs."""
    from pipeline.pretrain.inputs import held_out_batches, train_streams
    from pipeline.stores.text_sources import open_sources
    from pipeline.training.engine import resolve_device, resolve_precision

    cfg, started = params.pretrain, time.time()
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with process_group(device.type) as dist:
        precision = resolve_precision(cfg.precision, device)
        train_dbs, img_dbs = open_sources(plan.train_sources, plan.img_root)
        val_dbs, val_img_dbs = open_sources(plan.val_sources, plan.img_root)
        if _from_release(params, plan):  # no BERT, no region fit: the file has every weight
            from pipeline.pretrain.uniter_start import uniter_start

            start = uniter_start(params, plan, train_dbs, img_dbs)
            model, spec, region_fit, release = start.model, start.spec, None, start.record
        else:
            model, spec, region_fit = _build_model(params, plan, train_dbs, img_dbs)
            release = None
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
        # _run.json's wall-time split; the loop timed its own phases, "export" is added by export
        loop.timings_s = {"startup": round(baseline_start - started, 3),
                          "baseline_eval": round(loop_start - baseline_start, 3), **loop.timings_s, **eval_timings}
        export(params, plan, trainer, Trained(engine=engine, spec=spec, txt_meta=train_dbs[0].meta, loop=loop,
                                               baseline=baseline, final=final, text_only=text_only,
                                               held_out=final_val, schedule=schedule, streams=streams,
                                               region_fit=region_fit, uniter_checkpoint=release), started)


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
    from pipeline.training.model_io import build_model, model_from_export, spec_from_params

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
                        seed=params.seed, itm_init_std=cfg.itm_init_std)
    region_fit = None
    if params.model.region_init == "class_names":
        from pipeline.training.region_init import init_region_projection, training_image_keys

        # fitted on this stage's training images only: never an eval image, even one in the same DB
        region_fit = init_region_projection(model.uniter, img_dbs, txt_meta, image_keys=training_image_keys(train_dbs),
                                            max_images=params.model.region_init_images, seed=params.seed)
    return model, spec, region_fit


