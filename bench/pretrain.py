"""Benchmark: pretraining throughput, honestly: the bare model, the DeepSpeed step, the stage's loop.

    .venv/bin/python bench/pretrain.py                       # CPU: (a) bare / (b) engine / (c) stage loop
    .venv/bin/python bench/pretrain.py --device cuda         # GPU: UNITER-base bf16 MFU (target >= 40%)
    .venv/bin/python bench/pretrain.py --world synthetic     # CPU: plain loop vs engine on synthetic batches

**Stage world** (default on CPU). A small world is written with the pipeline's own code (mini-world
scenes and captions, feature shards in the extract stage's format at the mini detector's width
``MINI_FEATURE_DIM`` x ``MINI_NUM_CLASSES``, clean COCO/VG/CC/SBU manifests) and turned into LMDB
text and image DBs by the real ``build_dbs`` stage. Then, side by side in one process, on the same
model (params.yaml ``model:``, same initial weights) and the same batches:

- (a) ``bare``:   forward + ``loss.backward()`` only (no optimizer, no clipping): the denominator;
- ``plain``:      (a) + ``clip_grad_norm_`` + torch AdamW step + scheduler (what (b) should cost);
- (b) ``engine``: the stage's DeepSpeed engine (``pipeline.training.engine.initialize``,
                  ``engine(batch, task)``, ``engine.backward``, ``engine.step``);
- (c) ``loop``:   the stage's ``pipeline.training.loop.train()`` with real ``BatchStream``s over the
                  LMDB DBs (``pipeline.pretrain.inputs.train_streams``), a real dvclive
                  ``MetricsLogger``, a ``Checkpointer`` and held-out validation, both once per
                  round by default (outside (c)'s time either way); timed by
                  ``LoopResult.timings_s["train"]`` (steps: data loading, collation, host->device,
                  forward/backward/step, running means);
- ``loop+log``:   the wall time of the same ``train()`` call minus its validation and checkpoint
                  time: (c) plus the log lines (means.reduce, dvclive) and the loop's bookkeeping.

(a), ``plain`` and (b) run on batches drawn beforehand from a second set of the very same streams,
so every loop sees the same batches in the same order (checked: (c)'s token count per round must
equal theirs). The task of each step follows ``pretrain.mix_ratio`` (the main phase's mix; the
first, ITM-only phase is not modelled). Rounds of ``--steps`` steps rotate the loops (a, plain, b,
c; then plain, b, c, a; ...) after one warm-up round each, so background load hits all alike. Per
round each loop gets tokens/s = real input units (text tokens + regions, ``loop.batch_units``) /
seconds; the table shows the median over rounds and the ratio to (a). Target: (c)/(a) >= 0.85.
The defaults (20 steps x 6 rounds, ~3 min with bf16 on 2 cores) are what it takes for the figure
to settle: a bf16 CPU step is ~0.25 s, so 10 ms of machine noise moves a ratio by 0.04, and runs
of 3 rounds read 0.78-0.86 where 6 rounds read 0.88 on one idle machine.

**Synthetic world** (default with ``--device cuda``): the plain PyTorch loop vs the DeepSpeed engine
on synthetic token-bucket batches (docs/design.md §10 keys; ``--tasks`` cycled, one task per step; two
distinct batches per task, placed on the device beforehand), with the same AdamW(0.9, 0.98), weight
decay 0.01 without biases/norms, warmup + linear decay and gradient clipping:

- plain:     forward, ``loss.backward()``, ``clip_grad_norm_``, ``optimizer.step()``, scheduler;
- deepspeed: ``pipeline.training.engine.initialize`` (the stage's engine: ZeRO ``--zero-stage``,
             fp32 on CPU / bf16 on GPU), ``engine.backward`` + ``engine.step``; with ZeRO-1/2 in bf16
             its overflow check is the gradient-norm test alone, or with ``--overflow-pass``
             DeepSpeed's per-gradient pass first, as before (the A/B of that change).

They run in alternating rounds of ``--steps`` steps (ABAB...) after one warm-up round each, so
load from other processes hits both alike; the figure per loop is its median step time over all
rounds. MFU = model FLOPs per step (counted with torch's FlopCounterMode on one forward+backward
per task: matmuls and attention) / median step time / ``--peak-tflops`` (H200 dense bf16: 989).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# first: a stage process's OpenMP wait and malloc settings, before torch loads, so (c) is the stage's loop
from bench.common import (MINI_FEATURE_DIM, MINI_NUM_CLASSES, BareLoop, EngineLoop, PlainLoop,  # isort: skip
                          flops_per_step, synthetic_batch, timed_round)
import torch  # noqa: E402  isort: skip

from model.config import UniterConfig
from model.pretraining import UniterForPretraining
from pipeline.training.engine import EngineSettings, cast_batch, initialize
from pipeline.training.launch import process_group
from pipeline.training.loop import batch_units


# ------------------------------------------------------------------------------- the stage world

ROOT = Path(__file__).resolve().parent.parent
# regions per image: extract.min_boxes (10) is the floor; mini-world scenes hold <= 5 objects
MINI_REGIONS = (10, 16)
LOOPS = ("bare", "plain", "engine", "loop")  # round order; "loop+log" comes from the same run as "loop"


def write_stage_world(data: Path, *, coco_images: int = 240, vg_images: int = 80, web_images: int = 20,
                      captions: int = 5, regions: tuple[int, int] = MINI_REGIONS, img_dim: int = MINI_FEATURE_DIM,
                      num_classes: int = MINI_NUM_CLASSES, seed: int = 0):
    """Feature shards + clean COCO/VG/CC/SBU manifests under ``data`` (the formats build_dbs reads),
    with mini-world captions; returns params.yaml pointed at ``data`` with ingest limited to them."""
    import numpy as np

    from pipeline.params.parser import load_params
    from pipeline.extract.detector.extractor import Regions
    from pipeline.extract.detector.shards import encode_shard, shard_name
    from pipeline.ingest.manifest import ParquetStreamWriter, manifest_schema
    from pipeline.mini_world.scenes import dataset_rng, sample_scene
    from pipeline.mini_world.text import coco_captions, region_phrases, web_caption
    from pipeline.common.runinfo import atomic_write_bytes, atomic_write_json, mark_done

    size, shard_size = 192, 100
    sources = {"coco": coco_images, "vg": vg_images, "cc": web_images, "sbu": web_images}
    for source, n_images in sources.items():
        rng = dataset_rng(seed, f"bench/{source}")
        ids = [f"{source}{i:06d}" for i in range(n_images)]
        rows = []
        for n, image_id in enumerate(ids):
            scene = sample_scene(rng, size=size, max_objects=5)
            if source == "coco":
                texts, split = coco_captions(rng, scene, captions), "val" if n % 6 == 5 else "train"
            elif source == "vg":
                texts, split = [p for p, _ in region_phrases(rng, scene)][:captions], "train"
            else:
                texts, split = [web_caption(rng, scene, "plain")], "val" if (source == "cc" and n % 4 == 3) else "train"
            rows += [{"example_id": f"{source}-{image_id}-{c}", "dataset": source, "split": split,
                      "image_source": source, "image_id": image_id, "image_path": f"{source}/{image_id}.jpg",
                      "url": None, "text": t} for c, t in enumerate(texts)]
        # build_dbs reads the clean pretraining manifests, and COCO's ingest manifest for retrieval
        for path in [data / "clean" / f"{source}.parquet"] + ([data / "manifests" / "coco.parquet"]
                                                              if source == "coco" else []):
            with ParquetStreamWriter(path, manifest_schema([]), chunk_rows=10_000) as w:
                for row in rows:
                    w.append(row)
        out = data / "features" / source
        out.mkdir(parents=True, exist_ok=True)
        for k, start in enumerate(range(0, len(ids), shard_size)):
            chunk, sets = ids[start:start + shard_size], []
            for _ in chunk:
                r = int(rng.integers(regions[0], regions[1] + 1))
                xy = np.sort(rng.uniform(0, size, (r, 2, 2)), axis=1)  # x1 < x2, y1 < y2
                boxes = np.stack([xy[:, 0, 0], xy[:, 0, 1], xy[:, 1, 0], xy[:, 1, 1]], 1).astype(np.float32)
                soft = rng.gamma(0.3, size=(r, num_classes)).astype(np.float32) + 1e-6
                sets.append(Regions(features=np.maximum(rng.standard_normal((r, img_dim)), 0).astype(np.float32),
                                    boxes=boxes, conf=rng.uniform(0.2, 1.0, r).astype(np.float32),
                                    soft_labels=soft / soft.sum(1, keepdims=True), attributes=None,
                                    image_hw=(size, size)))
            path = out / shard_name(k)
            atomic_write_bytes(path, encode_shard(chunk, sets, feature_dim=img_dim, num_classes=num_classes))
            mark_done(path, {"images": len(chunk)})
        atomic_write_json(out / "meta.json", {
            "feature_dim": img_dim, "num_classes": num_classes, "detector": "bench",
            "class_names": ["__background__"] + [f"c{i}" for i in range(1, num_classes)], "mode": "detected"})
    import logging

    quiet = logging.getLogger("pipeline.params.parser")  # warns about eval sets of datasets the world lacks
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        # the pretraining datasets only, so no fine-tuning task (its scored splits could not be removed)
        sets = [f"paths.data={data}", "ingest.datasets=[coco,vg,cc,sbu]", "finetune.tasks=[]"]
        return load_params(ROOT / "params.yaml", sets, check_paths=False)
    finally:
        quiet.setLevel(level)


def build_stage_dbs(params) -> None:
    """The real build_dbs stage over the world's features and clean manifests."""
    import logging

    from pipeline.stores.build_dbs import run as build_dbs

    logging.getLogger("pipeline.stores.build_dbs").setLevel(logging.ERROR)  # test splits the world leaves empty
    build_dbs(params)


