"""detectron2 components of the C4 family: caffe-style stem, configurable res5 head, region API.

Registered in detectron2's registries on import (names used by :mod:`pipeline.extract.detector.presets`):
``build_uniter_c4_backbone`` (BACKBONE_REGISTRY) and ``UniterRes5ROIHeads`` (ROI_HEADS_REGISTRY).
Besides detectron2's own ``forward`` (training losses / detections), the ROI heads expose the two
steps region extraction needs: :meth:`UniterRes5ROIHeads.pooled_features` and
:meth:`UniterRes5ROIHeads.predict`.
"""

from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn
from torch.nn import functional as F

from detectron2.layers import Conv2d, FrozenBatchNorm2d, ROIAlign, ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, ROI_HEADS_REGISTRY
from detectron2.modeling.backbone.resnet import BasicStem, BottleneckBlock, ResNet
from detectron2.modeling.roi_heads import Res5ROIHeads
from detectron2.modeling.roi_heads.fast_rcnn import FastRCNNOutputLayers
from detectron2.structures import Boxes

from pipeline.extract.detector.attributes import AttributeFastRCNNOutputLayers
from pipeline.extract.detector.roi_align import MatrixROIAlign

ROI_ALIGN_IMPLS = ("torchvision", "matrix")

_BLOCKS_PER_STAGE = {50: (3, 4, 6), 101: (3, 4, 23), 152: (3, 8, 36)}  # res2..res4 of a C4 backbone


