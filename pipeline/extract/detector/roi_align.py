"""ROIAlign as two matrix products, for the small feature maps of the ``mini`` detector on CPU.

torchvision's CPU ``roi_align`` backward is one serial loop of scattered adds: training the mini
detector on 2 cores spent 27% of each iteration in it while the second core waited
(docs/decisions.md#detector-roi-align). ROIAlign is linear in the feature map and its bilinear sampling is
separable, so for ROI r with sampling grid g_y x g_x:

    out[r, c, p, q] = sum_{y, x} Ay[r, p, y] * F[b_r, c, y, x] * Ax[r, q, x]

where ``Ay[r, p, y]`` sums, over the g_y sample rows of output row p, each sample's linear
interpolation weight on feature row y (divided by g_y * g_x, torchvision's average), and ``Ax``
likewise over columns. Forward and backward are then matrix products that use every core. The
sample points, the out-of-map rule (a sample beyond [-1, size] adds 0), the clamping at the borders
and ``aligned`` (the -0.5 pixel shift of ROIAlignV2) follow torchvision's kernel; results agree
with it up to float summation order (tests/pipeline/extract/detector/test_roi_align.py).

The products hold an [H, W] slice per ROI and channel, so this suits maps of a few hundred
positions (the mini preset's res4 map is 12 x 12); the ``butd_r101`` preset keeps torchvision's.
"""

from __future__ import annotations

import math

import torch
from torch.nn.modules.utils import _pair

from detectron2.layers import ROIAlign


def _axis_weights(start: torch.Tensor, length: torch.Tensor, bins: int, grid: torch.Tensor, size: int,
                  bin_stride: int = 1) -> torch.Tensor:
    """Interpolation weights of one axis: [R, ceil(bins / bin_stride), size].

    ``start``/``length`` [R]: the ROI's first coordinate and extent on this axis (feature cells);
    ``grid`` i64 [R]: sample points per bin on this axis (0: none, the ROI's output is 0);
    ``bin_stride``: only bins 0, s, 2s, ... of the ``bins`` (each as wide as with all of them).
    """
    n_rois = start.shape[0]
    most = max(int(grid.max()), 1) if n_rois else 1
    step = length / bins                                              # [R]
    k = torch.arange(most, dtype=start.dtype, device=start.device)   # [G]
    p = torch.arange(0, bins, bin_stride, dtype=start.dtype, device=start.device)   # [P]
    per_bin = grid.clamp(min=1).to(start.dtype)
    # sample (p, k) of ROI r: start + p * step + (k + 0.5) * step / grid
    coord = (start[:, None, None] + p[None, :, None] * step[:, None, None]
             + (k[None, None, :] + 0.5) * (step / per_bin)[:, None, None])   # [R, P, G]
    used = (k[None, :] < grid[:, None])[:, None, :] & (coord >= -1.0) & (coord <= size)
    c = coord.clamp(min=0.0)
    low = c.floor().clamp(max=size - 1)
    at_edge = low >= size - 1
    c = torch.where(at_edge, low, c)
    frac = c - low                                                    # weight of the upper neighbour
    low_i = low.long()
    high_i = torch.where(at_edge, low_i, low_i + 1)
    mask = used.to(start.dtype)
    weights = torch.zeros(n_rois, len(p), most, size, dtype=start.dtype, device=start.device)
    weights.scatter_add_(3, low_i[..., None], ((1.0 - frac) * mask)[..., None])
    weights.scatter_add_(3, high_i[..., None], (frac * mask)[..., None])
    return weights.sum(dim=2)


