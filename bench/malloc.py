"""Benchmark: glibc's malloc defaults against the stages' settings (pipeline/common/malloc.py), side by side.

    .venv/bin/python bench/malloc.py                  # params.yaml's model, its precision, 2 threads
    .venv/bin/python bench/malloc.py --threads 1 --rounds 8

malloc's settings belong to a process, so two worker processes run the same training step,
identical but for them: ``kept`` as a stage runs (``keep_freed_memory``: freed blocks stay in the
heap), ``glibc`` with glibc's defaults (``UNITER_MALLOC=system``: blocks above the mmap threshold
are mapped per allocation and unmapped on free). Each builds params.yaml's pretraining model
(UNITER's dropout 0.1) with the same seed, the same synthetic batches (``bench/pretrain.py``'s
layout: MLM, MRFR, MRC-kl, ITM cycled) and the stage's fused AdamW; a step is forward,
``loss.backward()``, ``clip_grad_norm_``, the optimizer step and ``zero_grad(set_to_none=True)``,
as the stages' one-rank engine runs it. The parent starts a round of ``--steps`` steps in one worker,
then in the other (the order alternating, one worker at a time so each has the machine), after one
warm-up round each, and prints each worker's median step time, its ratio to ``glibc`` and its
minor page faults per step (``getrusage``: a page the kernel maps and zero-fills on first touch).
Both workers compute the same losses to the bit (checked per round): malloc moves memory, not arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKERS = {"glibc": {"UNITER_MALLOC": "system"}, "kept": {"UNITER_MALLOC": "keep"}}


def worker(args: argparse.Namespace) -> int:
    """Build the model and batches, then run ``--steps`` steps per line read from stdin; reply with JSON."""
    sys.path.insert(0, str(ROOT))
    from bench.dropout import model_and_batches  # bench.pretrain, imported by it, keeps freed memory or not

    import torch

    from pipeline.training.engine import param_groups

    torch.set_num_threads(args.threads)
    net, batches, precision, _ = model_and_batches(args)
    optim = torch.optim.AdamW(param_groups(net, 0.01), lr=1e-5, betas=(0.9, 0.98), eps=1e-6, fused=True)
    print(json.dumps({"ready": precision}), flush=True)
    for _ in sys.stdin:
        times, losses = [], []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for batch in batches:
            t = time.perf_counter()
            out = net(batch, batch["task"])
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 2.0)
            optim.step()
            optim.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t)
            losses.append(float(out.loss.detach()))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(json.dumps({"times": times, "losses": losses, "faults": faults}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds after the warm-up")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--txt-len", type=int, default=16)
    ap.add_argument("--regions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    argv = [sys.executable, __file__, "--steps", str(args.steps), "--batch", str(args.batch), "--txt-len",
            str(args.txt_len), "--regions", str(args.regions), "--threads", str(args.threads)]
    base = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    procs = {name: subprocess.Popen(argv + ["--worker", name], env={**base, **env}, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for name, env in WORKERS.items()}
    try:
        precision = {name: json.loads(p.stdout.readline())["ready"] for name, p in procs.items()}["kept"]
        times = {name: [] for name in procs}
        faults = {name: [] for name in procs}
        for r in range(args.rounds + 1):
            losses = {}
            for name in list(procs)[r % 2:] + list(procs)[:r % 2]:
                procs[name].stdin.write("go\n")
                procs[name].stdin.flush()
                got = json.loads(procs[name].stdout.readline())
                losses[name] = got["losses"]
                if r > 0:  # round 0 warms up (allocator, kernels, lazy init)
                    times[name] += got["times"]
                    faults[name].append(got["faults"] / args.steps)
            if losses["kept"] != losses["glibc"]:
                raise RuntimeError(f"round {r}: the workers' losses differ: {losses}")
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=60)
    print(f"{precision}, {args.threads} threads, batch {args.batch} x (<= {args.txt_len} words + <= {args.regions} "
          f"regions); {args.rounds} rounds x {args.steps} steps; losses equal to the bit in every round")
    ref = statistics.median(times["glibc"])
    print(f"{'malloc':<7} {'median step ms':>15} {'/ glibc':>8} {'page faults / step':>19}")
    for name in procs:
        med = statistics.median(times[name])
        print(f"{name:<7} {1e3 * med:15.1f} {med / ref:8.3f} {statistics.median(faults[name]):19.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
