"""The two presets carry the settings of docs/design.md §8 and build real detectron2 models."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from detectron2.layers import Conv2d, FrozenBatchNorm2d
from detectron2.structures import Boxes

from pipeline.extract.detector.build import build_model
from pipeline.extract.detector.modeling import CaffeMaxPoolStem, fold_batch_norms
from pipeline.extract.detector.presets import inference_settings, make_cfg
from pipeline.extract.detector.roi_align import MatrixROIAlign


def test_butd_r101_settings():
    cfg = make_cfg("butd_r101")
    m = cfg.MODEL
    assert m.RESNETS.DEPTH == 101 and m.RESNETS.NORM == "FrozenBN" and m.RESNETS.STRIDE_IN_1X1
    assert m.UNITER.CAFFE_MAXPOOL
    assert m.PIXEL_MEAN == pytest.approx([102.98, 115.95, 122.77], abs=0.01) and m.PIXEL_STD == [1.0, 1.0, 1.0]
    assert cfg.INPUT.FORMAT == "BGR"
    assert (cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST) == (600, 1000)
    assert m.RPN.NMS_THRESH == 0.7 and m.RPN.POST_NMS_TOPK_TEST == 300 and m.RPN.CONV_DIMS == [512]
    assert m.ANCHOR_GENERATOR.SIZES == [[64, 128, 256, 512]]
    assert m.ROI_HEADS.NUM_CLASSES == 1600 and m.UNITER.ATTRIBUTE_ON and m.UNITER.NUM_ATTRIBUTES == 400
    assert m.ROI_BOX_HEAD.POOLER_RESOLUTION == 14
    assert (m.UNITER.RES5_HEAD_STRIDE, m.UNITER.RES5_HEAD_DILATION) == (1, 2)
    s = inference_settings(cfg)
    assert (s.min_size, s.max_size, s.nms_thresh) == (600, 1000, 0.3)


def test_mini_settings():
    cfg = make_cfg("mini", num_classes=30, image_size=192)
    m = cfg.MODEL
    assert m.RESNETS.DEPTH == 50 and m.RESNETS.WIDTH_PER_GROUP == 16 and m.RESNETS.RES2_OUT_CHANNELS == 64
    assert m.RESNETS.STEM_OUT_CHANNELS == 32 and m.RESNETS.NORM == "BN" and m.BACKBONE.FREEZE_AT == 0
    assert m.ANCHOR_GENERATOR.SIZES == [[16, 32, 64, 128]]
    assert (m.RPN.POST_NMS_TOPK_TRAIN, m.RPN.POST_NMS_TOPK_TEST) == (300, 100)
    assert (m.ROI_HEADS.BATCH_SIZE_PER_IMAGE, m.ROI_HEADS.POSITIVE_FRACTION) == (32, 0.5)
    assert m.ROI_BOX_HEAD.POOLER_RESOLUTION == 7 and m.ROI_HEADS.NUM_CLASSES == 30
    assert inference_settings(cfg).min_size == 192


def test_unknown_preset_and_missing_classes_are_errors():
    with pytest.raises(ValueError, match="unknown detector preset"):
        make_cfg("r50_fpn")
    with pytest.raises(ValueError, match="num_classes"):
        make_cfg("mini")


def test_both_models_build_with_the_expected_heads():
    torch.manual_seed(0)
    mini, _ = build_model("mini", num_classes=30)
    assert mini.roi_heads.feature_dim == 512
    assert mini.roi_heads.box_predictor.cls_score.out_features == 31
    assert not hasattr(mini.roi_heads.box_predictor, "attr_score")
    r101, _ = build_model("butd_r101")
    heads = r101.roi_heads
    assert heads.feature_dim == 2048
    assert heads.box_predictor.cls_score.out_features == 1601
    assert heads.box_predictor.bbox_pred.out_features == 1600 * 4
    assert heads.box_predictor.cls_embedding.weight.shape == (1601, 256)
    assert heads.box_predictor.fc_attr.in_features == 2048 + 256 and heads.box_predictor.attr_score.out_features == 401
    assert isinstance(r101.backbone.stem, CaffeMaxPoolStem)
    # the mini preset pools with the matrix ROIAlign (its small map on CPU), butd_r101 with torchvision's
    assert all(isinstance(p, MatrixROIAlign) for p in mini.roi_heads.pooler.level_poolers)
    assert not any(isinstance(p, MatrixROIAlign) for p in heads.pooler.level_poolers)
    assert len(r101.backbone.res4) == 23
    assert r101.proposal_generator.rpn_head.objectness_logits.out_channels == 12
    # res5 keeps the 14x14 pooled grid: stride 1, dilated 3x3 convolutions
    block = heads.res5[0]
    assert block.conv1.stride == (1, 1) and block.shortcut.stride == (1, 1) and block.conv2.dilation == (2, 2)


def test_caffe_stem_pools_with_ceil_mode_and_no_padding():
    torch.manual_seed(0)
    stem = CaffeMaxPoolStem(in_channels=3, out_channels=4, norm="")
    x = torch.randn(1, 3, 37, 50)
    y = stem(x)
    conv = F.relu(stem.conv1(x))  # 19 x 25
    expected = F.max_pool2d(F.pad(conv, (0, 1, 0, 1), value=float("-inf")), kernel_size=3, stride=2)
    assert y.shape == (1, 4, 9, 12)
    torch.testing.assert_close(y, expected)


def test_matrix_roi_align_needs_a_known_impl_and_an_roialign_pooler():
    with pytest.raises(ValueError, match="ROI_ALIGN must be one of"):
        build_model("mini", num_classes=3, overrides=("MODEL.UNITER.ROI_ALIGN", "cuda"))
    with pytest.raises(ValueError, match="needs an ROIAlign pooler"):
        build_model("mini", num_classes=3, overrides=("MODEL.ROI_BOX_HEAD.POOLER_TYPE", "ROIPool"))


def test_the_mini_head_pools_only_the_bins_its_first_block_reads():
    """Same pooled features as pooling all 7 x 7 bins and striding the first block's 1x1 convolutions."""
    torch.manual_seed(0)
    mini, _ = build_model("mini", num_classes=5, image_size=64)
    heads = mini.roi_heads.eval()
    block = heads.res5[0]
    assert heads.pooler.level_poolers[0].bin_stride == 1 and block.conv1.stride == (2, 2)  # as built: training's
    assert heads.pool_only_read_bins() == 2
    assert heads.pooler.level_poolers[0].bin_stride == 2
    assert block.conv1.stride == (1, 1) and block.shortcut.stride == (1, 1)
    gen = torch.Generator().manual_seed(1)
    fmap = {"res4": torch.randn(2, 256, 12, 12, generator=gen)}
    boxes = [Boxes(torch.tensor([[0.0, 0.0, 100.0, 80.0], [30.0, 40.0, 190.0, 150.0]])),
             Boxes(torch.tensor([[10.0, 20.0, 60.0, 170.0]]))]
    with torch.inference_mode():
        read_only = heads.pooled_features(fmap, boxes)
        heads.pooler.level_poolers[0].bin_stride = 1
        block.conv1.stride = block.shortcut.stride = (2, 2)
        every_bin = heads.pooled_features(fmap, boxes)
    assert read_only.shape == every_bin.shape == (3, 512)
    torch.testing.assert_close(read_only, every_bin, rtol=1e-5, atol=1e-5)
    # butd_r101's head (stride 1, dilated) reads every bin: left as it is
    r101, _ = build_model("butd_r101")
    assert r101.roi_heads.pool_only_read_bins() == 1


def test_fold_batch_norms_keeps_the_inference_output():
    torch.manual_seed(0)
    conv = Conv2d(4, 6, kernel_size=3, padding=1, bias=False, norm=nn.BatchNorm2d(6))
    frozen = Conv2d(6, 3, kernel_size=1, bias=True, norm=FrozenBatchNorm2d(3))
    with torch.no_grad():
        for norm in (conv.norm, frozen.norm):
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
            norm.weight.uniform_(0.5, 2)
            norm.bias.uniform_(-1, 1)
    model = nn.Sequential(conv, frozen).eval()
    x = torch.randn(2, 4, 9, 9)
    expected = model(x)
    assert fold_batch_norms(model) == 2
    assert conv.norm is None and frozen.norm is None
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    training = Conv2d(2, 2, kernel_size=1, norm=nn.BatchNorm2d(2))
    with pytest.raises(ValueError, match="training mode"):
        fold_batch_norms(training)
