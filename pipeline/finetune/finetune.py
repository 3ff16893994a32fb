"""Stage ``finetune@<task>``: fine-tune the pretrained model on one downstream task and evaluate it.

For each task of ``finetune.tasks`` (or the one named), starting from ``data/models/<out_name>``
(VCR: ``data/models/<out_name>_vcr``, the second stage; ``<out_name>`` = ``pretrain.out_name``),
the task's model is trained with the pretraining machinery (DeepSpeed engine, token-bucket streams, exact-resume checkpoints under
``data/checkpoints/finetune/<task>/``) and evaluated. With ``finetune.compare_scratch`` the same
model is also trained from a non-pretrained start (``finetune.scratch_init``: BERT text weights
only, or random; ``finetune.scratch_region_init``: its region projection random, or fitted as the
pretraining stage fitted it) with the same steps and data order, so the pretraining gain is measured.

Writes, per task:
- ``data/models/<task>/``: ``model.safetensors`` (the fine-tuned model, pretrained start),
  ``model_config.json``, ``eval.json`` (every metric of both starts, zero-shot, chance levels),
  task files (VQA: predictions in the submission format), ``item_scores.json`` (each start's score
  of every item of each headline metric, dev and test), ``_run.json`` (counts and timings);
- ``data/metrics/<task>.json``: the summary metrics of both starts, the gain with its paired
  cluster-bootstrap interval (``pipeline.training.paired``) and chance levels;
- ``data/metrics/<task>/<start>/``: dvclive training curves (loss, accuracy, lr, tokens/s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from model.config import UniterConfig
from model.weights_file import UniterFormatError
from pipeline.common.exiting import exit_now
from pipeline.common.ownership import atomic_dir, claim_dir, preflight, remove_owned
from pipeline.common.progress import configure_logging
from pipeline.common.runinfo import RunRecord, atomic_write_json
from pipeline.finetune.guard import DIVERGED_EXIT, DivergedError
from pipeline.training.paired import ITEMS_FILE, paired_gain
from pipeline.finetune.runner import RunOutcome, RunPlan, init_digest, lookup, train_run
from pipeline.finetune.tasks import task_class
from pipeline.finetune.tasks.base import FinetuneTask, TaskContext
from pipeline.params.finetune import TASKS
from pipeline.params.parser import Params, ParamsError, to_dict
from pipeline.params.pretrain import output_name
from pipeline.training.checkpointing import db_fingerprint
from pipeline.training.launch import DistInfo, process_group

log = logging.getLogger(__name__)

MODEL_FILE, CONFIG_FILE = "model.safetensors", "model_config.json"


def run(params: Params, item: str | None = None) -> dict[str, dict[str, Any]]:
    """Fine-tune and evaluate ``item`` (a task) or every task of ``finetune.tasks``; returns their
    ``data/metrics/<task>.json`` records."""
    from pipeline.training.engine import resolve_device, resolve_precision

    cfg = params.finetune
    names = [item] if item is not None else list(cfg.tasks)
    check_tasks(params, names)
    data = Path(params.paths.data)
    preflight(*(p for n in names for p in (data / "checkpoints" / "finetune" / n, data / "models" / n,
                                          *(data / "metrics" / n / init for init in ("pretrained", "scratch")))))
    device = resolve_device(cfg.device, 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    precision = resolve_precision(cfg.precision, device)
    out = {}
    with process_group(device.type) as dist:
        if dist.world_size != 1:
            raise RuntimeError("fine-tuning runs on one rank; start it without the deepspeed launcher")
        for name in names:
            out[name] = finetune_task(params, name, dist=dist, device=device, precision=precision)
    return out


def check_item(params: Params, item: str) -> None:
    """:func:`check_tasks` of one ITEM; the CLI calls it before taking the locks."""
    check_tasks(params, [item])


def check_tasks(params: Params, names: list[str]) -> None:
    """Refuse a task (an ITEM of the CLI) that does not exist or has no budget in ``finetune.per_task``.

    Every range of the ``finetune`` section is checked once, when params are parsed
    (pipeline/params/finetune.py); an ITEM is not part of params, so it is checked here."""
    for name in names:
        if name not in TASKS:  # a bad argument, not a bug: exit status 2, one line (not task_class's ValueError)
            raise ParamsError(f"finetune: unknown task {name!r} (the ITEM of `finetune`); expected one of "
                              f"{', '.join(TASKS)}")
        if name not in params.finetune.per_task:
            raise ParamsError(f"finetune.per_task has no entry for task {name!r}: add its budget there")


def finetune_seed(params: Params) -> int:
    """``finetune.seed``, or the root ``seed`` when it is null."""
    return params.seed if params.finetune.seed is None else params.finetune.seed


def task_digest(params: Params, name: str) -> str:
    """sha256 of what one task's training depends on: seed, model, the shared finetune keys and its budget."""
    shared = {k: v for k, v in to_dict(params.finetune).items() if k not in ("tasks", "per_task", "scratch_per_task")}
    payload = {"seed": finetune_seed(params), "model": to_dict(params.model), "finetune": shared,
               "task": to_dict(params.finetune.per_task[name])}
    if name in params.finetune.scratch_per_task:  # the scratch start's own budget (absent: per_task's)
        payload["scratch_task"] = to_dict(params.finetune.scratch_per_task[name])
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def encoder_config(meta: dict[str, Any], dropout: float) -> UniterConfig:
    cfg = dict(meta["uniter_config"])
    cfg.update(hidden_dropout=dropout, attention_dropout=dropout)
    return UniterConfig(**cfg)


