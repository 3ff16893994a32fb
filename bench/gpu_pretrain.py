"""The pretraining sections of the GPU check (bench/gpu_check.py), and the helpers all its sections share.

- ``pretrain``: tokens/s, TFLOP/s and MFU of the stage's engine (DeepSpeed ZeRO-2, bf16);
- ``overflow_ab``: that engine against the same engine keeping DeepSpeed's per-gradient overflow pass.

torch is imported inside the functions: bench/gpu_check.py sets the OpenMP wait policy before it loads.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.gpu_check import Plan

PRETRAIN_CYCLE = ("mlm", "mrfr", "mrc_kl", "itm")  # bench/pretrain.py's default task cycle


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def budgeted(step, device, *, budget_s: float, min_steps: int, max_steps: int, round_size: int = 1) -> list[float]:
    """Call ``step(i)`` in rounds of ``round_size`` until ``budget_s`` has passed (at least
    ``min_steps``, at most ``max_steps`` calls, both rounded up to whole rounds) -> seconds per call."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_steps and (len(times) < min_steps or time.perf_counter() - start < budget_s):
        for _ in range(round_size):
            sync(device)
            t = time.perf_counter()
            step(len(times))
            sync(device)
            times.append(time.perf_counter() - t)
    return times


def peak_memory_mb(device) -> float:
    """Peak allocated CUDA memory since the last reset, or this process's peak RSS on the CPU."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def engine_settings(device, precision: str, zero_stage: int, total_steps: int):
    """The stage's engine settings (params.yaml's pretraining optimizer) for a timed run."""
    from pipeline.training.engine import EngineSettings

    return EngineSettings(device=device, precision=precision, world_size=1, zero_stage=zero_stage, grad_accum=1,
                          grad_clip=2.0, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=10,
                          total_steps=total_steps)


def make_batch(task: str, plan: Plan, vocab: int, g, *, batch: int | None = None, regions: int | None = None,
               txt_len: int | None = None) -> dict:
    """bench/common.py's synthetic batch of ``task`` at this plan's shape (overridable)."""
    from bench.common import synthetic_batch

    return synthetic_batch(task, batch=batch or plan.batch, txt_len=txt_len or plan.txt_len,
                           regions=regions or plan.regions, vocab=vocab, img_dim=plan.img_dim, classes=plan.classes,
                           g=g)



def profile_steps(step, n: int, device, out: Path) -> str:
    """Run ``step(i)`` ``n`` times under torch.profiler; write its operator table to ``out`` -> the path.

    The table (top 40 operators by self device time on a GPU, self CPU time on the CPU) says where
    a step's time goes, so one GPU slot also yields what the next change should target.
    """
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        for i in range(n):
            step(i)
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# {n} steps, sorted by {key}\n" + prof.key_averages().table(sort_by=key, row_limit=40) + "\n")
    return str(out)


def pretraining_setup(plan: Plan, device, precision: str, *, dropout: float):
    """The plan's preset of ``UniterForPretraining`` from seed 0, two distinct batches per task of
    the cycle already on the device (the engine is timed, not host copies), and the model FLOPs of
    one step (mean over the cycle) -> (model, batches, flops)."""
    import torch

    from bench.common import flops_per_step
    from model.config import UniterConfig
    from model.pretraining import UniterForPretraining
    from pipeline.training.engine import cast_batch

    cfg = UniterConfig.from_preset(plan.preset, dropout=dropout)
    torch.manual_seed(0)
    model = UniterForPretraining(cfg, img_dim=plan.img_dim, num_classes=plan.classes, wra_weight=0.1)
    g = torch.Generator().manual_seed(0)
    cycle = len(PRETRAIN_CYCLE)
    batches = [cast_batch(make_batch(PRETRAIN_CYCLE[i % cycle], plan, cfg.vocab_size, g), device, precision)
               for i in range(2 * cycle)]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    flops = flops_per_step(copy.deepcopy(model).to(device).to(dtype), batches[:cycle], lambda b: b)
    return model, batches, flops


def pretrain(plan: Plan, device, precision: str, zero_stage: int, peak_tflops: float,
             profile_dir: Path | None = None) -> dict:
    """Section 2 -> tokens/s, TFLOP/s and MFU of pretraining steps through the stage's engine
    (+ with ``profile_dir``, an operator table of one more task cycle: ``pretrain_profile.txt``)."""
    from bench.common import EngineLoop
    from pipeline.training.loop import batch_units

    model, batches, flops = pretraining_setup(plan, device, precision, dropout=0.1)
    loop = EngineLoop(model, engine_settings(device, precision, zero_stage, 10 * plan.max_steps), lambda b: b)
    for b in batches[: len(PRETRAIN_CYCLE)]:  # warm-up: one step of each task
        loop.step(b)
    reset_peak(device)
    times = budgeted(lambda i: loop.step(batches[i % len(batches)]), device, budget_s=plan.budget_s["pretrain"],
                     min_steps=plan.min_steps, max_steps=plan.max_steps, round_size=len(PRETRAIN_CYCLE))
    seconds = sum(times)
    # whole task cycles: the mean FLOPs per step over the cycle times the steps is the work done
    tokens = sum(batch_units(batches[i % len(batches)]) for i in range(len(times)))
    tflops = flops * len(times) / seconds / 1e12
    profiled = None if profile_dir is None else profile_steps(
        lambda i: loop.step(batches[i % len(batches)]), len(PRETRAIN_CYCLE), device,
        profile_dir / "pretrain_profile.txt")
    del loop
    return {"profile": profiled, "preset": plan.preset, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "precision": precision, "zero_stage": zero_stage, "batch": plan.batch, "max_txt_len": plan.txt_len,
            "max_regions": plan.regions, "tasks": list(PRETRAIN_CYCLE), "steps": len(times), "seconds": seconds,
            "step_s": seconds / len(times), "tokens_per_s": tokens / seconds, "gflop_per_step": flops / 1e9,
            "tflops": tflops, "peak_tflops": peak_tflops, "mfu": tflops / peak_tflops,
            "peak_memory_mb": peak_memory_mb(device)}


def overflow_ab(plan: Plan, device, zero_stage: int, peak_tflops: float) -> dict:
    """Section 3 -> step time of the stage's bf16 engine (DeepSpeed's per-gradient overflow pass
    dropped) and of the same engine with the pass kept, in alternating rounds; their ratio.

    Always bf16 (the pass exists only in DeepSpeed's bf16 ZeRO-1/2 optimizer), on the CPU too in a
    dry run, where the figures only show that both arms run.
    """
    import statistics

    from bench.common import EngineLoop

    # no dropout: both arms compute the same losses on the same batches
    model, batches, flops = pretraining_setup(plan, device, "bf16", dropout=0.0)
    cycle = len(PRETRAIN_CYCLE)
    settings = engine_settings(device, "bf16", zero_stage, 10 * plan.max_steps)
    arms = {"norm_only": EngineLoop(copy.deepcopy(model), settings, lambda b: b),
            "deepspeed_pass": EngineLoop(copy.deepcopy(model), settings, lambda b: b)}
    optimizers = {name: arm.engine.optimizer for name, arm in arms.items()}
    dropped = "has_overflow" in vars(optimizers["norm_only"])  # the instance override of the stage's engine
    vars(optimizers["deepspeed_pass"]).pop("has_overflow", None)  # DeepSpeed's own method again
    times: dict[str, list[float]] = {name: [] for name in arms}
    losses: dict[str, list[float]] = {name: [] for name in arms}
    start, rounds = time.perf_counter(), 0
    # a warm-up cycle each (round 0, untimed), then rounds of one cycle each, the order alternating
    # (AB, BA, ...), until the budget or max_steps timed steps an arm; at least 2 timed rounds
    while rounds < 3 or (time.perf_counter() - start < plan.budget_s["overflow_ab"]
                         and len(times["norm_only"]) < plan.max_steps):
        order = list(arms) if rounds % 2 == 0 else list(arms)[::-1]
        for name in order:
            arm, done = arms[name], len(losses[name])
            for i in range(done, done + cycle):
                sync(device)
                t = time.perf_counter()
                losses[name].append(arm.step(batches[i % len(batches)]))
                sync(device)
                if rounds > 0:
                    times[name].append(time.perf_counter() - t)
        rounds += 1
    med = {name: statistics.median(t) for name, t in times.items()}
    checked = bool(getattr(optimizers["norm_only"], "check_grad_overflow", False))
    out = {"precision": "bf16", "zero_stage": zero_stage, "check_grad_overflow": checked,
           "pass_dropped_by_default": dropped, "steps_each": len(times["norm_only"]),
           "gflop_per_step": flops / 1e9,
           "max_loss_diff": max(abs(a - b) for a, b in zip(losses["norm_only"], losses["deepspeed_pass"]))}
    for name in arms:
        out[name] = {"step_s": med[name], "mfu": flops / med[name] / 1e12 / peak_tflops}
    out["pass_over_norm_only"] = med["deepspeed_pass"] / med["norm_only"]
    return out
