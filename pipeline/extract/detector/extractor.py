"""Region features from images: batched C4 Faster R-CNN inference in two modes.

``detected``: backbone -> RPN proposals -> res5 head -> class scores and class-specific boxes ->
the max-confidence selection (:mod:`pipeline.extract.detector.selection`) -> the kept regions' features.
``given``: backbone -> res5 head on the given boxes -> their features and class scores.

Images are resized so the shorter side is the preset's test scale (longer side capped), converted
to BGR and mean-subtracted as in caffe. Only images of the same resized size share a batch:
padding a smaller image to its batch-mates' size would change its features (the border
activations of a padded map are not the zeros a convolution pads with), so an image's regions do
not depend on which images it was batched with. Outputs come back in input order.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from detectron2.structures import Boxes, ImageList

from pipeline.extract.detector.build import Detector
from pipeline.extract.detector.modeling import fold_batch_norms
from pipeline.extract.detector.presets import inference_settings
from pipeline.extract.detector.selection import select_regions


@dataclass
class Regions:
    """One image's regions (n of them), all numpy float32 except where noted.

    ``features`` [n, D]; ``boxes`` [n, 4] x1, y1, x2, y2 in original-image pixels; ``conf`` [n]
    (max foreground probability that survived NMS; for given boxes the max foreground
    probability); ``soft_labels`` [n, C+1] class distribution, background FIRST;
    ``attributes`` [n, A+1] attribute probabilities or None; ``image_hw`` (H, W).
    """

    features: np.ndarray
    boxes: np.ndarray
    conf: np.ndarray
    soft_labels: np.ndarray
    attributes: np.ndarray | None
    image_hw: tuple[int, int]

    @property
    def norm_bb(self) -> np.ndarray:
        """[n, 7] float32: x1, y1, x2, y2, w, h, w*h, each normalized by the image size."""
        return normalized_boxes(self.boxes, *self.image_hw)


def normalized_boxes(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pixel boxes [n, 4] -> UNITER position features [n, 7] (docs/design.md §8)."""
    b = boxes.astype(np.float32) / np.array([width, height, width, height], dtype=np.float32)
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return np.concatenate([b, w[:, None], h[:, None], (w * h)[:, None]], axis=1).astype(np.float32)


