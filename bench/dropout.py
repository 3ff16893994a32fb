"""Benchmark: what dropout costs a CPU training step, by mask generator, side by side in one run.

    .venv/bin/python bench/dropout.py                 # params.yaml's model preset, its precision
    .venv/bin/python bench/dropout.py --rounds 8 --steps 10
    .venv/bin/python bench/dropout.py --attention     # attention alone: SDPA vs explicit, by dtype

One model (params.yaml ``model.preset``, UNITER's dropout 0.1 in hidden and attention layers) and
the same synthetic pretraining batches (``bench/pretrain.py``'s layout: MLM, MRFR, MRC-kl, ITM
cycled; rows of <= ``--txt-len`` words + <= ``--regions`` regions, about ``pretrain.batch_tokens``
units a batch) run forward + ``loss.backward()`` (no optimizer: the part dropout touches) with:

- ``torch``:  torch's own dropout: ``nn.Dropout`` (``bernoulli_``, one uniform double per element)
              and ``F.scaled_dot_product_attention(dropout_p=0.1)`` (on the CPU its unfused math path);
- ``int32``:  the model's explicit attention, with the masks of f8cfd22 to 3ad4b77: one int32
              ``random_()`` of torch's generator per element (31 bits), applied by ``masked_fill``;
- ``zeroing``: the masks of :func:`model.dropout.drop_mask` applied by ``masked_fill`` (3ad4b77);
- ``model``:  the model's :mod:`model.dropout` (16-bit draws of a PCG64 stream seeded from torch's
              generator, multiplied in as a 1/0 tensor of the input's dtype): what the stages run;
- ``none``:   dropout 0 everywhere (the same attention path as ``model``: explicit under a bf16
              backward, SDPA's fused kernel in fp32): the floor no mask generator can beat.

Rounds rotate the variants after one warm-up round each, so background load hits all alike; the
table shows each variant's median step time over all timed steps and its ratio to ``torch``.
Precision as the stages resolve ``precision: auto`` (bf16 autocast on a CPU with native bf16).

``--attention``: the attention op alone, forward + backward (and forward without gradients), for
q, k, v [B, 12 heads, L, 32] in fp32 and bf16: SDPA's fused kernel,
:func:`model.dropout.explicit_attention`, SDPA with dropout 0.1 (its math path), the explicit one with
the model's mask, and the same with the key mask applied by ``masked_fill`` (before 2026-12-05
afternoon); and one mask from ``bernoulli_``, ``int32``, :func:`model.dropout.drop_mask` and
:func:`model.dropout.keep_multiplier`; mean ms over ``--steps`` x ``--rounds`` calls after 3
warm-up calls.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.pretrain import MINI_FEATURE_DIM, MINI_NUM_CLASSES, synthetic_batch  # isort: skip  (sets the OpenMP wait)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import model.dropout  # noqa: E402
import model.layers  # noqa: E402
from model.config import UniterConfig  # noqa: E402
from model.layers import set_dropout  # noqa: E402
from model.pretraining import UniterForPretraining  # noqa: E402
from pipeline.params.parser import load_params  # noqa: E402
from pipeline.training.engine import autocast_forward, resolve_precision  # noqa: E402
from pipeline.training.loop import batch_units  # noqa: E402

TASKS = ("mlm", "mrfr", "mrc_kl", "itm")


def _sdpa(q, k, v, attn_mask, dropout_p):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


def masked_fill_attention(q, k, v, attn_mask, dropout_p):
    """:func:`model.dropout.explicit_attention` before 2026-12-05 (afternoon): the scaled scores of
    masked keys set by an out-of-place ``masked_fill`` instead of an in-place 0 / -inf bias."""
    scores = (q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))).masked_fill(~attn_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return torch.matmul(model.dropout.dropout(probs, dropout_p, True), v)


def int32_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """The masks of ``int32``: one int32 ``random_()`` (31 random bits) of torch's generator per element."""
    return torch.empty(shape, dtype=torch.int32).random_() < round(p * 2**31)


