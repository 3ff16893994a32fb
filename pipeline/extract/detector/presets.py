"""Detector presets: the detectron2 configs of the two C4 Faster R-CNN models (docs/design.md §8).

``butd_r101``: the bottom-up-attention model (Anderson et al.) as converted to detectron2:
ResNet-101 C4, caffe-style stem max-pool (pad 0, ceil), BGR means 102.98/115.95/122.77 with unit
std, RPN on res4 with a 512-wide hidden conv and 12 anchors (sizes 64..512 x ratios 0.5/1/2), RPN
NMS 0.7 with 6000 -> 300 proposals at test time, 14x14 ROIAlign on res4, res5 head without the
stride-2 halving and with dilation 2 (so the 2048-d feature is the mean of a 14x14 map), 1,600
classes with class-specific box regression, a 400-attribute head; test scale 600 / max 1000,
per-class NMS 0.3.

``mini``: a narrow member of the same family that trains from scratch on 2 cores (docs/design.md §8):
R50-C4 with width-per-group 16, 64 res2 channels, 32 stem channels, BatchNorm everywhere (no
frozen layers: there are no pretrained weights offline), anchors 16..128, 300/100 RPN proposals
(train/test), 32 sampled ROIs per image at positive fraction 0.5, 7x7 ROIAlign and a res5 head
that halves (4x4 map, 512-d features), test scale = the mini world's image size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PresetName = Literal["butd_r101", "mini"]
PRESETS: tuple[str, ...] = ("butd_r101", "mini")

BUTD_PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)
BUTD_NUM_CLASSES = 1600
BUTD_NUM_ATTRIBUTES = 400


@dataclass(frozen=True)
class InferenceSettings:
    """Inference-time settings that are not part of the network weights."""

    min_size: int  # shorter image side after resizing
    max_size: int  # cap on the longer side after resizing
    nms_thresh: float  # per-class NMS IoU threshold of the region selection
    score_floor: float  # (proposal, class) pairs below this skip the NMS
    size_divisibility: int = 0


def add_uniter_config(cfg) -> None:
    """Add this project's keys to a detectron2 config (idempotent)."""
    from detectron2.config import CfgNode as CN

    if "UNITER" in cfg.MODEL:
        return
    cfg.MODEL.UNITER = CN()
    # stem max-pool as in caffe: kernel 3, stride 2, pad 0, ceil mode (detectron2: pad 1, floor)
    cfg.MODEL.UNITER.CAFFE_MAXPOOL = False
    # the res5 head of the ROI heads: stride of its first block and dilation of its 3x3 convs
    cfg.MODEL.UNITER.RES5_HEAD_STRIDE = 2
    cfg.MODEL.UNITER.RES5_HEAD_DILATION = 1
    # attribute head (bottom-up-attention): class embedding + 2 linear layers
    cfg.MODEL.UNITER.ATTRIBUTE_ON = False
    cfg.MODEL.UNITER.NUM_ATTRIBUTES = 400
    # per-class NMS of the region selection (docs/design.md §8) and the score below which a
    # (proposal, class) pair skips it (exact for confidences above; see selection.py)
    cfg.MODEL.UNITER.REGION_NMS_THRESH = 0.3
    cfg.MODEL.UNITER.NMS_SCORE_FLOOR = 0.0
    # ROIAlign of the ROI heads: torchvision (its kernel) | matrix (the same op as two matrix
    # products: roi_align.py; for small maps on CPU, where torchvision's backward is one serial loop)
    cfg.MODEL.UNITER.ROI_ALIGN = "torchvision"
    # convolution weights (and so activations) in channels-last layout, oneDNN's own on CPU
    cfg.MODEL.UNITER.CHANNELS_LAST = False


def _common(cfg) -> None:
    """Settings shared by both presets: a C4 Faster R-CNN in detectron2."""
    cfg.MODEL.META_ARCHITECTURE = "GeneralizedRCNN"
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.MASK_ON = False
    cfg.MODEL.KEYPOINT_ON = False
    cfg.MODEL.BACKBONE.NAME = "build_uniter_c4_backbone"
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res4"]
    cfg.MODEL.RESNETS.NUM_GROUPS = 1
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = True
    cfg.MODEL.PROPOSAL_GENERATOR.NAME = "RPN"
    cfg.MODEL.RPN.IN_FEATURES = ["res4"]
    cfg.MODEL.RPN.HEAD_NAME = "StandardRPNHead"
    cfg.MODEL.RPN.NMS_THRESH = 0.7
    cfg.MODEL.ANCHOR_GENERATOR.NAME = "DefaultAnchorGenerator"
    cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS = [[0.5, 1.0, 2.0]]
    cfg.MODEL.ROI_HEADS.NAME = "UniterRes5ROIHeads"
    cfg.MODEL.ROI_HEADS.IN_FEATURES = ["res4"]
    cfg.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG = False
    cfg.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
    cfg.MODEL.PIXEL_MEAN = list(BUTD_PIXEL_MEAN_BGR)
    cfg.MODEL.PIXEL_STD = [1.0, 1.0, 1.0]
    cfg.INPUT.FORMAT = "BGR"
    cfg.MODEL.UNITER.REGION_NMS_THRESH = 0.3
    cfg.TEST.DETECTIONS_PER_IMAGE = 100