class CaffeMaxPoolStem(BasicStem):
    """ResNet stem whose max-pool matches caffe (pad 0, ceil mode), as in bottom-up-attention.

    Same parameters as detectron2's ``BasicStem`` (``conv1`` with its norm), so checkpoints load
    into either; only the pooled grid differs (by at most one row/column).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)


def fold_batch_norms(model: nn.Module) -> int:
    """Fold each detectron2 ``Conv2d``'s inference-mode norm (``BatchNorm2d`` with running statistics
    or ``FrozenBatchNorm2d``) into the convolution's weight and bias, in place; returns how many.

    For inference only (call on a model in eval mode, or a copy of it): y = gamma * (conv(x) - mean)
    / sqrt(var + eps) + beta is the convolution with weight * s and bias beta + (b - mean) * s, s =
    gamma / sqrt(var + eps), so the separate normalization pass over every activation goes (~10% of
    the mini detector's extraction on CPU). Equal up to float rounding (~1e-6 relative).
    """
    folded = 0
    for conv in model.modules():
        norm = getattr(conv, "norm", None)
        if not isinstance(conv, Conv2d) or not isinstance(norm, (nn.BatchNorm2d, FrozenBatchNorm2d)):
            continue
        if isinstance(norm, nn.BatchNorm2d) and (norm.training or norm.running_var is None):
            raise ValueError("fold_batch_norms: a BatchNorm2d is in training mode or has no running statistics")
        with torch.no_grad():
            scale = norm.weight.float() / torch.sqrt(norm.running_var.float() + norm.eps)
            bias = conv.bias.float() if conv.bias is not None else torch.zeros_like(scale)
            weight = conv.weight.float() * scale.view(-1, *([1] * (conv.weight.dim() - 1)))
            conv.weight.copy_(weight.to(conv.weight.dtype))
            conv.bias = nn.Parameter((norm.bias.float() + (bias - norm.running_mean.float()) * scale)
                                     .to(conv.weight.dtype), requires_grad=False)
        conv.norm = None
        folded += 1
    return folded


@BACKBONE_REGISTRY.register()
def build_uniter_c4_backbone(cfg, input_shape: ShapeSpec) -> ResNet:
    """ResNet res2..res4 (C4 trunk) with a detectron2 or caffe-style stem.

    Reads ``MODEL.RESNETS.{DEPTH, NORM, NUM_GROUPS, WIDTH_PER_GROUP, STEM_OUT_CHANNELS,
    RES2_OUT_CHANNELS, STRIDE_IN_1X1, OUT_FEATURES}``, ``MODEL.BACKBONE.FREEZE_AT`` and
    ``MODEL.UNITER.CAFFE_MAXPOOL``. Returns a detectron2 ``ResNet`` (output stride 16 at res4).
    """
    r = cfg.MODEL.RESNETS
    stem_cls = CaffeMaxPoolStem if cfg.MODEL.UNITER.CAFFE_MAXPOOL else BasicStem
    stem = stem_cls(in_channels=input_shape.channels, out_channels=r.STEM_OUT_CHANNELS, norm=r.NORM)
    if r.DEPTH not in _BLOCKS_PER_STAGE:
        raise ValueError(f"MODEL.RESNETS.DEPTH must be one of {sorted(_BLOCKS_PER_STAGE)}, got {r.DEPTH}")
    in_channels, out_channels = r.STEM_OUT_CHANNELS, r.RES2_OUT_CHANNELS
    bottleneck = r.NUM_GROUPS * r.WIDTH_PER_GROUP
    stages = []
    for idx, num_blocks in enumerate(_BLOCKS_PER_STAGE[r.DEPTH]):
        first_stride = 1 if idx == 0 else 2
        stages.append(ResNet.make_stage(
            block_class=BottleneckBlock, num_blocks=num_blocks,
            stride_per_block=[first_stride] + [1] * (num_blocks - 1),
            in_channels=in_channels, out_channels=out_channels, bottleneck_channels=bottleneck,
            num_groups=r.NUM_GROUPS, norm=r.NORM, stride_in_1x1=r.STRIDE_IN_1X1,
        ))
        in_channels, out_channels, bottleneck = out_channels, out_channels * 2, bottleneck * 2
    return ResNet(stem, stages, out_features=list(r.OUT_FEATURES), freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT)


@ROI_HEADS_REGISTRY.register()
class UniterRes5ROIHeads(Res5ROIHeads):
    """detectron2's ``Res5ROIHeads`` with a configurable res5 head and the region-extraction API.

    ``MODEL.UNITER.RES5_HEAD_STRIDE`` / ``RES5_HEAD_DILATION``: bottom-up-attention keeps the
    pooled 14x14 grid (stride 1, dilation 2); the mini preset halves it (stride 2, dilation 1).
    ``MODEL.UNITER.ATTRIBUTE_ON`` swaps in :class:`AttributeFastRCNNOutputLayers`.
    ``MODEL.UNITER.ROI_ALIGN: matrix`` pools with :class:`MatrixROIAlign` (the same op). For
    inference, :meth:`pool_only_read_bins` makes it pool only the bins the res5 head reads.
    """

    def pool_only_read_bins(self) -> int:
        """When the first res5 block reads the pooled grid only through 1x1 convolutions of stride s
        and padding 0 (its shortcut and ``conv1``; ``conv2`` at stride 1: the mini preset, stride 2
        with ``STRIDE_IN_1X1``), pool only the bins they read (every s-th, 4x4 of 7x7) and run those
        convolutions at stride 1: the same function, a third of the pooling work and no NCHW ->
        channels-last copy of the pooled grid (together 14% of the mini detector's extraction on
        one thread). In place, for an inference copy (``RegionExtractor``): training keeps the
        preset's layers, whose rounding its checkpoints were trained with. Returns s (1: left as it was)."""
        first = self.res5[0]
        poolers = self.pooler.level_poolers
        readers = [getattr(first, "shortcut", None), first.conv1]
        # one level: detectron2's multi-level pooler allocates the full grid for its output
        if not (isinstance(first, BottleneckBlock) and len(poolers) == 1 and isinstance(poolers[0], MatrixROIAlign)
                and all(c is not None and c.kernel_size == (1, 1) and c.padding == (0, 0) for c in readers)
                and first.conv2.stride == (1, 1) and len({c.stride for c in readers}) == 1):
            return 1
        stride = readers[0].stride
        if stride[0] != stride[1] or stride[0] == 1:
            return 1
        for conv in readers:
            conv.stride = (1, 1)
        for pooler in poolers:
            pooler.bin_stride = stride[0]
        return stride[0]

    @classmethod
    def from_config(cls, cfg, input_shape):
        ret = super().from_config(cfg, input_shape)
        impl = cfg.MODEL.UNITER.ROI_ALIGN
        if impl not in ROI_ALIGN_IMPLS:
            raise ValueError(f"MODEL.UNITER.ROI_ALIGN must be one of {list(ROI_ALIGN_IMPLS)}, got {impl!r}")
        if impl == "matrix":
            pooler = ret["pooler"]
            if not all(isinstance(p, ROIAlign) for p in pooler.level_poolers):
                raise ValueError("MODEL.UNITER.ROI_ALIGN=matrix needs an ROIAlign pooler "
                                 f"(MODEL.ROI_BOX_HEAD.POOLER_TYPE is {cfg.MODEL.ROI_BOX_HEAD.POOLER_TYPE})")
            pooler.level_poolers = nn.ModuleList(
                MatrixROIAlign(p.output_size, p.spatial_scale, p.sampling_ratio, p.aligned)
                for p in pooler.level_poolers)
        if cfg.MODEL.UNITER.ATTRIBUTE_ON:
            out_channels = ret["box_predictor"].cls_score.in_features
            ret["box_predictor"] = AttributeFastRCNNOutputLayers(
                cfg, ShapeSpec(channels=out_channels, height=1, width=1))
        return ret

    @classmethod
    def _build_res5_block(cls, cfg):
        r = cfg.MODEL.RESNETS
        factor = 2 ** 3  # res5 is 8x res2
        out_channels = r.RES2_OUT_CHANNELS * factor
        stride, dilation = cfg.MODEL.UNITER.RES5_HEAD_STRIDE, cfg.MODEL.UNITER.RES5_HEAD_DILATION
        blocks = ResNet.make_stage(
            BottleneckBlock, 3, stride_per_block=[stride, 1, 1], in_channels=out_channels // 2,
            bottleneck_channels=r.NUM_GROUPS * r.WIDTH_PER_GROUP * factor, out_channels=out_channels,
            num_groups=r.NUM_GROUPS, norm=r.NORM, stride_in_1x1=r.STRIDE_IN_1X1, dilation=dilation,
        )
        return nn.Sequential(*blocks), out_channels

    @property
    def feature_dim(self) -> int:
        """D, the width of a pooled region feature (2048 for R101-C4)."""
        return self.box_predictor.cls_score.in_features

    def pooled_features(self, features: Dict[str, torch.Tensor], boxes: List[Boxes]) -> torch.Tensor:
        """Backbone features + per-image boxes (in input-tensor pixels) -> [sum R_i, D].

        ROIAlign on the C4 map, the res5 head, then the spatial mean: the region feature that the
        box predictor reads and that UNITER stores.
        """
        x = self._shared_roi_transform([features[f] for f in self.in_features], boxes)
        return x.mean(dim=(2, 3))

    def predict(self, pooled: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Pooled features [R, D] -> ``class_logits`` [R, C+1] (background last), ``box_deltas``
        [R, C*4] and, with the attribute head, ``attribute_logits`` [R, A+1]."""
        predictor: FastRCNNOutputLayers = self.box_predictor
        class_logits, box_deltas = predictor(pooled)
        out = {"class_logits": class_logits, "box_deltas": box_deltas}
        if isinstance(predictor, AttributeFastRCNNOutputLayers):
            out["attribute_logits"] = predictor.attribute_logits(pooled, class_logits)
        return out
