"""What the machine can compute fast, for choices that depend on it (precision on the CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

# CPU flags (Linux /proc/cpuinfo) of native bf16 dot products: AVX-512 BF16 and AMX's bf16 tiles
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The first processor's flags in ``cpuinfo``; None where the file is missing (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def cpu_has_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bf16 matmuls and convolutions natively (AVX-512 BF16 or AMX).

    oneDNN's own check is not enough: it also says yes on AVX-512 CPUs without BF16 (Intel Xeons
    of family 6 model 106, for one), where bf16 runs in a slower emulated path (a 2048×384 @
    384×1536 matmul: 62 GFLOP/s in bf16 autocast against 150 in fp32). So where the CPU's flags are
    readable they must name a native bf16 instruction too; elsewhere oneDNN decides alone."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    flags = cpu_flags(cpuinfo)
    return flags is None or bool(flags & NATIVE_BF16_FLAGS)