def _butd_r101(cfg) -> None:
    cfg.MODEL.RESNETS.DEPTH = 101
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = 64
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 256
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.NORM = "FrozenBN"
    cfg.MODEL.BACKBONE.FREEZE_AT = 2
    cfg.MODEL.UNITER.CAFFE_MAXPOOL = True
    cfg.MODEL.RPN.CONV_DIMS = [512]
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[64, 128, 256, 512]]
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST = 6000
    cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 300
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = BUTD_NUM_CLASSES
    cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 14
    cfg.MODEL.ROI_BOX_HEAD.POOLER_TYPE = "ROIAlign"
    cfg.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = 0
    cfg.MODEL.UNITER.RES5_HEAD_STRIDE = 1
    cfg.MODEL.UNITER.RES5_HEAD_DILATION = 2
    cfg.MODEL.UNITER.ATTRIBUTE_ON = True
    cfg.MODEL.UNITER.NUM_ATTRIBUTES = BUTD_NUM_ATTRIBUTES
    # 1,600 classes x 300 proposals: only pairs scoring >= 0.001 enter the per-class NMS
    cfg.MODEL.UNITER.NMS_SCORE_FLOOR = 0.001
    cfg.INPUT.MIN_SIZE_TEST = 600
    cfg.INPUT.MAX_SIZE_TEST = 1000


def _mini(cfg, *, num_classes: int, image_size: int) -> None:
    cfg.MODEL.RESNETS.DEPTH = 50
    cfg.MODEL.RESNETS.WIDTH_PER_GROUP = 16
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.STEM_OUT_CHANNELS = 32
    cfg.MODEL.RESNETS.NORM = "BN"
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    cfg.MODEL.UNITER.CAFFE_MAXPOOL = True
    cfg.MODEL.ANCHOR_GENERATOR.SIZES = [[16, 32, 64, 128]]
    # a 192-px image has 1,728 anchors; NMS over all of them was ~12% of a training iteration
    cfg.MODEL.RPN.PRE_NMS_TOPK_TRAIN = 600
    cfg.MODEL.RPN.POST_NMS_TOPK_TRAIN = 300
    cfg.MODEL.RPN.PRE_NMS_TOPK_TEST = 300
    cfg.MODEL.RPN.POST_NMS_TOPK_TEST = 100
    cfg.MODEL.ROI_HEADS.NUM_CLASSES = num_classes
    cfg.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE = 32
    cfg.MODEL.ROI_HEADS.POSITIVE_FRACTION = 0.5
    cfg.MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION = 7
    cfg.MODEL.ROI_BOX_HEAD.POOLER_TYPE = "ROIAlignV2"
    cfg.MODEL.ROI_BOX_HEAD.POOLER_SAMPLING_RATIO = 0
    cfg.MODEL.UNITER.ROI_ALIGN = "matrix"  # a 12 x 12 res4 map: torchvision's serial backward was 27% of an iteration
    cfg.MODEL.UNITER.CHANNELS_LAST = True  # an iteration 0.87x, extraction ~10% faster (docs/decisions.md)
    cfg.MODEL.UNITER.RES5_HEAD_STRIDE = 2
    cfg.MODEL.UNITER.RES5_HEAD_DILATION = 1
    cfg.MODEL.UNITER.ATTRIBUTE_ON = False
    cfg.INPUT.MIN_SIZE_TRAIN = (image_size,)
    cfg.INPUT.MAX_SIZE_TRAIN = int(image_size * 5 // 3)
    cfg.INPUT.MIN_SIZE_TEST = image_size
    cfg.INPUT.MAX_SIZE_TEST = int(image_size * 5 // 3)


def make_cfg(preset: str, *, num_classes: int | None = None, image_size: int = 192, overrides: tuple = ()):
    """The detectron2 ``CfgNode`` of a preset.

    Args:
        preset: ``butd_r101`` or ``mini``.
        num_classes: foreground classes of the ``mini`` preset (the mini world's categories);
            ignored for ``butd_r101`` (always 1,600).
        image_size: the mini world's image side; the ``mini`` preset's train/test scale.
        overrides: detectron2 ``KEY, VALUE, ...`` pairs applied last (e.g. fewer proposals in tests).

    Returns:
        a frozen detectron2 ``CfgNode``.
    """
    from detectron2.config import get_cfg

    if preset not in PRESETS:
        raise ValueError(f"unknown detector preset {preset!r}; expected one of {list(PRESETS)}")
    cfg = get_cfg()
    add_uniter_config(cfg)
    _common(cfg)
    if preset == "butd_r101":
        _butd_r101(cfg)
    else:
        if num_classes is None or num_classes < 1:
            raise ValueError(f"the mini preset needs num_classes >= 1, got {num_classes!r}")
        _mini(cfg, num_classes=num_classes, image_size=image_size)
    if overrides:
        cfg.merge_from_list(list(overrides))
    cfg.freeze()
    return cfg


def inference_settings(cfg) -> InferenceSettings:
    """The inference settings recorded in a preset's config."""
    return InferenceSettings(
        min_size=int(cfg.INPUT.MIN_SIZE_TEST),
        max_size=int(cfg.INPUT.MAX_SIZE_TEST),
        nms_thresh=float(cfg.MODEL.UNITER.REGION_NMS_THRESH),
        score_floor=float(cfg.MODEL.UNITER.NMS_SCORE_FLOOR),
    )