class TallyStream:
    """A ``BatchStream`` that also keeps the batches it handed out (counted after the round)."""

    def __init__(self, stream) -> None:
        self.stream, self.batches = stream, []

    def next_batch(self) -> dict:
        batch = self.stream.next_batch()
        self.batches.append(batch)
        return batch

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state) -> None:
        self.stream.load_state_dict(state)


def stage_table(tokens_s: dict[str, list[float]], step_s: dict[str, list[float]], target: float = 0.85) -> list[str]:
    """The result table: per loop the median tokens/s and step time over rounds, the ratio of its
    median to (a)'s, and the median of the per-round ratios (paired: robust to load drifting
    between rounds); then b/a and c/a (ratios of medians) with the target."""
    labels = {"bare": "(a) bare fwd+bwd", "plain": "    + torch AdamW", "engine": "(b) DeepSpeed step",
              "loop": "(c) stage loop", "loop+log": "    + log lines"}
    med = {k: statistics.median(v) for k, v in tokens_s.items() if v}
    lines = [f"{'loop':<10} {'what':<20} {'tokens/s':>9} {'step ms':>8} {'vs (a)':>7} {'paired':>7}"]
    for name in ("bare", "plain", "engine", "loop", "loop+log"):
        if name in med:
            paired = statistics.median(x / a for x, a in zip(tokens_s[name], tokens_s["bare"]))
            lines.append(f"{name:<10} {labels[name]:<20} {med[name]:9.0f} "
                         f"{1000 * statistics.median(step_s[name]):8.1f} {med[name] / med['bare']:7.3f} {paired:7.3f}")
    if "engine" in med:
        lines.append(f"b/a = {med['engine'] / med['bare']:.3f}")
    if "loop" in med:
        ca = med["loop"] / med["bare"]
        lines.append(f"c/a = {ca:.3f}  target >= {target:.2f}: {'met' if ca >= target else 'NOT met'}")
    return lines


