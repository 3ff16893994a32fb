"""One fine-tuning run: build and initialize the task model, train it on the DeepSpeed engine with
the pretraining machinery (``pipeline.training``: token-bucket streams, seeded stream schedule,
checkpoints with exact resume, dvclive), then evaluate the consolidated weights.

A run lives in its work directory ``data/checkpoints/finetune/<task>/<init>/``: the checkpoints,
``live/`` (dvclive), ``zero_shot.json`` (retrieval, measured once before training) and, once the
run is evaluated, ``result/`` (``model.safetensors`` + ``result.json``). A killed run resumes from
its newest complete checkpoint; a finished one is not redone. ``fingerprint.json`` ties the
directory to the params and inputs: anything else there is removed, not resumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import torch

from model.config import UniterConfig
from pipeline.common.ownership import atomic_dir
from pipeline.common.runinfo import atomic_write_json, file_digest
from pipeline.finetune.guard import DivergenceGuard
from pipeline.finetune.tasks.base import FinetuneModule, FinetuneTask
from pipeline.finetune.tasks.rows import fixed_batches, mix_seed
from pipeline.params.finetune import TaskConfig
from pipeline.common.hf_cache import resolve_bert_checkpoint
from pipeline.params import deepspeed as deepspeed_params
from pipeline.training.engine import Precision
from pipeline.training.launch import DistInfo
from pipeline.training.trainer import RunSettings, Trainer

log = logging.getLogger(__name__)

Init = Literal["pretrained", "scratch"]
RESULT_DIR, RESULT_FILE, ZERO_SHOT_FILE = "result", "result.json", "zero_shot.json"
MODEL_FILE = "model.safetensors"
PREFIX = "model."  # FinetuneModule's name for the task model


@dataclass(frozen=True)
class RunPlan:
    """One run of one task from one start."""

    init: Init
    work_dir: Path
    config: UniterConfig  # the encoder shape (the pretrained export's, for both starts)
    img_dim: int
    init_state: Mapping[str, torch.Tensor] | None  # UniterForPretraining weights (pretrained start)
    scratch_init: Literal["bert", "random"]
    bert_checkpoint: Path | None
    fingerprint: Mapping[str, Any]
    # scratch start: images sampled to fit the region projection to the class names (0: random start),
    # from the training images of these pretraining text DBs (the fit the pretraining stage made)
    region_init_images: int = 0
    region_sources: tuple[Any, ...] = ()  # pipeline.stores.text_sources.TextSource of the first pretraining stage
    img_root: Path | None = None
    budget: TaskConfig | None = None  # steps, lr, batch, warmup of this start (None: the task's per_task budget)


def budget_of(task: FinetuneTask, plan: RunPlan) -> TaskConfig:
    """The budget ``plan``'s start trains with (``finetune.scratch_per_task`` or ``per_task``)."""
    return plan.budget or task.ctx.task_cfg


@dataclass
class RunOutcome:
    init: Init
    metrics: dict[str, dict[str, Any]]
    zero_shot: dict[str, dict[str, Any]] | None
    artifacts: dict[str, Any]
    last_train: dict[str, float]
    resumed_from_step: int
    timings_s: dict[str, float]
    state: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    items: dict[str, dict[str, list]] = field(repr=False, default_factory=dict)  # EvalResult.items


def build_model(task: FinetuneTask, plan: RunPlan, *, seed: int) -> torch.nn.Module:
    """The task model with its start: pretrained encoder, BERT text side only, or all random.

    The same ``seed`` gives both starts identical head weights, so they differ only in the encoder.
    """
    from model.bert_init import load_bert_weights

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = task.build_model(plan.config, img_dim=plan.img_dim)
    if plan.init == "pretrained":
        assert plan.init_state is not None
        task.load_pretrained(model, plan.init_state)
    else:
        if plan.scratch_init == "bert":
            report = load_bert_weights(model, resolve_bert_checkpoint(plan.bert_checkpoint))
            log.info("%s scratch start: text side from %s (%d tensors)", task.name, report.path, len(report.loaded))
        if plan.region_init_images:  # the same start of the region projection as pretraining had
            from pipeline.stores.text_sources import open_sources
            from pipeline.training.region_init import init_region_projection, training_image_keys

            assert plan.img_root is not None and plan.region_sources, "region_init_images needs the pretraining DBs"
            txt_dbs, img_dbs = open_sources(plan.region_sources, plan.img_root)
            init_region_projection(model.uniter, img_dbs, txt_dbs[0].meta, image_keys=training_image_keys(txt_dbs),
                                   max_images=plan.region_init_images, seed=seed)
    return model