def roi_align_matrix(features: torch.Tensor, rois: torch.Tensor, output_size: tuple[int, int],
                     spatial_scale: float, sampling_ratio: int, aligned: bool, bin_stride: int = 1) -> torch.Tensor:
    """torchvision's ``roi_align`` semantics through matrix products.

    Args:
        features: [N, C, H, W] feature maps.
        rois: [R, 5] (batch index, x1, y1, x2, y2) in input pixels.
        output_size: (P, Q) bins per ROI.
        spatial_scale: feature cells per input pixel.
        sampling_ratio: sample points per bin and axis; <= 0: ceil(ROI extent / bins), per ROI.
        aligned: shift the scaled box by -0.5 cells (ROIAlignV2).
        bin_stride: keep only every ``bin_stride``-th bin on both axes, starting with the first:
            ``roi_align(...)[:, :, ::s, ::s]`` without computing the bins left out.

    Returns:
        [R, C, P', Q'] with P' = ceil(P / bin_stride) (likewise Q'), in ``features``' dtype (computed
        in fp32, fp64 for fp64 input, as torchvision's autocast rule does) and channels-last layout.
    """
    bins_h, bins_w = output_size
    out_h, out_w = -(-bins_h // bin_stride), -(-bins_w // bin_stride)
    dtype = features.dtype
    with torch.autocast(features.device.type, enabled=False):
        fmap = features.double() if dtype == torch.float64 else features.float()
        boxes = rois.detach().to(fmap.dtype)  # as torchvision's: no gradient into the boxes
        n, channels, height, width = fmap.shape
        offset = 0.5 if aligned else 0.0
        x1, y1, x2, y2 = (boxes[:, i] * spatial_scale - offset for i in range(1, 5))
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:  # the legacy rule: at least one cell
            roi_w, roi_h = roi_w.clamp(min=1.0), roi_h.clamp(min=1.0)
        if sampling_ratio > 0:
            grid_h = torch.full_like(roi_h, sampling_ratio, dtype=torch.long)
            grid_w = torch.full_like(roi_w, sampling_ratio, dtype=torch.long)
        else:
            grid_h = torch.ceil(roi_h / bins_h).long()
            grid_w = torch.ceil(roi_w / bins_w).long()
        count = (grid_h * grid_w).clamp(min=1).to(fmap.dtype)
        ay = _axis_weights(y1, roi_h, bins_h, grid_h, height, bin_stride) / count[:, None, None]   # [R, P', H]
        ax = _axis_weights(x1, roi_w, bins_w, grid_w, width, bin_stride)                           # [R, Q', W]
        batch = boxes[:, 0].long()
        parts, order = [], []
        for b in range(n):
            idx = (batch == b).nonzero().flatten()
            if idx.numel() == 0:
                continue
            k = idx.numel()
            # rows: [k*P, H] @ [H, C*W] -> [k, P, C, W]; columns: [k, P*C, W] @ [k, W, Q]; then the
            # small result to channels-last memory (k, P, Q, C), the layout the res5 convolutions read
            rows = (ay[idx].reshape(k * out_h, height) @ fmap[b].permute(1, 0, 2).reshape(height, channels * width))
            both = rows.reshape(k, out_h * channels, width) @ ax[idx].transpose(1, 2)
            parts.append(both.reshape(k, out_h, channels, out_w).transpose(2, 3).contiguous().permute(0, 3, 1, 2))
            order.append(idx)
        if not parts:
            return fmap.new_zeros((0, channels, out_h, out_w)).to(dtype, memory_format=torch.channels_last)
        out = torch.cat(parts)
        perm = torch.cat(order)
        if not torch.equal(perm, torch.arange(len(perm), device=perm.device)):
            out = out[torch.argsort(perm)]
    return out.to(dtype)


class MatrixROIAlign(ROIAlign):
    """detectron2's ``ROIAlign`` layer that pools with :func:`roi_align_matrix` when a backward will
    follow (training) or when it keeps only every ``bin_stride``-th bin. Otherwise it is detectron2's
    own layer: without a backward, torchvision's forward over all bins is the faster of the two
    (extraction: 14.0 against 13.3 images/s on one thread).

    ``bin_stride`` > 1 (set for inference by ``UniterRes5ROIHeads.pool_only_read_bins`` when the first
    res5 block reads the pooled grid only at that stride): the output is ``[R, C, ceil(P / s), ceil(Q / s)]``, bins 0, s, 2s, ... of the
    ``output_size`` grid.
    """

    def __init__(self, output_size, spatial_scale: float, sampling_ratio: int, aligned: bool = True, *,
                 bin_stride: int = 1) -> None:
        if not math.isfinite(spatial_scale) or spatial_scale <= 0:
            raise ValueError(f"spatial_scale must be > 0, got {spatial_scale!r}")
        if bin_stride < 1:
            raise ValueError(f"bin_stride must be >= 1, got {bin_stride!r}")
        super().__init__(_pair(output_size), spatial_scale, sampling_ratio, aligned)
        self.bin_stride = bin_stride

    def forward(self, input: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:  # noqa: A002 (detectron2's name)
        if self.bin_stride == 1 and not (torch.is_grad_enabled() and input.requires_grad):
            return super().forward(input, rois)
        assert rois.dim() == 2 and rois.size(1) == 5, f"rois must be [R, 5], got {tuple(rois.shape)}"
        return roi_align_matrix(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio, self.aligned,
                                self.bin_stride)
