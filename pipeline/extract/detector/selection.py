"""Which detected regions to keep: bottom-up-attention's max-confidence rule (docs/design.md §8).

For every foreground class, NMS (IoU 0.3) runs over the class-specific boxes of all proposals;
a proposal's confidence is the highest class score with which it survived. Proposals are ranked
by that confidence and n = clip(#(conf >= conf_th), min_boxes, max_boxes) are kept (fewer only if
there are fewer proposals). Box of a kept region = its regressed box for the class that gave the
confidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchvision.ops import nms


@dataclass(frozen=True)
class Selection:
    """Kept proposals, most confident first: ``index`` [n] int64 into the proposals, ``conf`` [n]
    float32, ``boxes`` [n, 4] float32 (x1, y1, x2, y2 in the coordinates of the input boxes),
    ``classes`` [n] int64 (0-based foreground class of the confidence)."""

    index: torch.Tensor
    conf: torch.Tensor
    boxes: torch.Tensor
    classes: torch.Tensor


def _per_class_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor, thresh: float) -> torch.Tensor:
    """NMS within each class, as one NMS over boxes shifted apart by class.

    torchvision's ``batched_nms`` switches to a Python loop over classes above 100k coordinates on
    GPU (~1,600 kernel launches per image for bottom-up-attention); shifting keeps it one call.
    """
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    # float64: shifts reach 1,600 x 1,000 px, where float32 would round coordinates to 1/8 px
    boxes = boxes.double()
    offsets = classes.double() * (boxes.max() + 1)
    return nms(boxes + offsets[:, None], scores.double(), thresh)


def num_kept(conf: torch.Tensor, *, conf_th: float, min_boxes: int, max_boxes: int) -> int:
    """n = clip(#(conf >= conf_th), min_boxes, max_boxes), never more than len(conf)."""
    n = int((conf >= conf_th).sum())
    return min(max(n, min_boxes), max_boxes, conf.numel())


def select_regions(
    probs_fg: torch.Tensor,
    boxes: torch.Tensor,
    *,
    nms_thresh: float,
    conf_th: float,
    min_boxes: int,
    max_boxes: int,
    score_floor: float = 0.0,
) -> Selection:
    """Apply the max-confidence rule to one image's proposals.

    Args:
        probs_fg: [R, C] foreground class probabilities (softmax over C+1, background dropped).
        boxes: [R, C, 4] class-specific regressed boxes (x1, y1, x2, y2).
        nms_thresh: per-class NMS IoU threshold (0.3).
        conf_th, min_boxes, max_boxes: the keep rule (0.2, 10, 100).
        score_floor: (proposal, class) pairs scoring below this take no part in NMS. A pair can
            only suppress lower-scoring pairs of its own class, so every confidence >= the floor
            is exactly what full NMS gives; it bounds the work for 1,600 classes. Proposals with
            no pair left get confidence 0 and are ranked after the others, by index.

    Returns:
        a :class:`Selection`.
    """
    num_props, num_classes = probs_fg.shape
    probs_fg = probs_fg.float()
    boxes = boxes.float()
    if score_floor > 0:
        r, c = torch.nonzero(probs_fg >= score_floor, as_tuple=True)
    else:
        r = torch.arange(num_props, device=probs_fg.device).repeat_interleave(num_classes)
        c = torch.arange(num_classes, device=probs_fg.device).repeat(num_props)
    scores = probs_fg[r, c]
    keep = _per_class_nms(boxes[r, c], scores, c, nms_thresh)
    kept_r, kept_c, kept_s = r[keep], c[keep], scores[keep]

    conf = torch.zeros(num_props, dtype=torch.float32, device=probs_fg.device)
    conf.scatter_reduce_(0, kept_r, kept_s, reduce="amax", include_self=True)
    # the class that gave each proposal its confidence (lowest class id on exact ties)
    best = torch.full((num_props,), num_classes, dtype=torch.int64, device=probs_fg.device)
    is_max = kept_s == conf[kept_r]
    best.scatter_reduce_(0, kept_r[is_max], kept_c[is_max], reduce="amin", include_self=True)
    best = torch.where(best < num_classes, best, probs_fg.argmax(dim=1))

    order = torch.sort(conf, descending=True, stable=True).indices
    n = num_kept(conf, conf_th=conf_th, min_boxes=min_boxes, max_boxes=max_boxes)
    index = order[:n]
    classes = best[index]
    return Selection(index=index, conf=conf[index], boxes=boxes[index, classes], classes=classes)
