"""What the machine can compute fast, for choices that depend on it (precision on the CPU)."""

from __future__ import annotations

import torch


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls and convolutions natively (AVX-512 BF16 or AMX), as
    oneDNN reports it. Without, bf16 is emulated and ~60x slower than fp32 (docs/experiments.md)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