def autocast_dtype(amp: str | None) -> torch.dtype | None:
    """``"bf16"`` / ``"fp16"`` / None (as ``ExtractSettings.amp``) -> the torch dtype or None."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp or "")


class RegionExtractor:
    """Run a :class:`Detector` over images.

    Args (keyword-only after ``detector``):
        conf_th, min_boxes, max_boxes: the keep rule of detected mode.
        batch_size: images per forward pass.
        amp: autocast dtype of the forward (``torch.bfloat16`` / ``torch.float16``) or None (fp32);
            the extract stage passes None on a CPU (``runner.effective_amp``).
        test_size: (min_size, max_size) replacing the preset's test scale (tests, benchmarks).
    """

    def __init__(self, detector: Detector, *, conf_th: float = 0.2, min_boxes: int = 10, max_boxes: int = 100,
                 batch_size: int = 8, amp: torch.dtype | None = None, test_size: tuple[int, int] | None = None):
        self.detector = detector
        # an inference copy (the detector itself may train on): batch norms folded into the
        # convolutions, and the ROI heads pooling only the bins their res5 head reads
        self.model = copy.deepcopy(detector.model).eval()
        fold_batch_norms(self.model)
        if hasattr(self.model.roi_heads, "pool_only_read_bins"):
            self.model.roi_heads.pool_only_read_bins()
        self.settings = inference_settings(detector.cfg)
        if test_size is not None:
            self.settings = dataclasses.replace(self.settings, min_size=test_size[0], max_size=test_size[1])
        self.conf_th, self.min_boxes, self.max_boxes = conf_th, min_boxes, max_boxes
        self.batch_size = max(1, batch_size)
        self.amp = amp
        self.device = next(self.model.parameters()).device
        self.pixel_mean = torch.tensor(detector.cfg.MODEL.PIXEL_MEAN, device=self.device).view(3, 1, 1)
        self.pixel_std = torch.tensor(detector.cfg.MODEL.PIXEL_STD, device=self.device).view(3, 1, 1)

    # ---------------------------------------------------------------------------- preprocessing

    def scale_for(self, height: int, width: int) -> float:
        """Resize factor: shorter side -> min_size unless the longer side would pass max_size."""
        s = self.settings
        scale = s.min_size / min(height, width)
        if max(height, width) * scale > s.max_size:
            scale = s.max_size / max(height, width)
        return scale

    def input_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) of an image of ``height`` x ``width`` after resizing to the test scale."""
        scale = self.scale_for(height, width)
        return max(1, round(height * scale)), max(1, round(width * scale))

    def to_input(self, rgb: np.ndarray) -> tuple[torch.Tensor, float]:
        """uint8 RGB [H, W, 3] -> normalized BGR float [3, h, w] at test scale, and the scale."""
        height, width = rgb.shape[:2]
        scale = self.scale_for(height, width)
        x = torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))).to(self.device)
        x = x.float()
        size = self.input_size(height, width)
        if size != (height, width):
            x = F.interpolate(x[None], size=size, mode="bilinear", align_corners=False)[0]
        return (x - self.pixel_mean) / self.pixel_std, scale

    def _autocast(self):
        if self.amp is not None:
            return torch.autocast(device_type=self.device.type, dtype=self.amp)
        return contextlib.nullcontext()

    # -------------------------------------------------------------------------------- inference

    def extract(self, images: list[np.ndarray], boxes: list[np.ndarray] | None = None) -> list[Regions]:
        """Regions of each image.

        Args:
            images: uint8 RGB arrays [H, W, 3] (as :func:`pipeline.common.image_io.decode_image` gives).
            boxes: None for detected mode, or one float array [k_i, 4] (x1, y1, x2, y2 pixels)
                per image for given-box mode (k_i may be 0).

        Returns:
            one :class:`Regions` per image, in input order.
        """
        if boxes is not None and len(boxes) != len(images):
            raise ValueError(f"given-box mode needs one box array per image: {len(boxes)} for {len(images)} images")
        results: list[Regions | None] = [None] * len(images)
        for chunk in self.plan_batches(images):
            given = None if boxes is None else [np.asarray(boxes[i], np.float32).reshape(-1, 4) for i in chunk]
            for i, regions in zip(chunk, self.extract_batch([images[i] for i in chunk], given)):
                results[i] = regions
        return results  # type: ignore[return-value]

    def plan_batches(self, images: list[np.ndarray]) -> list[list[int]]:
        """The batches :meth:`extract` runs ``images`` in: lists of indices into ``images``.

        Images of one resized size, in input order, ``batch_size`` at a time. A feature's last bits
        depend on its batch-mates (the kernels' blocking follows the batch shape), so whoever runs
        the batches elsewhere (the worker pool of ``runner``) runs exactly these to get the same bytes.
        """
        groups: dict[tuple[int, int], list[int]] = {}
        for i, img in enumerate(images):
            groups.setdefault(self.input_size(*img.shape[:2]), []).append(i)
        return [members[start:start + self.batch_size] for members in groups.values()
                for start in range(0, len(members), self.batch_size)]

    @torch.inference_mode()
    def extract_batch(self, images: list[np.ndarray], given: list[np.ndarray] | None) -> list[Regions]:
        """One forward pass over ``images`` (all of one resized size) -> their regions, in order;
        ``given``: one [k_i, 4] box array per image (given-box mode) or None (detected mode)."""
        model = self.model
        inputs, scales = zip(*(self.to_input(img) for img in images))
        batch = ImageList.from_tensors(list(inputs), model.backbone.size_divisibility)
        with self._autocast():
            features = model.backbone(batch.tensor)
            if given is None:
                proposals, _ = model.proposal_generator(batch, features, None)
                roi_boxes = [p.proposal_boxes for p in proposals]
            else:
                roi_boxes = []
                for b, scale, hw in zip(given, scales, batch.image_sizes):
                    bx = Boxes(torch.from_numpy(b * scale).to(self.device))
                    bx.clip(hw)
                    roi_boxes.append(bx)
            pooled = model.roi_heads.pooled_features(features, roi_boxes)
            preds = model.roi_heads.predict(pooled)
        pooled = pooled.float()
        probs = F.softmax(preds["class_logits"].float(), dim=1)
        attrs = F.softmax(preds["attribute_logits"].float(), dim=1) if "attribute_logits" in preds else None
        counts = [len(b) for b in roi_boxes]
        out = []
        for i, (lo, hi) in enumerate(zip(np.cumsum([0] + counts[:-1]), np.cumsum(counts))):
            height, width = images[i].shape[:2]
            sl = slice(int(lo), int(hi))
            if given is None:
                regions = self._select(pooled[sl], probs[sl], preds["box_deltas"][sl].float(), roi_boxes[i],
                                       batch.image_sizes[i], scales[i], (height, width),
                                       None if attrs is None else attrs[sl])
            else:
                regions = Regions(
                    features=pooled[sl].cpu().numpy(), boxes=given[i].copy(),
                    conf=probs[sl, :-1].max(dim=1).values.cpu().numpy() if hi > lo else np.zeros(0, np.float32),
                    soft_labels=_background_first(probs[sl]).cpu().numpy(),
                    attributes=None if attrs is None else attrs[sl].cpu().numpy(), image_hw=(height, width))
            out.append(regions)
        return out

    def _select(self, pooled, probs, deltas, proposal_boxes: Boxes, input_hw, scale, image_hw, attrs) -> Regions:
        """Detected mode for one image: regress, select, and map boxes back to image pixels."""
        num_classes = probs.shape[1] - 1
        transform = self.model.roi_heads.box_predictor.box2box_transform
        class_boxes = transform.apply_deltas(deltas, proposal_boxes.tensor.float())  # [R, C*4]
        class_boxes = Boxes(class_boxes.view(-1, 4))
        class_boxes.clip(input_hw)
        class_boxes = class_boxes.tensor.view(-1, num_classes, 4)
        sel = select_regions(probs[:, :-1], class_boxes, nms_thresh=self.settings.nms_thresh, conf_th=self.conf_th,
                             min_boxes=self.min_boxes, max_boxes=self.max_boxes,
                             score_floor=self.settings.score_floor)
        height, width = image_hw
        boxes = sel.boxes / scale
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        return Regions(
            features=pooled[sel.index].cpu().numpy(), boxes=boxes.cpu().numpy().astype(np.float32),
            conf=sel.conf.cpu().numpy(), soft_labels=_background_first(probs[sel.index]).cpu().numpy(),
            attributes=None if attrs is None else attrs[sel.index].cpu().numpy(), image_hw=image_hw)


def _background_first(probs: torch.Tensor) -> torch.Tensor:
    """detectron2 order (background last) -> UNITER order (background first); [R, C+1]."""
    return torch.cat([probs[:, -1:], probs[:, :-1]], dim=1)