@dataclasses.dataclass
class TaskSetup:
    """One task opened for training: its DBs, the start it fine-tunes from and the inputs' fingerprints."""

    task: FinetuneTask
    init_dir: Path
    meta: dict[str, Any]
    state: dict[str, torch.Tensor]
    config: UniterConfig
    img_dim: int
    inputs: dict[str, str]
    work_root: Path


def open_task(params: Params, name: str, *, dev_only: bool = False) -> TaskSetup:
    """Open ``name``'s DBs and read its pretrained start; check that the two fit together.

    ``dev_only``: the task scores its dev split(s) and never opens a test split (``pipeline budgets``)."""
    from pipeline.training.model_io import read_exported

    cfg, data = params.finetune, Path(params.paths.data)
    task = task_class(name)(TaskContext(name=name, data=data, cfg=cfg, task_cfg=cfg.per_task[name],
                                         seed=finetune_seed(params), dev_only=dev_only))
    task.open()
    init_dir = data / "models" / output_name(task.init_stage, params.pretrain.out_name)
    meta, state = read_exported(init_dir)
    lacking = [h for h in task.start_heads if not any(k.startswith(f"{h}.") for k in state)]
    if lacking:
        raise UniterFormatError(f"{init_dir / MODEL_FILE}: {name} starts a head from the pretraining head(s) "
                                f"{lacking}, which the start lacks")
    log.info("finetune@%s: starting from %s; pretraining heads %s", name, init_dir, start_heads(task, state))
    img_dim = task.img_dbs.feature_dim
    if int(meta["img_dim"]) != img_dim:
        raise ValueError(f"{init_dir / CONFIG_FILE}: img_dim {meta['img_dim']}, but {name}'s image DBs have {img_dim}")
    config = encoder_config(meta, params.model.dropout)
    if config.vocab_size != task.vocab_size():
        raise ValueError(f"{init_dir / CONFIG_FILE}: vocabulary {config.vocab_size}, but {name}'s text DBs need "
                         f"{task.vocab_size()} (pretrained with another tokenizer?)")
    inputs = {n: db_fingerprint(task.ctx.txt_root / n) for n in task.text_dbs()}
    inputs.update({n: db_fingerprint(task.ctx.img_root / n) for n in sorted(task.img_dbs.dbs)})
    return TaskSetup(task=task, init_dir=init_dir, meta=meta, state=state, config=config, img_dim=img_dim,
                     inputs=inputs, work_root=data / "checkpoints" / "finetune" / name)


