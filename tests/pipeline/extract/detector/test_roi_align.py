"""MatrixROIAlign against torchvision's roi_align (the independent reference): forward and backward."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import roi_align

from pipeline.extract.detector.roi_align import MatrixROIAlign, roi_align_matrix


def _rois(gen: torch.Generator, n_images: int, n: int, size: float) -> torch.Tensor:
    """Random boxes in input pixels, some reaching past the image and some degenerate."""
    xy = torch.rand(n, 2, generator=gen) * size * 1.2 - 0.1 * size
    wh = torch.rand(n, 2, generator=gen) * size * 0.8
    wh[: n // 8] = 0.0  # zero-size boxes: no samples with aligned=True
    batch = torch.randint(0, n_images, (n, 1), generator=gen).float()
    return torch.cat([batch, xy, xy + wh], dim=1)


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
@pytest.mark.parametrize("output_size", [(7, 7), (3, 5)])
def test_matches_torchvision_forward_and_backward(aligned, sampling_ratio, output_size):
    gen = torch.Generator().manual_seed(7)
    feats = torch.randn(3, 5, 12, 10, generator=gen, dtype=torch.float64)
    rois = _rois(gen, 3, 64, 192.0).double().requires_grad_(True)  # no gradient reaches them, as torchvision's
    scale = 1.0 / 16
    mine = feats.clone().requires_grad_(True)
    ref = feats.clone().requires_grad_(True)
    # fp64 here: the agreement is then exact to rounding, not to fp32's summation order
    out = roi_align_matrix(mine, rois, output_size, scale, sampling_ratio, aligned)
    expected = roi_align(ref, rois, output_size, scale, sampling_ratio, aligned)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-10, atol=1e-10)
    assert rois.grad is None


def test_fp32_rois_in_any_order_and_images_without_rois():
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(4, 8, 12, 12, generator=gen)
    rois = _rois(gen, 2, 40, 192.0)  # images 2 and 3 have no ROIs; batch indices unsorted
    expected = roi_align(feats, rois, (7, 7), 1.0 / 16, 0, True)
    torch.testing.assert_close(roi_align_matrix(feats, rois, (7, 7), 1.0 / 16, 0, True), expected,
                               rtol=1e-5, atol=1e-5)
    assert roi_align_matrix(feats, rois[:0], (7, 7), 1.0 / 16, 0, True).shape == (0, 8, 7, 7)


def test_the_layer_takes_the_matrix_path_only_when_a_backward_follows(monkeypatch):
    import pipeline.extract.detector.roi_align as mod

    calls = []
    real = mod.roi_align_matrix
    monkeypatch.setattr(mod, "roi_align_matrix", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(4)
    feats = torch.randn(2, 3, 12, 12, generator=gen)
    rois = _rois(gen, 2, 10, 192.0)
    layer = MatrixROIAlign((7, 7), 1.0 / 16, 0, aligned=True)
    expected = roi_align(feats, rois, (7, 7), 1.0 / 16, 0, True)
    torch.testing.assert_close(layer(feats, rois), expected, rtol=0, atol=0)  # no grad: torchvision's
    assert calls == []
    out = layer(feats.requires_grad_(True), rois)
    assert calls == [1]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bf16_input_is_pooled_in_fp32_and_returned_in_bf16():
    """As torchvision's autocast rule: the op runs in fp32 and returns the input's dtype."""
    gen = torch.Generator().manual_seed(5)
    feats = torch.randn(2, 4, 12, 12, generator=gen).bfloat16()
    rois = _rois(gen, 2, 16, 192.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = roi_align_matrix(feats, rois, (7, 7), 1.0 / 16, 0, True)
    assert out.dtype == torch.bfloat16
    expected = roi_align(feats.float(), rois, (7, 7), 1.0 / 16, 0, True).bfloat16()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_bad_scale_is_refused():
    with pytest.raises(ValueError, match="spatial_scale"):
        MatrixROIAlign(7, 0.0, 0)


@pytest.mark.parametrize("output_size", [(7, 7), (6, 5)])
def test_bin_stride_pools_every_sth_bin_of_torchvisions_grid(output_size):
    """bin_stride 2: torchvision's output at bins 0, 2, 4, ... (forward and backward), in channels-last memory."""
    gen = torch.Generator().manual_seed(8)
    feats = torch.randn(3, 5, 12, 10, generator=gen, dtype=torch.float64)
    rois = _rois(gen, 3, 48, 192.0).double()
    mine, ref = feats.clone().requires_grad_(True), feats.clone().requires_grad_(True)
    out = roi_align_matrix(mine, rois, output_size, 1.0 / 16, 0, True, bin_stride=2)
    expected = roi_align(ref, rois, output_size, 1.0 / 16, 0, True)[:, :, ::2, ::2]
    assert out.shape == expected.shape and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    grad = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    out.backward(grad)
    expected.backward(grad)
    torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-10, atol=1e-10)


def test_the_layer_with_a_bin_stride_always_takes_the_matrix_path():
    gen = torch.Generator().manual_seed(9)
    feats = torch.randn(2, 3, 12, 12, generator=gen)
    rois = _rois(gen, 2, 10, 192.0)
    layer = MatrixROIAlign((7, 7), 1.0 / 16, 0, aligned=True, bin_stride=2)
    expected = roi_align(feats, rois, (7, 7), 1.0 / 16, 0, True)[:, :, ::2, ::2]
    with torch.inference_mode():
        torch.testing.assert_close(layer(feats, rois), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bin_stride"):
        MatrixROIAlign(7, 1.0 / 16, 0, bin_stride=0)
