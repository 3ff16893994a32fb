"""Dropout whose CPU masks come from a fast seeded bit stream, and attention that uses it.

Same semantics as ``torch.nn.Dropout`` (each element zeroed with probability p, independently; the
kept ones scaled by 1 / (1 - p); identity in eval mode or with p = 0), and governed by the same
random source: each mask takes one 62-bit seed from torch's default CPU generator, so
``torch.manual_seed`` and saved RNG states decide every mask. What differs is how a mask is drawn
and applied. torch's CPU ``bernoulli_`` draws one uniform double per element from mt19937 on one
thread (~15 ns an element); here the seed starts numpy's PCG64, whose raw 64-bit words give four
16-bit draws each, and an element is dropped when its draw is below ``round(p * 2**16)``: a drop
probability within 7.7e-6 of p (0.1 drops at 0.100006), at ~5x the speed of one int32 draw an
element. The mask is multiplied in as a 1/0 tensor of the input's dtype (:func:`keep_multiplier`),
a quarter of the cost of ``masked_fill``. :func:`attention` drops the attention probabilities with
it: ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` would leave its fused CPU kernel for
the unfused math path anyway, and that fused kernel's bf16 backward is slow. On other devices both
fall back to torch's own (fused) kernels. Why and measured effect: docs/decisions.md#dropout-masks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Dropout", "attention", "drop_mask", "dropout", "explicit_attention", "keep_multiplier"]

_BITS = 16  # each element compares one 16-bit draw (a quarter of a PCG64 word) with the threshold
_SEED_BOUND = 1 << 62  # a mask's seed is uniform in [0, 2**62), drawn from torch's default generator


# the bits of 1.0 in each floating dtype, so a kept-element multiplier is built by numpy in place
_ONE_BITS = {torch.bfloat16: (np.uint16, 0x3F80), torch.float16: (np.uint16, 0x3C00),
             torch.float32: (np.uint32, 0x3F80_0000), torch.float64: (np.uint64, 0x3FF0_0000_0000_0000)}


def _kept(shape: torch.Size | tuple[int, ...], p: float) -> np.ndarray:
    """bool [prod(shape)]: True where an element is kept (its 16-bit draw is at or above
    ``round(p * 2**16)``); takes one seed from torch's default CPU generator."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout mask: p must lie in [0, 1), got {p}")
    n = math.prod(shape)
    seed = int(torch.randint(_SEED_BOUND, (), dtype=torch.int64))
    draws = np.random.PCG64(seed).random_raw(-(-n // 4)).view(np.uint16)[:n]
    return draws >= np.uint16(min(round(p * 2**_BITS), 2**_BITS - 1))


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """bool tensor of ``shape``: True where an element is dropped, each with probability p in [0, 1).

    Consumes one draw of torch's default CPU generator (the seed) whatever the shape."""
    return torch.from_numpy(~_kept(shape, p)).view(tuple(shape)).to(device)


def keep_multiplier(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """CPU tensor of ``shape`` and ``dtype``: 1 where an element is kept, 0 where :func:`drop_mask`
    (drawn from the same generator state) drops it. Floating dtypes get their 1.0 bit pattern
    written by numpy, a quarter of the cost of converting a bool mask."""
    kept = _kept(shape, p)
    if dtype in _ONE_BITS:
        bits, one = _ONE_BITS[dtype]
        multiplier = torch.from_numpy(kept.astype(bits) * bits(one)).view(dtype)
    else:
        multiplier = torch.from_numpy(kept).to(dtype)
    return multiplier.view(tuple(shape))


class _KeepScale(torch.autograd.Function):
    """y = x * keep * ``scale`` (keep: 1 or 0 in x's dtype); the backward scales the gradient the same.

    Multiplying by an exact 1 or 0 gives the values that zeroing the dropped elements would (up to
    the sign of a zero, and NaN stays NaN, as in torch's own CPU dropout), with one vectorized pass
    where ``masked_fill`` takes four times as long (docs/decisions.md#dropout-masks)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return (x * keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return (grad * keep).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout(x, p, training)`` with the masks of :func:`drop_mask` on the CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return _KeepScale.apply(x, keep_multiplier(x.shape, p, x.dtype), 1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose CPU masks come from :func:`dropout` (same ``p``, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
              dropout_p: float) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p)`` for q, k, v [B, heads, L, d]
    and a bool ``attn_mask`` broadcastable to [B, heads, L, L] (True = may attend) -> [B, heads, L, d].

    On the CPU, with ``dropout_p > 0`` or a bf16 / fp16 backward to come, the probabilities are
    computed explicitly (softmax in at least fp32) and dropped with :func:`dropout`: SDPA would take
    its math path with a slower mask, or its fused kernel, whose bf16 backward is ~5x the explicit
    one on short sequences (docs/decisions.md#dropout-masks). Otherwise (inference, fp32 without dropout, GPUs)
    SDPA itself.
    """
    low_precision_backward = q.dtype in (torch.bfloat16, torch.float16) and torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad)
    if q.device.type != "cpu" or not (dropout_p > 0.0 or low_precision_backward):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    return explicit_attention(q, k, v, attn_mask, dropout_p)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """The output of :func:`attention`, [B, heads, L, d], as [B, L, heads * d]: each position's heads
    side by side, the layout the output projection expects."""
    b, heads, length, d = x.shape
    return x.transpose(1, 2).reshape(b, length, heads * d)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                       dropout_p: float) -> torch.Tensor:
    """softmax(q kᵀ / √d, masked) v with the probabilities dropped by :func:`dropout` (none when
    ``dropout_p`` is 0); shapes as :func:`attention`."""
    # in place on the matmul's fresh output (its backward needs only q and k)
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        # adding 0 keeps a score exactly and -inf masks it: masked_fill's values in one in-place pass,
        # and a backward with nothing to do (softmax's gradient is already 0 where a probability is)
        bias = torch.zeros(attn_mask.shape, dtype=scores.dtype, device=scores.device)
        scores = scores.add_(bias.masked_fill_(~attn_mask, float("-inf")))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
    return torch.matmul(dropout(probs, dropout_p, True), v)
