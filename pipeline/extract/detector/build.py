"""Building a detector of a preset, with or without its weights.

A :class:`Detector` bundles the detectron2 model (eval mode), its config and the names of its
classes. ``load_detector`` is what extraction uses; ``build_model`` is what training and tests use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.extract.detector import modeling  # noqa: F401  (registers the backbone and ROI heads)
from pipeline.extract.detector.checkpoint import CheckpointError, load_weights, read_state, vocab_names
from pipeline.extract.detector.presets import BUTD_NUM_ATTRIBUTES, BUTD_NUM_CLASSES, make_cfg

MINI_META_KEYS = ("preset", "class_names", "image_size")


@dataclass
class Detector:
    """A ready-to-run detector: ``model`` (detectron2 ``GeneralizedRCNN``, eval mode), ``cfg``,
    ``preset`` name, ``class_names`` (C foreground names, in logit order), ``attribute_names``
    (empty without an attribute head) and ``weights`` (the file it was loaded from)."""

    model: nn.Module
    cfg: Any
    preset: str
    class_names: list[str]
    attribute_names: list[str]
    weights: Path | None

    @property
    def feature_dim(self) -> int:
        return self.model.roi_heads.feature_dim

    @property
    def num_classes(self) -> int:
        """C + 1: foreground classes plus background (the width of ``soft_labels``)."""
        return len(self.class_names) + 1


def build_model(preset: str, *, num_classes: int | None = None, image_size: int = 192,
                device: str | torch.device = "cpu", overrides: tuple = ()) -> tuple[nn.Module, Any]:
    """A randomly initialized model of ``preset`` (see :func:`presets.make_cfg`) -> (model, cfg).

    Initialization draws from torch's global RNG: seed it first for a reproducible model.
    """
    from detectron2.modeling import build_model as d2_build_model

    cfg = make_cfg(preset, num_classes=num_classes, image_size=image_size, overrides=overrides)
    model = d2_build_model(cfg)
    if cfg.MODEL.UNITER.CHANNELS_LAST:  # 4-d weights only; loading weights later keeps the layout
        model = model.to(memory_format=torch.channels_last)
    return model.to(device).eval(), cfg


def load_detector(preset: str, weights: Path | str, *, device: str | torch.device = "cpu",
                  proposals: int | None = None) -> Detector:
    """Build ``preset`` and load ``weights`` strictly; ``proposals``: the RPN's proposals per image
    at inference (None: the preset's).

    ``mini``: a ``train_detector`` checkpoint, whose ``meta`` carries the class names and image
    size. ``butd_r101``: the caffe-converted bottom-up-attention file (``.pkl``) or a torch file
    with the same parameter names; class / attribute names come from ``objects_vocab.txt`` /
    ``attributes_vocab.txt`` next to it when present.
    """
    weights = Path(weights)
    overrides = () if proposals is None else ("MODEL.RPN.POST_NMS_TOPK_TEST", proposals)
    if preset == "mini":
        _, meta = read_state(weights)
        missing = [k for k in MINI_META_KEYS if k not in meta]
        if missing or meta["preset"] != "mini":
            raise CheckpointError(f"{weights}: not a mini detector checkpoint (meta lacks {missing or 'preset=mini'}); "
                                  "run `python -m pipeline train_detector` first")
        class_names = [str(n) for n in meta["class_names"]]
        model, cfg = build_model("mini", num_classes=len(class_names), image_size=int(meta["image_size"]),
                                 overrides=overrides)
        attribute_names: list[str] = []
    else:
        class_names = vocab_names(weights, "objects_vocab.txt", BUTD_NUM_CLASSES, "vg_object")
        attribute_names = vocab_names(weights, "attributes_vocab.txt", BUTD_NUM_ATTRIBUTES, "vg_attribute")
        model, cfg = build_model(preset, overrides=overrides)
    load_weights(model, weights)
    return Detector(model=model.to(device).eval(), cfg=cfg, preset=preset, class_names=class_names,
                    attribute_names=attribute_names, weights=weights)


@torch.no_grad()
def calibrate_norms(model: nn.Module, images: torch.Tensor) -> None:
    """Set every BatchNorm's statistics (frozen or not) from one forward pass over ``images``.

    A randomly initialized trunk whose norms hold identity statistics blows activations up by
    orders of magnitude (the RPN then proposes nothing sensible). Calibrating each norm on the
    statistics of its own input, in forward order, gives a random model with realistic
    activations: what tests and benchmarks need when no trained weights are at hand. The model
    stays in eval mode; only ``running_mean`` / ``running_var`` change.

    Args:
        model: a detectron2 model with a ``backbone`` and ``roi_heads`` (``UniterRes5ROIHeads``).
        images: [B, 3, H, W] normalized input batch.
    """
    from detectron2.layers import FrozenBatchNorm2d
    from detectron2.structures import Boxes

    def set_stats(module, inputs):
        x = inputs[0].float()
        module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        module.running_var.copy_(x.var(dim=(0, 2, 3), unbiased=False))

    norms = [m for m in model.modules() if isinstance(m, (FrozenBatchNorm2d, nn.BatchNorm2d))]
    handles = [m.register_forward_pre_hook(set_stats) for m in norms]
    try:
        features = model.backbone(images)
        # a grid of crops stands in for proposals when calibrating the res5 head
        h, w = images.shape[-2:]
        crops = torch.tensor([[0, 0, w / 2, h / 2], [w / 2, 0, w, h / 2], [0, h / 2, w / 2, h],
                              [w / 2, h / 2, w, h], [w / 4, h / 4, 3 * w / 4, 3 * h / 4]],
                             dtype=images.dtype, device=images.device)
        model.roi_heads.pooled_features(features, [Boxes(crops)] * len(images))
    finally:
        for handle in handles:
            handle.remove()
