"""Benchmark: one CPU pretraining step at the stage's shape, by thread count, and where its time goes.

    .venv/bin/python bench/cpu_step.py                    # 1 and 2 threads, the stage's precision
    .venv/bin/python bench/cpu_step.py --profile          # + torch.profiler's operator table (1st thread count)
    .venv/bin/python bench/cpu_step.py --threads 1 --compile   # torch.compile (inductor) of the encoder

A step is what a pretraining step costs without the stage around it: forward of ``UniterForPretraining``
(params.yaml ``model.preset``) under the precision the stage resolves on this CPU (bf16 autocast with
native bf16, else fp32; ``--precision``), ``loss.backward()``, a fused torch AdamW step. Batches are
bench/common.py's synthetic ones at the mini world's shape (``--batch`` examples of <= ``--txt-len``
words + <= ``--regions`` regions of the mini detector's 512-d features and 31 classes), the tasks of
``--tasks`` cycled (default: params.yaml's ``pretrain.mix_ratio`` as a cycle, 2:1:1:2 of mlm, mrfr,
mrc_kl, itm today).

Per thread count: the median over ``--rounds`` rounds of the mean step time over one task cycle
(after a warm-up cycle), the model FLOPs of a step (torch's FlopCounterMode, mean over the cycle:
the first pass over the batches, whose time the header gives, with ``--compile`` the compiling)
and their rate, and the speed-up over the first thread count. With ``--profile`` the operator
table of one more cycle, and the matrix products' share of the CPU time (``aten::mm``, ``addmm``,
``bmm``) with the FLOP rate inside them that share implies. The latest figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# first: a stage process's OpenMP wait and malloc settings, before torch loads
from bench.common import MINI_FEATURE_DIM, MINI_NUM_CLASSES, flops_per_step, synthetic_batch  # noqa: E402  isort: skip
import torch  # noqa: E402  isort: skip

from model.config import UniterConfig  # noqa: E402
from model.pretraining import UniterForPretraining  # noqa: E402
from pipeline.params.parser import load_params  # noqa: E402
from pipeline.training.engine import autocast_forward, resolve_precision  # noqa: E402
from pipeline.training.loop import batch_units  # noqa: E402

MATRIX_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def mix_cycle(mix: Mapping[str, float]) -> str:
    """A task cycle in the proportions of ``mix`` (weights rounded, a positive one to at least 1),
    round-robin: {mlm: 2, mrfr: 1, mrc: 0, mrc_kl: 1, itm: 2} -> "mlm,mrfr,mrc_kl,itm,mlm,itm"."""
    left = {task: max(1, round(w)) for task, w in mix.items() if w > 0}
    cycle = []
    while left:
        cycle += list(left)
        left = {task: n - 1 for task, n in left.items() if n > 1}
    return ",".join(cycle)


def build(args: argparse.Namespace, preset: str):
    """The model (seed 0), its stepping function and the cycle's batches -> (model, step, batches)."""
    cfg = UniterConfig.from_preset(preset, dropout=0.1)
    torch.manual_seed(0)
    model = UniterForPretraining(cfg, img_dim=MINI_FEATURE_DIM, num_classes=MINI_NUM_CLASSES, wra_weight=0.1)
    g = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(task, batch=args.batch, txt_len=args.txt_len, regions=args.regions,
                               vocab=cfg.vocab_size, img_dim=MINI_FEATURE_DIM, classes=MINI_NUM_CLASSES, g=g)
               for task in args.tasks.split(",")]
    if args.compile:
        model.uniter = torch.compile(model.uniter, dynamic=True)
    autocast_forward(model, args.precision, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)

    def step(batch: dict) -> None:
        model(batch, batch["task"]).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, batches


def cycle_s(step, batches: list[dict]) -> float:
    """Mean seconds of one step over one pass through ``batches``."""
    start = time.perf_counter()
    for b in batches:
        step(b)
    return (time.perf_counter() - start) / len(batches)


def matrix_share(prof) -> float:
    """The matrix products' share of the profiled self CPU time."""
    rows = prof.key_averages()
    total = sum(r.self_cpu_time_total for r in rows)
    return sum(r.self_cpu_time_total for r in rows if r.key in MATRIX_OPS) / total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--preset", default=None, help="model preset (default: params.yaml model.preset)")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="resolved as the stage does on this CPU (auto: bf16 autocast with native bf16)")
    ap.add_argument("--batch", type=int, default=32, help="examples per batch (32 x 34 ~ the stage's 1,024 units)")
    ap.add_argument("--txt-len", type=int, default=18)
    ap.add_argument("--regions", type=int, default=16)
    ap.add_argument("--tasks", default=None, help="one batch per task, cycled (default: params.yaml "
                    "pretrain.mix_ratio as a cycle, mix_cycle)")
    ap.add_argument("--rounds", type=int, default=3, help="timed cycles per thread count, after a warm-up cycle")
    ap.add_argument("--profile", action="store_true", help="operator table of one cycle at the first thread count")
    ap.add_argument("--compile", action="store_true", help="torch.compile(dynamic=True) the encoder first")
    args = ap.parse_args(argv)
    if min(args.threads) < 1 or args.rounds < 1 or args.batch < 1:
        ap.error("--threads, --rounds and --batch must be >= 1")
    params = load_params(ROOT / "params.yaml", [], check_paths=False)
    preset = args.preset or params.model.preset
    args.tasks = args.tasks or mix_cycle(params.pretrain.mix_ratio)
    args.precision = resolve_precision(args.precision, torch.device("cpu"))
    model, step, batches = build(args, preset)
    started = time.perf_counter()
    flops = flops_per_step(model, batches, lambda b: b)  # the first forwards: with --compile, the compiling
    first_pass = time.perf_counter() - started
    units = statistics.mean(batch_units(b) for b in batches)
    print(f"preset {preset}, {args.precision}{', torch.compile' if args.compile else ''}, batch {args.batch} x "
          f"(<= {args.txt_len} words + <= {args.regions} regions; {units:.0f} real units), tasks {args.tasks}, "
          f"fused AdamW; {flops / 1e9:.1f} GFLOP a step; first pass (FLOP count) {first_pass:.1f} s")
    print(f"{'threads':>7} {'warm-up s':>9} {'step s':>8} {'GFLOP/s':>8} {'speed-up':>8}")
    step_s = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        warm = cycle_s(step, batches) * len(batches)
        step_s.append(statistics.median(cycle_s(step, batches) for _ in range(args.rounds)))
        t = step_s[-1]
        print(f"{threads:>7} {warm:9.2f} {t:8.3f} {flops / t / 1e9:8.1f} {step_s[0] / t:8.2f}")
    if args.profile:
        from torch.profiler import profile

        torch.set_num_threads(args.threads[0])
        with profile() as prof:
            cycle_s(step, batches)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        share = matrix_share(prof)  # of the first thread count's step, timed above without the profiler
        print(f"matrix products ({', '.join(MATRIX_OPS)}): {100 * share:.1f}% of the CPU time, so ~"
              f"{flops / (share * step_s[0]) / 1e9:.0f} GFLOP/s inside them on {args.threads[0]} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