def stage_main(args: argparse.Namespace) -> int:
    """The stage world: (a) bare / plain / (b) engine / (c) the stage's training loop, side by side."""
    import logging
    import tempfile

    from pipeline.pretrain.plan import plan_stage
    from pipeline.training.checkpointing import Checkpointer
    from pipeline.pretrain.inputs import held_out_batches, train_streams
    from pipeline.stores.text_sources import open_sources
    from pipeline.training.engine import resolve_precision
    from pipeline.training.loop import LoopSettings, train
    from pipeline.training.metrics import MetricsLogger
    from pipeline.training.model_io import build_model, spec_from_params
    from pipeline.training.task_mix import TaskSchedule

    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    precision = resolve_precision("auto", device)
    steps = args.steps or 20
    rounds = 6 if args.rounds is None else args.rounds
    work = tempfile.TemporaryDirectory(prefix="bench-pretrain-")
    data = Path(work.name) / "data"
    t0 = time.perf_counter()
    params = write_stage_world(data, coco_images=args.images, vg_images=max(1, args.images // 3),
                               web_images=max(4, args.images // 12))
    build_stage_dbs(params)
    world_s = time.perf_counter() - t0
    cfg = params.pretrain
    batch_tokens = args.batch_tokens or cfg.batch_tokens
    zero = cfg.zero_stage if args.zero_stage is None else args.zero_stage
    plan = plan_stage(params, "pretrain")
    schedule = TaskSchedule(plan.mix_ratio, seed=params.seed)
    # once a round: params.yaml's cadence scaled to a 20-step round would validate every step, and
    # validation and checkpoints are outside (c)'s time anyway (their own timings_s buckets)
    val_every = steps if args.val_every is None else args.val_every
    ckpt_every = steps if args.checkpoint_every is None else args.checkpoint_every

    with process_group(device.type) as dist:
        train_dbs, img_dbs = open_sources(plan.train_sources, plan.img_root)
        val_dbs, val_img_dbs = open_sources(plan.val_sources, plan.img_root)

        def streams_for():
            return train_streams(train_dbs, img_dbs, schedule.tasks, seed=params.seed, masking=plan.masking,
                                 mask_prob=cfg.mask_prob, itm_neg_prob=cfg.itm_neg_prob, batch_tokens=batch_tokens,
                                 rank=0, world_size=1, num_workers=cfg.num_workers)

        streams = {t: TallyStream(st) for t, st in streams_for().items()}  # (c)'s own
        mirror = streams_for()  # the same batch sequences, drawn now for (a) / plain / (b)
        drawn = [[mirror[schedule.task_at(k)].next_batch() for k in range(1, steps + 1)] for _ in range(rounds + 1)]
        units = [[batch_units(b) for b in rnd] for rnd in drawn]
        drawn = [[cast_batch(b, device, precision) for b in rnd] for rnd in drawn]
        val = held_out_batches(val_dbs, val_img_dbs, plan.eval_tasks, seed=params.seed, mask_prob=cfg.mask_prob,
                               itm_neg_prob=cfg.itm_neg_prob, batch_tokens=batch_tokens, n_batches=cfg.val_batches,
                               rank=0, world_size=1)
        vocab = int(train_dbs[0].meta["vocab_size"])
        model_cfg = params.model if args.preset is None else dataclasses.replace(params.model, preset=args.preset)
        spec = spec_from_params(model_cfg, vocab_size=vocab, img_dim=img_dbs.feature_dim,
                                num_classes=img_dbs.num_classes, wra_weight=cfg.wra_weight if cfg.wra else 0.0)
        base = build_model(spec, bert_checkpoint=None, init_from_bert=False, seed=params.seed)
        s = EngineSettings(device=device, precision=precision, world_size=1, zero_stage=zero,
                           grad_accum=cfg.optim.grad_accum, grad_clip=cfg.optim.grad_clip, lr=cfg.optim.lr,
                           betas=tuple(cfg.optim.betas), weight_decay=cfg.optim.weight_decay,
                           warmup_steps=cfg.optim.warmup_steps, total_steps=10 * steps * (rounds + 1))

        def prepare(b: dict) -> dict:
            return b

        loops = {"bare": BareLoop(copy.deepcopy(base), s, prepare), "plain": PlainLoop(copy.deepcopy(base), s, prepare),
                 "engine": EngineLoop(copy.deepcopy(base), s, prepare)}
        torch.manual_seed(params.seed * 1000)
        stage_engine = initialize(copy.deepcopy(base), s)
        ckpt = Checkpointer(Path(work.name) / "checkpoints", stage="pretrain", keep=cfg.keep_checkpoints, dist=dist,
                            fingerprint={"bench": "pretrain"})
        ckpt.prepare()
        logger = MetricsLogger(Path(work.name) / "metrics", stage="pretrain", enabled=True, resume_step=None,
                               params={"bench": "pretrain"})
        loop_settings = LoopSettings(total_steps=steps, grad_accum=cfg.optim.grad_accum, log_every=cfg.log_every,
                                     val_every=val_every, checkpoint_every=ckpt_every, device=device,
                                     precision=precision, desc="bench loop")
        n_params = sum(p.numel() for p in base.parameters())
        mean_units = statistics.mean(u for rnd in units for u in rnd)
        print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else f'{torch.get_num_threads()} threads'}), "
              f"{precision}, preset {spec.config.hidden_size}x{spec.config.num_layers} ({n_params / 1e6:.1f}M params), "
              f"ZeRO-{zero}, batch_tokens {batch_tokens} ({mean_units:.0f} real units per batch), "
              f"features {img_dbs.feature_dim}-d x {img_dbs.num_classes} classes; mix {dict(plan.mix_ratio)}; "
              f"{steps} steps x {rounds} rounds (+1 warm-up); loop: log every {cfg.log_every}, "
              f"val every {val_every} ({cfg.val_batches} batches/task), checkpoint every {ckpt_every}; "
              f"world + DBs built in {world_s:.0f}s", flush=True)

        def run_loop(name: str, r: int) -> tuple[float, float]:
            """One round of loop ``name``: (train seconds, wall seconds excluding validation/checkpoints)."""
            if name != "loop":
                t = timed_round(loops[name], drawn[r], device)
                return sum(t), sum(t)
            for st in streams.values():
                st.batches.clear()
            start = time.perf_counter()
            res = train(stage_engine, schedule=schedule, streams=streams, checkpointer=ckpt, logger=logger,
                        val_batches=val, dist=dist, settings=loop_settings, resume_step=None)
            wall = time.perf_counter() - start - res.timings_s["validation"] - res.timings_s["checkpoint"]
            got = sum(batch_units(b) for st in streams.values() for b in st.batches)
            if got != sum(units[r]):
                raise RuntimeError(f"round {r}: the stage loop trained on {got} units, the drawn batches hold "
                                   f"{sum(units[r])}: the streams diverged")
            return res.timings_s["train"], wall

        tokens_s: dict[str, list[float]] = {k: [] for k in (*LOOPS, "loop+log")}
        step_s: dict[str, list[float]] = {k: [] for k in tokens_s}
        try:
            for r in range(rounds + 1):
                order = LOOPS[r % len(LOOPS):] + LOOPS[:r % len(LOOPS)]
                for name in order:
                    train_s, wall_s = run_loop(name, r)
                    if r == 0:
                        continue  # warm-up: allocator, lazy init, page cache, DataLoader start
                    for key, sec in ((name, train_s),) + ((("loop+log", wall_s),) if name == "loop" else ()):
                        tokens_s[key].append(sum(units[r]) / sec)
                        step_s[key].append(sec / steps)
                if r > 0:
                    print(f"round {r}: " + ", ".join(f"{k} {tokens_s[k][-1]:.0f}" for k in tokens_s) + " tokens/s",
                          flush=True)
        finally:
            logger.close()
    print("\n".join(stage_table(tokens_s, step_s)))
    work.cleanup()
    return 0