def _streams(task: FinetuneTask, *, batch_tokens: int, seed: int) -> dict[str, Any]:
    from pipeline.training.batching import TokenBucketSampler
    from pipeline.training.streams import BatchStream

    streams = {}
    for k, name in enumerate(task.streams):
        ds = task.train_dataset(name)
        stream_seed = mix_seed(seed, 0xF17E, k) % (1 << 31)  # BatchStream multiplies it: keep it small
        sampler = TokenBucketSampler(ds.txt_lens, ds.img_lens, batch_tokens=batch_tokens, seed=stream_seed)
        streams[name] = BatchStream(ds, sampler, task.collate, seed=stream_seed, name=f"{task.name}/{name}")
        log.info("%s/%s: %d training examples, %d batches per epoch", task.name, name, len(ds),
                 len(sampler.global_batches(0)))
    return streams


def _load_result(work_dir: Path, init: Init) -> RunOutcome:
    from safetensors.torch import load_file

    record = json.loads((work_dir / RESULT_DIR / RESULT_FILE).read_text())
    return RunOutcome(init=init, metrics=record["metrics"], zero_shot=record["zero_shot"],
                      artifacts=record["artifacts"], last_train=record["last_train"],
                      resumed_from_step=record["resumed_from_step"], timings_s=record["timings_s"],
                      state=load_file(str(work_dir / RESULT_DIR / MODEL_FILE)),
                      items=record.get("items", {}))  # a result kept by a version without item scores


def run_settings(task: FinetuneTask, plan: RunPlan) -> RunSettings:
    """The harness's settings for one start of one task (``finetune`` and ``finetune.per_task.<task>``)."""
    cfg, tcfg = task.ctx.cfg, budget_of(task, plan)
    return RunSettings(stage=f"finetune@{task.name}", desc=f"{task.name} ({plan.init})", ckpt_dir=plan.work_dir,
                       metrics_dir=plan.work_dir / "live", fingerprint=plan.fingerprint,
                       logged_params={"task": task.name, "init": plan.init, "steps": tcfg.steps, "lr": tcfg.lr,
                                      "batch_tokens": tcfg.batch_tokens},
                       steps=tcfg.steps, lr=tcfg.lr, warmup_steps=tcfg.warmup_steps, grad_clip=cfg.grad_clip,
                       betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, zero_stage=cfg.zero_stage,
                       keep_checkpoints=cfg.keep_checkpoints, log_every=cfg.log_every, val_every=cfg.val_every,
                       checkpoint_every=cfg.checkpoint_every, head_lr_mul=tcfg.head_lr_mul,
                       deepspeed=deepspeed_params.resolve(cfg.deepspeed))


def _held_out(task: FinetuneTask, tcfg: TaskConfig, *, seed: int) -> dict[str, list[dict[str, Any]]]:
    """The validation curves' fixed batches per stream (streams without held-out data left out)."""
    cfg = task.ctx.cfg
    if not cfg.val_batches:
        return {}
    val = {s: fixed_batches(task.held_out_dataset(s), task.collate, batch_tokens=tcfg.batch_tokens,
                            n_batches=cfg.val_batches, seed=mix_seed(seed, 0x7A1, k))
           for k, s in enumerate(task.streams)}
    return {s: b for s, b in val.items() if b}


def train_run(task: FinetuneTask, plan: RunPlan, *, dist: DistInfo, device: torch.device, precision: Precision,
              seed: int) -> RunOutcome:
    """Train ``task`` from ``plan``'s start for its budget's steps, evaluate, keep the result.

    Returns the outcome (also stored in ``<work_dir>/result/``; a later call returns it without
    training again). Resumes from the newest complete checkpoint of the same fingerprint.
    """
    from pipeline.training.task_mix import TaskSchedule

    trainer = Trainer(run_settings(task, plan), dist=dist, device=device, precision=precision)
    if (plan.work_dir / RESULT_DIR / RESULT_FILE).exists():
        log.info("%s (%s start): already trained and evaluated in %s", task.name, plan.init, plan.work_dir)
        return _load_result(plan.work_dir, plan.init)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    model = build_model(task, plan, seed=seed)
    zero_shot = None
    if task.has_zero_shot and plan.init == "pretrained":
        zero_shot = _zero_shot(task, model, plan.work_dir, device, precision)
        timings["zero_shot_eval"] = round(time.perf_counter() - started, 3)

    budget = budget_of(task, plan)
    streams = _streams(task, batch_tokens=budget.batch_tokens, seed=seed)
    val = _held_out(task, budget, seed=seed)
    engine = trainer.build_engine(FinetuneModule(task, model), dropout_seed=mix_seed(seed, 0xD20, dist.rank))
    guard = divergence_guard(task, plan, engine.module.model, device=device, precision=precision, is_main=dist.is_main)
    guard.resume(trainer.resume_step)
    train_start = time.perf_counter()
    result = trainer.fit(engine, schedule=TaskSchedule({s: 1.0 for s in task.streams}, seed=seed), streams=streams,
                         val_batches=val, after_step=guard.after_step)
    timings["train"] = round(time.perf_counter() - train_start, 3)
    full = trainer.final_state(engine)
    state = {k[len(PREFIX):]: v for k, v in full.items() if k.startswith(PREFIX)}
    del engine

    eval_start = time.perf_counter()
    evaluated = task.build_model(plan.config, img_dim=plan.img_dim)
    evaluated.load_state_dict(state, strict=True)
    # only the pretrained start's model is kept, so only it gets the task's files (e.g. VQA test predictions)
    with encoder_in_precision(evaluated.to(device), precision, device) as on_device:
        outcome = task.evaluate(on_device, device, artifacts=plan.init == "pretrained")
    timings["eval"] = round(time.perf_counter() - eval_start, 3)
    if guard.steps:  # a diverged start raises here: nothing is stored
        guard.finish(task.dev_mean(outcome.metrics))
    timings["total"] = round(time.perf_counter() - started, 3)
    run = RunOutcome(init=plan.init, metrics=outcome.metrics, zero_shot=zero_shot, artifacts=outcome.artifacts,
                     last_train=result.last_train, resumed_from_step=result.start_step, timings_s=timings,
                     state=state, items=outcome.items)
    if dist.is_main:
        _store_result(plan.work_dir, run, stage=f"finetune@{task.name}")
    log.info("%s (%s start): %d steps in %.0fs (resumed from step %d), eval %.0fs: %s", task.name, plan.init,
             budget.steps, timings["train"], result.start_step, timings["eval"],
             _headline(task, outcome.metrics))
    return run