def start_heads(task: FinetuneTask, state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """The pretraining heads of the start: those the task starts a head from, and those it skips."""
    heads = sorted({k.split(".", 1)[0] for k in state if not k.startswith("uniter.")})
    return {"used": [h for h in heads if h in task.start_heads],
            "skipped": [h for h in heads if h not in task.start_heads]}


def run_plan(params: Params, setup: TaskSetup, init: str) -> RunPlan:
    """What one start of the task trains from, where it keeps its checkpoints, and its fingerprint."""
    from pipeline.stores.text_sources import first_stage_sources

    cfg, name = params.finetune, setup.task.name
    txt_root = Path(params.paths.data) / "db" / "txt"
    # scratch_region_init=as_pretraining: the scratch start fits its region projection on the first
    # pretraining stage's training images, as that stage did
    region_sources = first_stage_sources(txt_root, params.pretrain.datasets, "train")
    fitted = cfg.scratch_region_init == "as_pretraining" and params.model.region_init == "class_names"
    region_init_images = params.model.region_init_images if fitted else 0
    start = {"init_model": init_digest(setup.init_dir)} if init == "pretrained" else \
        {"scratch_init": cfg.scratch_init, "bert": str(params.model.bert_checkpoint),
         "region_init_images": region_init_images}
    return RunPlan(init=init, work_dir=setup.work_root / init, config=setup.config,  # type: ignore[arg-type]
                   budget=cfg.budget(name, init),
                   img_dim=setup.img_dim, init_state=setup.state if init == "pretrained" else None,
                   scratch_init=cfg.scratch_init, bert_checkpoint=params.model.bert_checkpoint,
                   region_init_images=region_init_images,
                   region_sources=region_sources, img_root=Path(params.paths.data) / "db" / "img",
                   fingerprint={"task": name, "init": init, "params": task_digest(params, name),
                                "inputs": setup.inputs, **start})


def finetune_task(params: Params, name: str, *, dist: DistInfo, device: torch.device, precision: str) -> dict:
    """Train and evaluate one task from each start, write its outputs, drop its work directory."""
    cfg = params.finetune
    setup = open_task(params, name)
    claim_dir(setup.work_root, f"finetune@{name}")
    inits = ["pretrained", "scratch"] if cfg.compare_scratch else ["pretrained"]
    started = time.time()
    if len(inits) > 1 and cfg.parallel_starts and device.type == "cpu":
        train_starts_in_parallel(params, name, inits, precision=precision)
    # after a parallel run each start's result is on disk, and train_run reads it instead of training
    outcomes: dict[str, RunOutcome] = {
        init: train_run(setup.task, run_plan(params, setup, init), dist=dist, device=device, precision=precision,
                        seed=finetune_seed(params))
        for init in inits}
    record = metrics_record(setup.task, outcomes, setup.task.chance())
    write_outputs(params, setup, TaskResult(outcomes=outcomes, record=record, started=started, precision=precision))
    remove_owned(setup.work_root)
    for parent in (setup.work_root.parent, setup.work_root.parent.parent):  # checkpoints/finetune, checkpoints
        with contextlib.suppress(OSError):  # not empty (another stage's run), or already gone
            parent.rmdir()
    return record


def train_starts_in_parallel(params: Params, name: str, inits: list[str], *, precision: str) -> None:
    """Train each start of ``name`` in its own process with an equal share of the CPU cores.

    Two one-thread processes did 1.36x the steps per second of one two-thread process on 2 cores
    (small matrices parallelize poorly inside one step; docs/decisions.md#parallel-starts). Each child
    is a one-rank group of its own and leaves its result in ``<work_root>/<init>/result/``.
    """
    import multiprocessing

    threads = max(1, (os.cpu_count() or 1) // len(inits))
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked OpenMP pools or LMDB handles
    children = {init: ctx.Process(target=_train_start_child, args=(params, name, init, threads, precision),
                                  name=f"finetune@{name}:{init}") for init in inits}
    log.info("finetune@%s: training the %s starts side by side, %d thread(s) each", name, " and ".join(inits),
             threads)
    for child in children.values():
        child.start()
    for child in children.values():
        child.join()
    diverged = [init for init, child in children.items() if child.exitcode == DIVERGED_EXIT]
    if diverged:
        raise DivergedError(f"finetune@{name}: the {' and '.join(diverged)} start diverged (the step and its dev "
                            "scores are logged above; finetune.divergence_guard); the run is not reported")
    failed = [f"{init} (exit status {child.exitcode})" for init, child in children.items() if child.exitcode != 0]
    if failed:
        raise RuntimeError(f"finetune@{name}: the training process of the {', '.join(failed)} start failed; "
                           "its error is logged above. Rerun to resume from its last checkpoint, or set "
                           "finetune.parallel_starts=false to train the starts one after the other")


def _train_start_child(params: Params, name: str, init: str, threads: int, precision: str) -> None:
    """Child process of :func:`train_starts_in_parallel`: train one start of one task on the CPU."""
    start_cpu_child(f"[{init}]", threads)
    try:
        train_start_on_cpu(params, name, init, precision=precision)
    except DivergedError as err:  # said once, without a traceback; the parent names the start again
        log.error("%s", err)
        exit_now(DIVERGED_EXIT)
    exit_now(0)  # the result is on disk: skip finalizing torch & co., which the parent would wait for


def start_cpu_child(tag: str, threads: int) -> None:
    """Set up a spawned process that trains on the CPU: malloc's settings and the log format as the
    stage process has them (a spawned child inherits neither), ``threads`` torch threads, and no
    launcher variables, so that it is a one-rank group of its own."""
    from pipeline.common.malloc import keep_freed_memory
    from pipeline.training.launch import LAUNCH_ENV

    keep_freed_memory()
    configure_logging(tag)
    torch.set_num_threads(threads)
    for key in LAUNCH_ENV:  # inherited from the parent's one-rank group
        os.environ.pop(key, None)


def train_start_on_cpu(params: Params, name: str, init: str, *, precision: str,
                       dev_only: bool = False) -> RunOutcome:
    """Train (or read back) one start of one task on the CPU in a one-rank group of this process
    (``dev_only``: scored on dev only, :func:`open_task`)."""
    setup = open_task(params, name, dev_only=dev_only)
    with process_group("cpu") as dist:
        return train_run(setup.task, run_plan(params, setup, init), dist=dist, device=torch.device("cpu"),
                         precision=precision, seed=finetune_seed(params))


def metrics_record(task: FinetuneTask, outcomes: dict[str, RunOutcome], chance: dict[str, float]) -> dict[str, Any]:
    """``data/metrics/<task>.json``: per summary metric the pretrained and scratch scores, the gain and,
    where both starts scored the same items, its interval (``gain_interval``: ``paired.paired_gain``),
    chance; ``gain_intervals``: the interval of every scored split, dev included."""
    summary = {}
    for label, key in task.summary:
        entry: dict[str, Any] = {"label": label, "chance": chance.get(key)}
        for init, outcome in outcomes.items():
            entry[init] = lookup(outcome.metrics, key)
            if outcome.zero_shot is not None:
                entry["zero_shot"] = lookup(outcome.zero_shot, key)
        if "scratch" in entry and entry["pretrained"] is not None and entry["scratch"] is not None:
            entry["gain"] = round(entry["pretrained"] - entry["scratch"], 4)
        summary[key] = entry
    intervals = gain_intervals(outcomes)
    for key, entry in summary.items():
        if key in intervals:
            entry["gain_interval"] = intervals[key]
    record: dict[str, Any] = {"task": task.name, "steps": task.ctx.task_cfg.steps, "summary": summary,
                              "chance": dict(sorted(chance.items()))}
    scratch_steps = task.ctx.cfg.budget(task.name, "scratch").steps
    if "scratch" in outcomes and scratch_steps != task.ctx.task_cfg.steps:
        record["scratch_steps"] = scratch_steps  # its own budget (finetune.scratch_per_task)
    if intervals:
        record["gain_intervals"] = intervals  # dev too: how large a split must be is measured there, not on test
    references = task.references()
    if references:
        record["references"] = references
    for init, outcome in outcomes.items():
        record[init] = outcome.metrics
        if outcome.zero_shot is not None:
            record["zero_shot"] = outcome.zero_shot
    return record


def gain_intervals(outcomes: dict[str, RunOutcome]) -> dict[str, dict[str, Any]]:
    """``{"split/metric": paired.paired_gain}`` of every headline metric of every scored split that
    both starts scored item by item ({} without a scratch start); a split without labelled items has none."""
    if set(outcomes) != {"pretrained", "scratch"}:
        return {}
    pretrained, scratch = outcomes["pretrained"].items, outcomes["scratch"].items
    return {key: paired_gain(pretrained[key], scratch[key]) for key in sorted(pretrained)
            if key in scratch and pretrained[key]["ids"] and scratch[key]["ids"]}


@dataclasses.dataclass
class TaskResult:
    """One task's trained starts and what is written of them."""

    outcomes: dict[str, RunOutcome]  # init ("pretrained", "scratch") -> its run
    record: dict[str, Any]  # data/metrics/<task>.json (metrics_record)
    started: float  # wall-clock start of the task, for the stage's wall time
    precision: str


def write_outputs(params: Params, setup: TaskSetup, result: TaskResult) -> None:
    """``data/models/<task>/``, ``data/metrics/<task>.json`` and the dvclive curves of each start."""
    from pipeline.training.checkpointing import save_safetensors

    task, outcomes, record = setup.task, result.outcomes, result.record
    data, name = Path(params.paths.data), task.name
    pretrained = outcomes["pretrained"]
    run = RunRecord(f"finetune@{name}", task_digest(params, name))
    for db_name in task.text_dbs():
        run.inputs[db_name] = task.ctx.txt_root / db_name
    run.inputs["init"] = setup.init_dir / MODEL_FILE
    if "uniter_checkpoint" in setup.meta:  # the start came from a UNITER release file: which one
        run.extra["uniter_checkpoint"] = setup.meta["uniter_checkpoint"]
    run.extra["start_heads"] = start_heads(task, setup.state)
    run.counts = {"steps": task.ctx.task_cfg.steps,
                  "train_examples": {s: len(task.train_dataset(s)) for s in task.streams},
                  "resumed_from_step": {i: o.resumed_from_step for i, o in outcomes.items()},
                  "parameters": sum(v.numel() for v in pretrained.state.values())}
    run.extra["timings_s"] = {i: o.timings_s for i, o in outcomes.items()}
    run.extra["stage_wall_s"] = round(time.time() - result.started, 3)
    run.extra["precision"] = result.precision
    out_dir = data / "models" / name
    with atomic_dir(out_dir, stage=f"finetune@{name}") as tmp:
        save_safetensors(pretrained.state, tmp / MODEL_FILE)
        atomic_write_json(tmp / CONFIG_FILE, {
            "task": name, "uniter_config": dataclasses.asdict(setup.config), "img_dim": setup.img_dim,
            "task_info": task.model_info(), "init": str(setup.init_dir),
            "tokenizer": setup.meta.get("tokenizer", {})})
        last_train = {i: {k: v for k, v in o.last_train.items() if not k.endswith("tokens_per_s")}
                      for i, o in outcomes.items()}  # throughput is a timing, not a result
        atomic_write_json(tmp / "eval.json", {**record, "last_train": last_train})
        for file_name, content in sorted(pretrained.artifacts.items()):
            atomic_write_json(tmp / file_name, content)
        # what the gain's interval was drawn from, for anyone who wants another test of the same scores
        atomic_write_json(tmp / ITEMS_FILE, {i: o.items for i, o in outcomes.items()})
        run.write(tmp)
    # dvclive curves (with throughput, so not byte-stable) live beside the metrics file, as pretraining's do
    for init in outcomes:
        live, dest = setup.work_root / init / "live", data / "metrics" / name / init
        if live.is_dir():
            remove_owned(dest)  # the live dir's marker comes along: the copy is the stage's own
            shutil.copytree(live, dest)
    atomic_write_json(data / "metrics" / f"{name}.json", record)
    timing = ", ".join(f"{i} {o.timings_s.get('total', 0.0):.0f}s" for i, o in outcomes.items())
    headline = "; ".join(f"{e['label']}: {e.get('pretrained')} (scratch {e.get('scratch')}, chance {e.get('chance')})"
                         for e in record["summary"].values())
    log.info("finetune@%s: %s [%s] -> %s", name, headline, timing, out_dir)
