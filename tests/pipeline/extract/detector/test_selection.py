"""The max-confidence keep rule against a plain per-class greedy NMS written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.extract.detector.selection import num_kept, select_regions


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def reference_conf(probs: np.ndarray, boxes: np.ndarray, thresh: float) -> np.ndarray:
    """bottom-up-attention's loop: per class, greedy NMS, then max over surviving scores."""
    num_props, num_classes = probs.shape
    conf = np.zeros(num_props)
    for c in range(num_classes):
        order = sorted(range(num_props), key=lambda i: -probs[i, c])
        kept: list[int] = []
        for i in order:
            if all(_iou(boxes[i, c], boxes[j, c]) <= thresh for j in kept):
                kept.append(i)
        for i in kept:
            conf[i] = max(conf[i], probs[i, c])
    return conf


def _random_case(seed: int, num_props: int = 40, num_classes: int = 5):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2.5, size=(num_props, num_classes + 1))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    xy = rng.uniform(0, 80, size=(num_props, num_classes, 2))
    wh = rng.uniform(5, 40, size=(num_props, num_classes, 2))
    boxes = np.concatenate([xy, xy + wh], axis=2)
    return probs[:, :-1].astype(np.float32), boxes.astype(np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_confidences_and_order_match_reference(seed):
    probs, boxes = _random_case(seed)
    ref = reference_conf(probs, boxes, 0.3)
    sel = select_regions(torch.from_numpy(probs), torch.from_numpy(boxes), nms_thresh=0.3, conf_th=0.2,
                         min_boxes=10, max_boxes=100)
    n = min(max(int((ref >= 0.2).sum()), 10), 100)
    assert len(sel.index) == n
    np.testing.assert_allclose(sel.conf.numpy(), np.sort(ref)[::-1][:n], rtol=1e-6)
    # each kept box is the box of the class that gave the confidence
    for i, c, b in zip(sel.index.tolist(), sel.classes.tolist(), sel.boxes.numpy()):
        assert probs[i, c] == pytest.approx(ref[i]) or ref[i] == 0
        np.testing.assert_array_equal(b, boxes[i, c])


def test_score_floor_is_exact_above_the_floor():
    probs, boxes = _random_case(5, num_props=60, num_classes=8)
    full = select_regions(torch.from_numpy(probs), torch.from_numpy(boxes), nms_thresh=0.3, conf_th=0.2,
                          min_boxes=10, max_boxes=100)
    floored = select_regions(torch.from_numpy(probs), torch.from_numpy(boxes), nms_thresh=0.3, conf_th=0.2,
                             min_boxes=10, max_boxes=100, score_floor=0.05)
    above = full.conf >= 0.05
    k = int(above.sum())
    assert k > 0
    assert torch.equal(full.index[:k], floored.index[:k])
    assert torch.equal(full.conf[:k], floored.conf[:k])
    assert (floored.conf[k:] == 0).all()


@pytest.mark.parametrize("confident,expected", [(0, 10), (3, 10), (10, 10), (37, 37), (100, 100), (250, 100)])
def test_n_is_clipped_to_10_100(confident, expected):
    conf = torch.cat([torch.full((confident,), 0.9), torch.full((300 - confident,), 0.1)])
    assert num_kept(conf, conf_th=0.2, min_boxes=10, max_boxes=100) == expected


def test_fewer_proposals_than_min_boxes_keeps_all():
    assert num_kept(torch.tensor([0.5, 0.1, 0.0]), conf_th=0.2, min_boxes=10, max_boxes=100) == 3