def synthetic_main(args: argparse.Namespace) -> int:
    """The synthetic world: plain PyTorch loop vs the DeepSpeed engine (and MFU on a GPU)."""
    gpu = args.device == "cuda"
    os.environ.setdefault("DS_ACCELERATOR", args.device)  # read when deepspeed is first imported
    preset = args.preset or ("base" if gpu else "small")
    zero = 2 if args.zero_stage is None else args.zero_stage
    batch = args.batch or (128 if gpu else 8)
    regions = args.regions or (100 if gpu else 36)
    steps = args.steps or (10 if gpu else 4)
    rounds = 3 if args.rounds is None else args.rounds
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    precision = "bf16" if gpu else "fp32"
    tasks = args.tasks.split(",")

    cfg = UniterConfig.from_preset(preset, dropout=0.1)
    torch.manual_seed(0)
    base = UniterForPretraining(cfg, img_dim=args.img_dim, num_classes=args.classes, wra_weight=0.1)
    g = torch.Generator().manual_seed(0)
    n_batches = steps * (rounds + 1)
    # a few distinct batches, cycled, already on the device: the loops are timed, not host copies
    distinct = [cast_batch(synthetic_batch(tasks[i % len(tasks)], batch=batch, txt_len=args.txt_len,
                                           regions=regions, vocab=cfg.vocab_size, img_dim=args.img_dim,
                                           classes=args.classes, g=g), device, precision)
                for i in range(2 * len(tasks))]
    batches = [distinct[i % len(distinct)] for i in range(n_batches)]
    units = [batch_units(b) for b in batches]

    def prepare(b: dict) -> dict:
        return b

    s = EngineSettings(device=device, precision=precision, world_size=1, zero_stage=zero, grad_accum=1,
                       grad_clip=2.0, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=10,
                       total_steps=10 * n_batches, extra=args.ds_config)
    print(f"device {device} ({torch.cuda.get_device_name(device) if gpu else f'{torch.get_num_threads()} threads'}), "
          f"{precision}, preset {preset} ({sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params), "
          f"batch {batch} x (<= {args.txt_len} text + <= {regions} regions), tasks {tasks}, ZeRO-{zero}"
          + (f", DeepSpeed config + {json.dumps(args.ds_config)}" if args.ds_config else ""))
    with process_group(device.type):
        plain = PlainLoop(copy.deepcopy(base), s, prepare)
        engine = EngineLoop(copy.deepcopy(base), s, prepare)
        optimizer = engine.engine.optimizer
        if args.overflow_pass:  # DeepSpeed's own per-gradient check back (skip_redundant_overflow_pass's A/B)
            vars(optimizer).pop("has_overflow", None)
        if getattr(optimizer, "check_grad_overflow", False):  # ZeRO-1/2 in bf16
            dropped = "has_overflow" in vars(optimizer)
            print("overflow check: " + ("the gradient norm alone" if dropped
                                        else "DeepSpeed's per-gradient pass, then the gradient norm"))
        fl = flops_per_step(copy.deepcopy(base).to(device).to(torch.bfloat16 if gpu else torch.float32),
                            batches[: len(tasks)], prepare)
        times: dict[str, list[float]] = {"plain": [], "deepspeed": []}
        for r in range(rounds + 1):
            chunk = batches[r * steps:(r + 1) * steps]
            for name, loop in (("plain", plain), ("deepspeed", engine)) if r % 2 == 0 else \
                    (("deepspeed", engine), ("plain", plain)):
                t = timed_round(loop, chunk, device)
                if r > 0:  # round 0 warms up (allocator, kernels, lazy init)
                    times[name] += t
    med = {k: statistics.median(v) for k, v in times.items()}
    mean_units = statistics.mean(units[steps:])
    print(f"{'loop':<10} {'median step s':>14} {'tokens/s':>10} {'TFLOP/s':>9} {'MFU':>7}")
    for name in ("plain", "deepspeed"):
        tflops = fl / med[name] / 1e12
        mfu = f"{100 * tflops / args.peak_tflops:6.1f}%" if gpu else "    -"
        print(f"{name:<10} {med[name]:14.4f} {mean_units / med[name]:10.0f} {tflops:9.3f} {mfu:>7}")
    overhead = med["deepspeed"] / med["plain"] - 1
    print(f"model FLOPs per step (mean over {tasks}): {fl / 1e9:.1f} GFLOP; real input units per batch: {mean_units:.0f}")
    print(f"deepspeed / plain step time: {med['deepspeed'] / med['plain']:.3f} "
          f"(overhead {100 * overhead:+.1f}%; target <= +10%)")
    return 0



