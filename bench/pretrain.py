"""Benchmark: the DeepSpeed engine vs a plain PyTorch loop, and pretraining MFU on a GPU.

    .venv/bin/python bench/pretrain.py                       # CPU: engine overhead (DESIGN.md §12: <= 10%)
    .venv/bin/python bench/pretrain.py --device cuda         # GPU: UNITER-base bf16 MFU (target >= 40%)

Both loops train copies of the same ``UniterForPretraining`` (same initial weights) on the same
synthetic token-bucket batches (contracts §6 keys; ``--tasks`` cycled, one task per step; two
distinct batches per task, placed on the device beforehand), with
the same AdamW(0.9, 0.98), weight decay 0.01 without biases/norms, warmup + linear decay and
gradient clipping:

- plain:     forward, ``loss.backward()``, ``clip_grad_norm_``, ``optimizer.step()``, scheduler;
- deepspeed: ``pipeline.training.engine.initialize`` (the stage's engine: ZeRO ``--zero-stage``,
             fp32 on CPU / bf16 on GPU), ``engine.backward`` + ``engine.step``.

They run in alternating rounds of ``--steps`` steps (ABAB...) after one warm-up round each, so
load from other processes hits both alike; the figure per loop is its median step time over all
rounds. MFU = model FLOPs per step (counted with torch's FlopCounterMode on one forward+backward
per task: matmuls and attention) / median step time / ``--peak-tflops`` (H200 dense bf16: 989).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch

from model.config import UniterConfig
from model.pretraining import UniterForPretraining
from pipeline.training.engine import EngineSettings, cast_batch, initialize, param_groups, warmup_linear_decay
from pipeline.training.launch import process_group


def synthetic_batch(task: str, *, batch: int, txt_len: int, regions: int, vocab: int, img_dim: int, classes: int,
                    g: torch.Generator) -> dict:
    """One batch in the contracts §6 layout, lengths varying a little like token buckets."""
    lt = torch.randint(max(3, txt_len - 6), txt_len + 1, (batch,), generator=g)
    li = torch.randint(max(1, regions - 10), regions + 1, (batch,), generator=g)
    Lt, Li = int(lt.max()), int(li.max())
    txt_mask = torch.arange(Lt)[None] < lt[:, None]
    img_mask = torch.arange(Li)[None] < li[:, None]
    ids = torch.randint(1000, vocab, (batch, Lt), generator=g) * txt_mask
    soft = torch.rand(batch, Li, classes, generator=g)
    out = {"task": task, "input_ids": ids, "txt_mask": txt_mask, "img_mask": img_mask,
           "img_feat": torch.randn(batch, Li, img_dim, generator=g).relu(),
           "img_pos": torch.rand(batch, Li, 7, generator=g)}
    if task == "mlm":
        picked = (torch.rand(batch, Lt, generator=g) < 0.15) & txt_mask
        picked[:, 1] = True
        out["txt_labels"] = torch.where(picked, ids, torch.full_like(ids, -100))
        out["input_ids"] = torch.where(picked, torch.full_like(ids, 103), ids)
    elif task == "itm":
        out["itm_targets"] = torch.randint(0, 2, (batch,), generator=g)
    else:
        masked = (torch.rand(batch, Li, generator=g) < 0.15) & img_mask
        masked[:, 0] = True
        out.update(img_masked=masked, img_feat_target=out["img_feat"].clone(),
                   img_soft_labels=soft / soft.sum(-1, keepdim=True))
    return out


def flops_per_step(model: torch.nn.Module, batches: list[dict], prepare) -> float:
    """Mean FLOPs of one forward + backward over ``batches`` (FlopCounterMode; no optimizer)."""
    from torch.utils.flop_counter import FlopCounterMode

    total = 0
    for b in batches:
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(prepare(b), b["task"])
            out.loss.backward()
        model.zero_grad(set_to_none=True)
        total += counter.get_total_flops()
    return total / len(batches)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PlainLoop:
    def __init__(self, model, s: EngineSettings, prepare) -> None:
        self.model, self.s, self.prepare = model.to(s.device), s, prepare
        if s.precision == "bf16":
            self.model = self.model.to(torch.bfloat16)
        self.opt = torch.optim.AdamW(param_groups(self.model, s.weight_decay), lr=s.lr, betas=s.betas, eps=1e-6,
                                     fused=s.device.type == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup_linear_decay(s.warmup_steps, s.total_steps))

    def step(self, batch: dict) -> float:
        out = self.model(self.prepare(batch), batch["task"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())


class EngineLoop:
    def __init__(self, model, s: EngineSettings, prepare) -> None:
        self.engine, self.prepare = initialize(model, s), prepare

    def step(self, batch: dict) -> float:
        out = self.engine(self.prepare(batch), batch["task"])
        self.engine.backward(out.loss)
        self.engine.step()
        return float(out.loss.detach())


def timed_round(loop, batches: list[dict], device: torch.device) -> list[float]:
    times = []
    for b in batches:
        sync(device)
        t = time.perf_counter()
        loop.step(b)
        sync(device)
        times.append(time.perf_counter() - t)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preset", default=None, help="model preset (default: small on CPU, base on GPU)")
    ap.add_argument("--batch", type=int, default=None, help="examples per batch (default 8 CPU, 128 GPU)")
    ap.add_argument("--txt-len", type=int, default=40)
    ap.add_argument("--regions", type=int, default=None, help="max regions per example (default 36 CPU, 100 GPU)")
    ap.add_argument("--img-dim", type=int, default=2048)
    ap.add_argument("--classes", type=int, default=1601)
    ap.add_argument("--tasks", default="mlm,mrfr,mrc_kl,itm", help="cycled, one per step")
    ap.add_argument("--steps", type=int, default=None, help="steps per round (default 4 CPU, 10 GPU)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--zero-stage", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="device peak dense bf16 TFLOP/s (H200: 989)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    gpu = args.device == "cuda"
    os.environ.setdefault("DS_ACCELERATOR", args.device)  # read when deepspeed is first imported
    preset = args.preset or ("base" if gpu else "small")
    batch = args.batch or (128 if gpu else 8)
    regions = args.regions or (100 if gpu else 36)
    steps = args.steps or (10 if gpu else 4)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    precision = "bf16" if gpu else "fp32"
    tasks = args.tasks.split(",")

    cfg = UniterConfig.from_preset(preset, dropout=0.1)
    torch.manual_seed(0)
    base = UniterForPretraining(cfg, img_dim=args.img_dim, num_classes=args.classes, wra_weight=0.1)
    g = torch.Generator().manual_seed(0)
    n_batches = steps * (args.rounds + 1)
    # a few distinct batches, cycled, already on the device: the loops are timed, not host copies
    distinct = [cast_batch(synthetic_batch(tasks[i % len(tasks)], batch=batch, txt_len=args.txt_len,
                                           regions=regions, vocab=cfg.vocab_size, img_dim=args.img_dim,
                                           classes=args.classes, g=g), device, precision)
                for i in range(2 * len(tasks))]
    batches = [distinct[i % len(distinct)] for i in range(n_batches)]
    units = [int(b["txt_mask"].sum() + b["img_mask"].sum()) for b in batches]

    def prepare(b: dict) -> dict:
        return b

    s = EngineSettings(device=device, precision=precision, world_size=1, zero_stage=args.zero_stage, grad_accum=1,
                       grad_clip=2.0, lr=1e-4, betas=(0.9, 0.98), weight_decay=0.01, warmup_steps=10,
                       total_steps=10 * n_batches)
    print(f"device {device} ({torch.cuda.get_device_name(device) if gpu else f'{torch.get_num_threads()} threads'}), "
          f"{precision}, preset {preset} ({sum(p.numel() for p in base.parameters()) / 1e6:.1f}M params), "
          f"batch {batch} x (<= {args.txt_len} text + <= {regions} regions), tasks {tasks}, ZeRO-{args.zero_stage}")
    with process_group(device.type):
        plain = PlainLoop(copy.deepcopy(base), s, prepare)
        engine = EngineLoop(copy.deepcopy(base), s, prepare)
        fl = flops_per_step(copy.deepcopy(base).to(device).to(torch.bfloat16 if gpu else torch.float32),
                            batches[: len(tasks)], prepare)
        times: dict[str, list[float]] = {"plain": [], "deepspeed": []}
        for r in range(args.rounds + 1):
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


if __name__ == "__main__":
    sys.exit(main())