class _ZeroScale(torch.autograd.Function):
    """The application of ``int32`` and ``zeroing``: the dropped elements zeroed by ``masked_fill``,
    then scaled; the same on the gradient; saves the bool mask."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, drop: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.masked_fill(drop, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (drop,) = ctx.saved_tensors
        return grad.masked_fill(drop, 0).mul_(ctx.scale), None, None


def _zeroing(mask_fn):
    def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        if not training or p == 0.0:
            return x
        return _ZeroScale.apply(x, mask_fn(x.shape, p), 1.0 / (1.0 - p))
    return dropout


@contextlib.contextmanager
def dropout_variant(name: str):
    """The model with variant ``name``'s dropout (see the module docstring; ``model`` and ``none``
    change nothing here)."""
    saved = model.dropout.dropout, model.layers.attention
    if name == "torch":
        model.dropout.dropout, model.layers.attention = F.dropout, _sdpa
    elif name == "int32":
        model.dropout.dropout = _zeroing(int32_mask)
    elif name == "zeroing":
        model.dropout.dropout = _zeroing(model.dropout.drop_mask)
    try:
        yield
    finally:
        model.dropout.dropout, model.layers.attention = saved


def model_and_batches(args: argparse.Namespace) -> tuple[torch.nn.Module, list[dict], str, str]:
    """params.yaml's pretraining model (seed 0, UNITER's dropout 0.1, training mode, the stages' CPU
    precision) and ``args.steps`` synthetic batches of ``args.batch`` rows, TASKS cycled; returns
    (model, batches, precision, preset). Shared with bench/malloc.py."""
    params = load_params(Path(__file__).resolve().parent.parent / "params.yaml")
    precision = resolve_precision("auto", torch.device("cpu"))
    cfg = UniterConfig.from_preset(params.model.preset, dropout=0.1)
    torch.manual_seed(0)
    net = UniterForPretraining(cfg, img_dim=MINI_FEATURE_DIM, num_classes=MINI_NUM_CLASSES, wra_weight=0.1)
    autocast_forward(net, precision, torch.device("cpu"))
    net.train()
    g = torch.Generator().manual_seed(0)
    batches = [synthetic_batch(TASKS[i % len(TASKS)], batch=args.batch, txt_len=args.txt_len, regions=args.regions,
                               vocab=cfg.vocab_size, img_dim=MINI_FEATURE_DIM, classes=MINI_NUM_CLASSES, g=g)
               for i in range(args.steps)]
    return net, batches, precision, params.model.preset


def step(net: torch.nn.Module, batch: dict) -> float:
    """One forward + backward; seconds."""
    t = time.perf_counter()
    out = net(batch, batch["task"])
    out.loss.backward()
    net.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def attention_table(reps: int) -> None:
    """Print the attention op's time per variant (see the module docstring)."""
    def timed(fn) -> float:
        for _ in range(3):
            fn()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        return 1e3 * (time.perf_counter() - t) / reps

    variants = {"SDPA fused": lambda q, k, v, m: _sdpa(q, k, v, m, 0.0),
                "explicit": lambda q, k, v, m: model.dropout.explicit_attention(q, k, v, m, 0.0),
                "SDPA p=0.1": lambda q, k, v, m: _sdpa(q, k, v, m, 0.1),
                "explicit p=0.1": lambda q, k, v, m: model.dropout.explicit_attention(q, k, v, m, 0.1),
                "masked_fill p=0.1": lambda q, k, v, m: masked_fill_attention(q, k, v, m, 0.1)}
    print(f"{'B x L':<9} {'dtype':<9} {'pass':<9}" + "".join(f"{n:>18}" for n in variants))
    for b, length in ((32, 32), (8, 128)):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(b, 12, length, 32, dtype=dtype, requires_grad=True) for _ in range(3))
            mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
            mask[..., length - 5:] = False
            row = [timed(lambda f=f: f(q, k, v, mask).sum().backward()) for f in variants.values()]
            print(f"{b}x{length:<6} {str(dtype)[6:]:<9} {'fwd+bwd':<9}" + "".join(f"{x:18.2f}" for x in row))
            with torch.no_grad():
                row = [timed(lambda f=f: f(q, k, v, mask)) for f in list(variants.values())[:2]]
            print(f"{b}x{length:<6} {str(dtype)[6:]:<9} {'fwd':<9}" + "".join(f"{x:18.2f}" for x in row))
    shape = (32, 12, 32, 32)  # one attention mask of the 32 x 32 case
    bern = timed(lambda: torch.empty(shape).bernoulli_(0.9))
    int32 = timed(lambda: int32_mask(shape, 0.1))
    ours = timed(lambda: model.dropout.drop_mask(shape, 0.1))
    keep = timed(lambda: model.dropout.keep_multiplier(shape, 0.1, torch.bfloat16))
    print(f"one mask of {torch.Size(shape).numel()} elements: bernoulli_ {bern:.2f} ms, int32 {int32:.2f} ms, "
          f"drop_mask {ours:.2f} ms, keep_multiplier (bf16) {keep:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="steps per round")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds after the warm-up")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--txt-len", type=int, default=16)
    ap.add_argument("--regions", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--attention", action="store_true", help="time the attention op alone instead")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.attention:
        attention_table(args.steps * args.rounds)
        return 0
    net, batches, precision, preset = model_and_batches(args)
    units = statistics.mean(batch_units(b) for b in batches)

    def run(name: str) -> list[float]:
        set_dropout(net, 0.0 if name == "none" else None)
        with dropout_variant(name):
            return [step(net, b) for b in batches]

    names = ["torch", "int32", "zeroing", "model", "none"]
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = run(name)
            if r > 0:  # round 0 warms up (allocator, kernels)
                times[name] += t
    print(f"preset {preset}, {precision}, {torch.get_num_threads()} threads, batch {args.batch} x "
          f"(<= {args.txt_len} words + <= {args.regions} regions, {units:.0f} real units), tasks {list(TASKS)}; "
          f"{args.rounds} rounds x {args.steps} steps")
    base = statistics.median(times["torch"])
    print(f"{'dropout':<8} {'median step ms':>15} {'/ torch':>8}")
    for name in names:
        med = statistics.median(times[name])
        print(f"{name:<8} {1e3 * med:15.1f} {med / base:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