def ds_config(text: str) -> dict:
    """``--ds-config``: a JSON object that params.yaml's ``pretrain.deepspeed`` would accept (the same
    check, so a change measured here can be made in params), else an argparse error naming the key."""
    from pipeline.params.deepspeed import mapping_problem

    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    problem = mapping_problem(value, "pretrain")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--world", choices=["stage", "synthetic"], default=None,
                    help="stage: (a)/(b)/(c) on LMDB DBs built by build_dbs (default on CPU); "
                         "synthetic: plain vs engine on synthetic batches, MFU (default with --device cuda)")
    ap.add_argument("--preset", default=None, help="model preset (default: params.yaml model.preset / small on "
                                                   "CPU, base on GPU in the synthetic world)")
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default: stage 20; synthetic 4 CPU, 10 GPU)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timed rounds after the warm-up (default: stage 6; synthetic 3)")
    ap.add_argument("--zero-stage", type=int, default=None,
                    help="ZeRO stage (default: params.yaml pretrain.zero_stage in the stage world, 2 in the synthetic)")
    ap.add_argument("--threads", type=int, default=None)
    stage = ap.add_argument_group("stage world")
    stage.add_argument("--images", type=int, default=240, help="COCO images of the world (VG: a third)")
    stage.add_argument("--batch-tokens", type=int, default=None, help="default: params.yaml pretrain.batch_tokens")
    stage.add_argument("--val-every", type=int, default=None, help="validation cadence in (c) (default: once a round)")
    stage.add_argument("--checkpoint-every", type=int, default=None,
                       help="checkpoint cadence in (c) (default: once a round)")
    syn = ap.add_argument_group("synthetic world")
    syn.add_argument("--batch", type=int, default=None, help="examples per batch (default 8 CPU, 128 GPU)")
    syn.add_argument("--txt-len", type=int, default=40)
    syn.add_argument("--regions", type=int, default=None, help="max regions per example (default 36 CPU, 100 GPU)")
    syn.add_argument("--img-dim", type=int, default=2048)
    syn.add_argument("--classes", type=int, default=1601)
    syn.add_argument("--tasks", default="mlm,mrfr,mrc_kl,itm", help="cycled, one per step")
    syn.add_argument("--ds-config", type=ds_config, default={}, metavar="JSON",
                     help="merged over the engine's DeepSpeed config, as params.yaml pretrain.deepspeed is "
                          "(e.g. '{\"bf16\": {\"check_grad_overflow\": false}}')")
    syn.add_argument("--overflow-pass", action="store_true",
                     help="keep DeepSpeed's per-gradient inf/NaN pass, which the engine drops where its gradient "
                          "norm test decides the same (pipeline.training.engine.skip_redundant_overflow_pass)")
    syn.add_argument("--peak-tflops", type=float, default=989.0, help="device peak dense bf16 TFLOP/s (H200: 989)")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", args.device)  # read when deepspeed is first imported
    world = args.world or ("synthetic" if args.device == "cuda" else "stage")
    return stage_main(args) if world == "stage" else synthetic_main(args)

if __name__ == "__main__":
    sys.exit(main())
