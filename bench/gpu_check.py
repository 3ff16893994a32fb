"""The one-GPU check: extraction, pretraining, fine-tuning throughput and bf16 numerics -> one JSON.

    make gpu-check                 # on a machine with one CUDA GPU: <= 8 min on an H200
    make gpu-check DRY=1           # the same code paths on the CPU, tiny shapes (< 1 min; `make test` runs it)
    .venv/bin/python bench/gpu_check.py [--dry] [--out gpu_check.json] [--peak-tflops 989]

Sections (each with a time budget for its timed loop, so the whole run stays within ~8 minutes;
setup, the warm-up and the FLOP count come on top):

1. extraction: the BUTD R101-C4 detector (``pipeline.extract.detector`` preset ``butd_r101``, random
   weights calibrated as in bench/extract.py) on rendered 600x1000 images, bf16 autocast, batched;
   images/s after a warm-up batch.
2. pretrain: ``base`` ``UniterForPretraining`` through the stage's engine
   (``pipeline.training.engine.initialize``: DeepSpeed ZeRO-2, bf16) in a one-rank process group,
   on bench/common.py's synthetic batches (mlm, mrfr, mrc_kl, itm+WRA cycled); tokens/s (text
   tokens + regions) and MFU = counted model FLOPs / time / ``--peak-tflops``.
3. overflow_ab: the A/B of ``pipeline.training.engine.skip_redundant_overflow_pass`` (DeepSpeed's
   per-gradient inf/NaN pass dropped, the stage's default) against the same engine with that pass
   kept, on 2. section's model and batches, in alternating rounds of one task cycle each (load
   hits both alike); median step time of each, the ratio, and the largest loss difference between
   the two on the same batches (the same steps, so ~0 up to the device's nondeterminism).
4. finetune: VQA (``UniterForVqa``, 3,129 answers, wrapped in the stage's ``FinetuneModule``) on
   the same engine; optimizer steps/s and examples/s.
5. numerics: one fixed tiny batch per pretraining task, the loss in fp32 on the CPU vs bf16 on the
   device (the weights cast to bf16, as the DeepSpeed bf16 engine does), from the same weights;
   relative difference per task, pass when all are <= ``--tolerance``.

``--dry``: the CPU, the ``tiny`` UNITER preset and the ``mini`` detector, two 96x128 images, a few
steps; numerics compare fp32 with bf16 both on the CPU. The JSON then says ``"dry": true`` and its
throughput figures mean nothing (they only show the code still runs).

Sections 2 and 3 and the helpers the sections share are in bench/gpu_pretrain.py.

A section that fails is recorded (``error``) and the others still run; the exit status is 1 then.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from pipeline.common.openmp import set_stage_wait_policy  # noqa: E402  isort: skip

set_stage_wait_policy()  # as a stage process waits (before torch loads)

# the pretraining sections and the helpers every section shares
from bench.gpu_pretrain import (budgeted, engine_settings, make_batch, overflow_ab, peak_memory_mb,  # noqa: E402
                                pretrain, reset_peak)

GOALS = {"extraction_images_per_s": 20.0, "pretrain_mfu": 0.40}


@dataclass(frozen=True)
class Plan:
    """Shapes, step counts and time budgets of one run (``full`` on a GPU, ``dry`` on the CPU)."""

    detector: str
    image_hw: tuple[int, int]
    det_batch: int
    preset: str
    batch: int
    txt_len: int
    regions: int
    img_dim: int
    classes: int
    answers: int
    min_steps: int  # optimizer steps timed at least (pretraining: rounded up to whole task cycles)
    max_steps: int
    budget_s: dict  # seconds of timed loop per section


FULL = Plan(detector="butd_r101", image_hw=(600, 1000), det_batch=8, preset="base", batch=128, txt_len=40,
            regions=100, img_dim=2048, classes=1601, answers=3129, min_steps=8, max_steps=200,
            budget_s={"extraction": 60, "pretrain": 90, "overflow_ab": 60, "finetune": 45})
DRY = Plan(detector="mini", image_hw=(96, 128), det_batch=2, preset="tiny", batch=4, txt_len=12, regions=10,
           img_dim=64, classes=11, answers=16, min_steps=2, max_steps=4,
           budget_s={"extraction": 1, "pretrain": 1, "overflow_ab": 1, "finetune": 1})


# -- sections ----------------------------------------------------------------------------------


def extraction(plan: Plan, device, precision: str) -> dict:
    """Section 1 -> images/s of the detector on rendered images, peak memory, regions per image."""
    import torch

    from bench.extract import make_detector, render_images
    from pipeline.extract.detector.extractor import RegionExtractor

    h, w = plan.image_hw
    detector, weights = make_detector(plan.detector, device.type, min(h, w))
    amp = torch.bfloat16 if precision == "bf16" else None  # autocast, as extraction's
    extractor = RegionExtractor(detector, batch_size=plan.det_batch, amp=amp)
    images = render_images(2 * plan.det_batch, h, w)
    chunks = [images[: plan.det_batch], images[plan.det_batch:]]  # two distinct batches, alternated
    extractor.extract(chunks[1])  # warm-up: allocator, cuDNN autotuning, lazy init
    reset_peak(device)
    found: list[int] = []

    def step(i: int) -> None:
        found.extend(len(r.boxes) for r in extractor.extract(chunks[i % 2]))

    times = budgeted(step, device, budget_s=plan.budget_s["extraction"], min_steps=plan.min_steps,
                     max_steps=plan.max_steps)
    n = len(times) * plan.det_batch
    return {"detector": plan.detector, "weights": weights, "image_size": f"{h}x{w}", "batch": plan.det_batch,
            "amp": precision, "images": n, "seconds": sum(times), "images_per_s": n / sum(times),
            "regions_per_image": sum(found) / len(found), "peak_memory_mb": peak_memory_mb(device)}


def vqa_batch(plan: Plan, vocab: int, g) -> dict:
    """A VQA training batch: the synthetic encoder inputs + soft ``targets`` [B, answers] (1-3 answers each)."""
    import torch

    b = make_batch("itm", plan, vocab, g, txt_len=min(plan.txt_len, 20))  # VQA questions are short
    b = {k: v for k, v in b.items() if k != "itm_targets"}
    targets = torch.zeros(plan.batch, plan.answers)
    for row in range(plan.batch):
        picked = torch.randint(0, plan.answers, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g)
        targets[row, picked] = torch.rand(len(picked), generator=g).clamp_min(0.3)
    return {**b, "task": "vqa", "targets": targets}


def finetune(plan: Plan, device, precision: str, zero_stage: int) -> dict:
    """Section 4 -> optimizer steps/s (and examples/s) of VQA fine-tuning through the stage's engine."""
    import torch

    from bench.common import EngineLoop
    from model.config import UniterConfig
    from model.tasks import UniterForVqa
    from pipeline.finetune.tasks.base import FinetuneModule
    from pipeline.finetune.tasks.vqa import VqaTask
    from pipeline.training.engine import cast_batch

    cfg = UniterConfig.from_preset(plan.preset, dropout=0.1)
    torch.manual_seed(0)
    model = UniterForVqa(cfg, img_dim=plan.img_dim, num_answers=plan.answers)
    # the stage's wrapper; VQA trains with the base hook model(batch), which reads no data: no context needed
    module = FinetuneModule(VqaTask(ctx=None), model)  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    batches = [cast_batch(vqa_batch(plan, cfg.vocab_size, g), device, precision) for _ in range(2)]
    loop = EngineLoop(module, engine_settings(device, precision, zero_stage, 10 * plan.max_steps), lambda b: b)
    loop.step(batches[1])  # warm-up
    reset_peak(device)
    times = budgeted(lambda i: loop.step(batches[i % 2]), device, budget_s=plan.budget_s["finetune"],
                     min_steps=plan.min_steps, max_steps=plan.max_steps)
    seconds = sum(times)
    del loop
    return {"task": "vqa", "preset": plan.preset, "num_answers": plan.answers, "precision": precision,
            "zero_stage": zero_stage, "batch": plan.batch, "steps": len(times), "seconds": seconds,
            "steps_per_s": len(times) / seconds, "examples_per_s": len(times) * plan.batch / seconds,
            "peak_memory_mb": peak_memory_mb(device)}