def divergence_guard(task: FinetuneTask, plan: RunPlan, model: torch.nn.Module, *, device: torch.device,
                     precision: Precision, is_main: bool) -> DivergenceGuard:
    """The guard of one start: scores ``model`` (the task model being trained) on dev, in the
    precision it trains in, at ``finetune.divergence_guard.checks`` steps (``pipeline.finetune.guard``)."""

    def score() -> tuple[float, float]:
        with encoder_in_precision(model, precision, device) as scored:
            return task.dev_score(scored, device)

    cfg = task.ctx.cfg.divergence_guard
    return DivergenceGuard(cfg, task=task.name, init=plan.init, total_steps=budget_of(task, plan).steps,
                           chance=task.dev_mean(task.chance()) if cfg.checks else 0.0, score=score,
                           work_dir=plan.work_dir, is_main=is_main)


def _store_result(work_dir: Path, run: RunOutcome, *, stage: str) -> None:
    """``<work_dir>/result/``: the run's weights and record, read back by :func:`_load_result`."""
    from pipeline.training.checkpointing import save_safetensors

    record = {"metrics": run.metrics, "zero_shot": run.zero_shot, "artifacts": run.artifacts,
              "last_train": run.last_train, "resumed_from_step": run.resumed_from_step, "timings_s": run.timings_s,
              "items": run.items}
    with atomic_dir(work_dir / RESULT_DIR, stage=stage) as tmp:
        save_safetensors(run.state, tmp / MODEL_FILE)
        atomic_write_json(tmp / RESULT_FILE, record)


@contextlib.contextmanager
def encoder_in_precision(model: torch.nn.Module, precision: Precision, device: torch.device) -> Iterator[torch.nn.Module]:
    """Evaluate ``model`` (a task model with ``.uniter``) in the precision it trained in, scores in fp32.

    Unless ``precision`` is fp32, the encoder's forward runs under bf16 autocast while the context
    is open, as training ran (UNITER validated its amp-O2 fp16 model); bf16 autocast evaluates ~3x
    faster on a CPU with native bf16 (docs/decisions.md#eval-precision). The encoder's output comes from a
    LayerNorm, which autocast keeps in fp32, so the pooler and the task heads score in fp32: a
    bf16 score (8-bit mantissa) would round near candidates to ties in rankings and argmaxes.
    """
    if precision == "fp32":
        yield model
        return
    encoder = model.uniter
    encoder.forward = torch.autocast(device.type, dtype=torch.bfloat16)(encoder.forward)  # type: ignore[method-assign]
    try:
        yield model
    finally:
        del encoder.forward  # the class's forward again: training wraps the whole model itself


def _zero_shot(task: FinetuneTask, model: torch.nn.Module, work_dir: Path, device: torch.device,
               precision: Precision) -> dict:
    """The task's evaluation of the start itself (retrieval: ranking by the pretrained ITM head)."""
    path = work_dir / ZERO_SHOT_FILE
    if path.exists():
        return json.loads(path.read_text())
    with encoder_in_precision(model.to(device), precision, device) as on_device:
        metrics = task.evaluate(on_device, device, artifacts=False).metrics
    atomic_write_json(path, metrics)
    return metrics


def lookup(metrics: Mapping[str, Any], key: str) -> float | None:
    """``metrics["split"]["name"]`` for key ``"split/name"`` (None when absent)."""
    split, _, name = key.partition("/")
    value = metrics.get(split, {}).get(name)
    return None if value is None else float(value)


def _headline(task: FinetuneTask, metrics: Mapping[str, Any]) -> str:
    return ", ".join(f"{label} {lookup(metrics, key)}" for label, key in task.summary)


def init_digest(init_dir: Path) -> str:
    return file_digest(init_dir / MODEL_FILE)
