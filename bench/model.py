"""Benchmark: forward + backward throughput of UniterForPretraining (tokens/s, and MFU on a GPU).

    .venv/bin/python bench/model.py [--threads 1]         # CPU: small and base, fp32
    .venv/bin/python bench/model.py --device cuda         # GPU: base in bf16, MFU vs the device peak
    .venv/bin/python bench/model.py --device cuda --presets base large --batch 256 --compile

A synthetic batch of B examples with Lt text tokens and Li regions (all real, 2048-d features,
15% of text masked) runs the MLM task (``--task``) forward and backward, no optimizer step;
``--warmup`` untimed steps, then ``--steps`` timed ones. Tokens = B * (Lt + Li) per step.

Model FLOPs per step (the usual 6 * params * tokens accounting, counted from the config): every
encoder matmul (QKV, output, FFN) 6 * 12 H^2 per token and layer (with FFN = 4H; the actual
intermediate size is used), attention scores and values 12 * L * H per token and layer, the image
feature projection 6 * D * H per region, and the task head on its positions (MLM: transform H^2
plus decoder V * H per masked token). MFU = model FLOPs / step time / peak dense bf16 FLOPs of
the device (table below, or ``--peak-tflops``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.config import UniterConfig
from model.pretraining import UniterForPretraining

# dense bf16 tensor-core peak (TFLOPs, no sparsity), matched by substring of the device name
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,  # SXM / HBM3 boards
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
}


def peak_tflops(device_name: str) -> float | None:
    for key, value in PEAK_BF16_TFLOPS.items():  # ordered: "H100 PCIe" is tried before "H100"
        if key in device_name:
            return value
    return None


def make_batch(cfg: UniterConfig, b: int, lt: int, li: int, img_dim: int, num_classes: int, device) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, cfg.vocab_size, (b, lt), generator=gen)
    labels = torch.full((b, lt), -100)
    masked = torch.rand(b, lt, generator=gen) < 0.15
    masked[:, 1] = True
    labels[masked] = ids[masked]
    ids[masked] = 103
    batch = {
        "input_ids": ids,
        "txt_mask": torch.ones(b, lt, dtype=torch.bool),
        "img_feat": torch.randn(b, li, img_dim, generator=gen),
        "img_pos": torch.rand(b, li, 7, generator=gen),
        "img_mask": torch.ones(b, li, dtype=torch.bool),
        "txt_labels": labels,
        "img_masked": torch.rand(b, li, generator=gen) < 0.15,
        "img_soft_labels": torch.softmax(torch.randn(b, li, num_classes, generator=gen), -1),
        "itm_targets": torch.randint(0, 2, (b,), generator=gen),
    }
    batch["img_masked"][:, 0] = True
    batch["img_feat_target"] = batch["img_feat"].clone()
    return {k: v.to(device) for k, v in batch.items()}


def train_flops(cfg: UniterConfig, batch: dict, img_dim: int, task: str) -> float:
    b, lt = batch["input_ids"].shape
    li = batch["img_feat"].shape[1]
    h, inter, seq = cfg.hidden_size, cfg.intermediate_size, lt + li
    tokens = b * seq
    per_token_layer = 2 * (4 * h * h + 2 * h * inter) + 2 * 2 * seq * h  # matmuls + QK^T and AV (forward)
    flops = 3 * cfg.num_layers * per_token_layer * tokens  # backward = 2 x forward
    flops += 3 * 2 * img_dim * h * b * li
    if task == "mlm":
        flops += 3 * 2 * (h * h + cfg.vocab_size * h) * int((batch["txt_labels"] != -100).sum())
    return float(flops)


def bench_preset(preset: str, args, device) -> None:
    cfg = UniterConfig.from_preset(preset, dropout=0.0)
    torch.manual_seed(0)
    model = UniterForPretraining(cfg, img_dim=args.img_dim, num_classes=args.num_classes).to(device)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = model.to(dtype)
    batch = make_batch(cfg, args.batch, args.txt_len, args.img_len, args.img_dim, args.num_classes, device)
    step_fn = torch.compile(model) if args.compile else model

    def step():
        out = step_fn(batch, args.task)
        out.loss.backward()
        model.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.batch * (args.txt_len + args.img_len)
    flops = train_flops(cfg, batch, args.img_dim, args.task)
    line = (f"{preset:6s} {str(dtype).removeprefix('torch.'):8s} {tokens / seconds:12,.0f} tokens/s  "
            f"{seconds * 1e3:9.1f} ms/step  {flops / seconds / 1e9:10.1f} GFLOP/s")  # fmt: skip
    if device.type == "cuda":
        peak = args.peak_tflops or peak_tflops(torch.cuda.get_device_name(device))
        line += (
            f"  MFU {flops / seconds / (peak * 1e12):.1%} of {peak:.0f} TFLOPs" if peak else "  MFU n/a (unknown peak)"
        )
    print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument(
        "--presets",
        nargs="+",
        default=None,
        choices=["tiny", "small", "base", "large"],
        help="default: small base on CPU, base on GPU",
    )
    ap.add_argument("--batch", type=int, default=None, help="examples per step (default 8 on CPU, 256 on GPU)")
    ap.add_argument("--txt-len", type=int, default=None, help="Lt (default 24 on CPU, 40 on GPU)")
    ap.add_argument("--img-len", type=int, default=36, help="Li")
    ap.add_argument("--img-dim", type=int, default=2048)
    ap.add_argument("--num-classes", type=int, default=1601)
    ap.add_argument("--task", default="mlm", choices=["mlm", "mrfr", "mrc", "mrc_kl", "itm"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 3 on CPU, 20 on GPU)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 1 on CPU, 5 on GPU)")
    ap.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help="auto: bf16 on GPU, fp32 on CPU")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model first")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="override the device peak (bf16 dense)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("bench/model.py: --device cuda given but torch.cuda.is_available() is False")
    args.presets = args.presets or (["base"] if gpu else ["small", "base"])
    args.batch = args.batch or (256 if gpu else 8)
    args.txt_len = args.txt_len or (40 if gpu else 24)
    args.steps = args.steps or (20 if gpu else 3)
    args.warmup = args.warmup if args.warmup is not None else (5 if gpu else 1)
    args.bf16 = args.dtype == "bf16" or (args.dtype == "auto" and gpu)
    where = torch.cuda.get_device_name(device) if gpu else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}: task {args.task}, batch {args.batch} x (Lt {args.txt_len} + Li {args.img_len}), "
          f"D={args.img_dim}, {args.steps} timed steps after {args.warmup} warmup", flush=True)  # fmt: skip
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    for preset in args.presets:
        bench_preset(preset, args, device)


if __name__ == "__main__":
    main()
