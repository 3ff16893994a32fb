"""pipeline.common.hardware: `precision: auto` picks bf16 autocast only on native bf16 CPUs."""

from __future__ import annotations

import pytest
import torch

from pipeline.common import hardware

ICE_LAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


@pytest.fixture
def onednn_says(monkeypatch):
    def set_to(value: bool) -> None:
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: value)
    return set_to


@pytest.mark.parametrize("cpuinfo, native", [(ICE_LAKE, False), (SAPPHIRE_RAPIDS, True), (ZEN4, True)])
def test_the_cpu_flags_must_name_native_bf16(tmp_path, onednn_says, cpuinfo, native):
    onednn_says(True)  # oneDNN says yes on AVX-512 without BF16 too
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert hardware.cpu_has_bf16(path) is native


def test_onednn_no_wins_and_it_decides_alone_without_cpuinfo(tmp_path, onednn_says):
    path = tmp_path / "cpuinfo"
    path.write_text(SAPPHIRE_RAPIDS)
    onednn_says(False)
    assert hardware.cpu_has_bf16(path) is False
    onednn_says(True)
    assert hardware.cpu_has_bf16(tmp_path / "missing") is True
    assert hardware.cpu_flags(tmp_path / "missing") is None