def peaked_soft_labels(batch: dict, g) -> dict:
    """``batch`` with detector-like soft labels (one clear top class) in place of near-uniform ones.

    bench/pretrain.py's labels are uniform draws normalised over C+1 classes: their top class wins
    by less than bf16's resolution, so casting them to bf16 (as ``cast_batch`` does) changes MRC's
    hard target and the loss with it (4% on ``base``), which is no fault of the model's numerics.
    """
    import torch

    if "img_soft_labels" not in batch:
        return batch
    logits = 4.0 * torch.randn(batch["img_soft_labels"].shape, generator=g)
    return {**batch, "img_soft_labels": logits.softmax(-1)}


def numerics(plan: Plan, device, tolerance: float) -> dict:
    """Section 5 -> per pretraining task: fp32 CPU loss, bf16 device loss, relative difference; pass/fail."""
    import torch

    from model.config import UniterConfig
    from model.pretraining import PRETRAIN_TASKS, UniterForPretraining
    from pipeline.training.engine import cast_batch

    cfg = UniterConfig.from_preset(plan.preset)
    torch.manual_seed(0)
    reference = UniterForPretraining(cfg, img_dim=plan.img_dim, num_classes=plan.classes, wra_weight=0.1).eval()
    # the candidate is what the bf16 engine trains: the same weights cast to bf16, bf16 inputs
    candidate = copy.deepcopy(reference).to(device).to(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    losses = {}
    with torch.no_grad():  # eval mode: no dropout, so both sides see the same function
        for task in PRETRAIN_TASKS:
            b = peaked_soft_labels(make_batch(task, plan, cfg.vocab_size, g, batch=4, regions=12, txt_len=16), g)
            ref = float(reference(cast_batch(b, torch.device("cpu"), "fp32"), task).loss)
            got = float(candidate(cast_batch(b, device, "bf16"), task).loss)
            losses[task] = {"fp32_cpu": ref, f"bf16_{device.type}": got,
                            "rel_diff": abs(got - ref) / max(abs(ref), 1e-6)}
    worst = max(v["rel_diff"] for v in losses.values())
    return {"preset": plan.preset, "batch": "4 examples, <= 16 tokens, <= 12 regions", "reference": "fp32 on cpu",
            "candidate": f"bf16 on {device.type}", "losses": losses, "max_rel_diff": worst, "tolerance": tolerance,
            "pass": worst <= tolerance}


# -- the run -----------------------------------------------------------------------------------


def environment(device) -> dict:
    """What ran: device name, versions, date."""
    import deepspeed
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, " \
        f"capability {torch.backends.cpu.get_cpu_capability()}"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat()}


def run_section(name: str, fn, results: dict) -> None:
    """Run one section, recording its figures or its error and its wall time."""
    start = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - one failed section must not cost the other figures of a GPU slot
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    results[name]["wall_s"] = time.perf_counter() - start
    # every figure in full (a run cut off before the JSON is written still leaves them in its log)
    shown = {k: v for k, v in results[name].items() if k != "traceback"}
    print(f"[gpu-check] {name}: {json.dumps(shown, default=str)}", flush=True)
    if "traceback" in results[name]:
        print(results[name]["traceback"][-2000:], flush=True)


def goals(sections: dict, dry: bool, tolerance: float) -> dict:
    """Each goal with its measured value and met / not met (throughput goals: null in a dry run)."""
    def check(section: str, key: str, goal: float) -> dict:
        value = sections[section].get(key)
        met = None if dry or value is None else value >= goal
        return {"goal": f">= {goal:g}", "value": value, "met": met}

    num = sections["numerics"]
    return {"extraction_images_per_s": check("extraction", "images_per_s", GOALS["extraction_images_per_s"]),
            "pretrain_mfu": check("pretrain", "mfu", GOALS["pretrain_mfu"]),
            "numerics_bf16_vs_fp32": {"goal": f"max rel diff <= {tolerance:g}",
                                      "value": num.get("max_rel_diff"), "met": num.get("pass")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes: checks the code paths (< 1 min)")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="device peak dense bf16 TFLOP/s (H200: 989)")
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=2e-2, help="numerics: max relative loss difference")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="also write DIR/pretrain_profile.txt: torch.profiler's table of one pretraining task cycle")
    args = ap.parse_args(argv)
    # the Makefile exports DS_ACCELERATOR=cpu for the CPU pipeline; DeepSpeed reads it on import
    os.environ["DS_ACCELERATOR"] = "cpu" if args.dry else "cuda"
    import torch

    from pipeline.training.launch import process_group

    if not args.dry and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --dry for the CPU smoke run)", file=sys.stderr)
        return 2
    plan, device = (DRY, torch.device("cpu")) if args.dry else (FULL, torch.device("cuda", 0))
    precision = "fp32" if args.dry else "bf16"  # CPU bf16 matmuls are ~60x slower here (docs/gpu.md)
    started = time.perf_counter()
    sections: dict = {}
    run_section("extraction", lambda: extraction(plan, device, precision), sections)
    with process_group(device.type):
        run_section("pretrain", lambda: pretrain(plan, device, precision, args.zero_stage, args.peak_tflops,
                                                 args.profile), sections)
        run_section("overflow_ab", lambda: overflow_ab(plan, device, args.zero_stage, args.peak_tflops), sections)
        run_section("finetune", lambda: finetune(plan, device, precision, args.zero_stage), sections)
    run_section("numerics", lambda: numerics(plan, device, args.tolerance), sections)
    report = {"dry": args.dry, **environment(device), "plan": asdict(plan), "sections": sections,
              "goals": goals(sections, args.dry, args.tolerance), "wall_s": time.perf_counter() - started}
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"[gpu-check] wrote {args.out} ({report['wall_s']:.0f} s)")
    return 1 if any("error" in s for s in sections.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
