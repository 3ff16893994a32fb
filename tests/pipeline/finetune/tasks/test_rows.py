"""Rows -> batches: flattening order, segment types, targets, token budgets; box IoU by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.finetune.tasks.refcoco_plus import box_iou, class_oracle_pick
from pipeline.finetune.tasks.rows import collate_rows, mix_seed, row, text_row

SPECIAL = {"cls": 101, "sep": 102}


def regions(n: int, value: float) -> dict[str, np.ndarray]:
    return {"features": np.full((n, 4), value, np.float16), "norm_bb": np.full((n, 7), value, np.float16),
            "boxes": np.zeros((n, 4), np.float32)}


def test_text_row_places_cls_and_a_sep_after_each_part():
    assert text_row(SPECIAL, [5, 6], [7]).tolist() == [101, 5, 6, 102, 7, 102]
    assert text_row(SPECIAL, np.array([9], np.int32)).tolist() == [101, 9, 102]


def test_collate_flattens_rows_in_item_order_and_pads_types():
    items = [
        {"id": "a", "rows": [row(text_row(SPECIAL, [1]), regions(2, 1.0), img_type_ids=[1, 2]),
                             row(text_row(SPECIAL, [1, 2, 3]), regions(1, 2.0), img_type_ids=[2])]},
        {"id": "b", "rows": [row(text_row(SPECIAL, [4]), regions(3, 3.0), img_type_ids=[1, 1, 2]),
                             row(text_row(SPECIAL, [4]), regions(2, 4.0), img_type_ids=[1, 2])]},
    ]
    batch = collate_rows(items)
    assert batch["ids"] == ["a", "b"] and batch["rows_per_item"] == [2, 2]
    assert batch["input_ids"].shape == (4, 5) and batch["img_feat"].shape == (4, 3, 4)
    assert batch["txt_mask"].sum(1).tolist() == [3, 5, 3, 3]
    assert batch["img_mask"].sum(1).tolist() == [2, 1, 3, 2]
    assert batch["img_feat"][:, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0]  # row order = item order, then row order
    assert batch["img_type_ids"].tolist() == [[1, 2, 1], [2, 1, 1], [1, 1, 2], [1, 2, 1]]
    assert "task" not in batch and batch["img_feat"].dtype == torch.float32


def test_mix_seed_is_deterministic_and_spreads():
    assert mix_seed(1, 2, 3) == mix_seed(1, 2, 3)
    seeds = {mix_seed(7, epoch, stream, i) for epoch in range(3) for stream in range(2) for i in range(100)}
    assert len(seeds) == 600 and all(0 <= s < 2**63 for s in seeds)


def test_box_iou_by_hand():
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [10, 10, 20, 20], [0, 0, 5, 5], [2, 2, 4, 4]], np.float32)
    # identical; half overlap: 50 / 150; touching corner; contained quarter; contained 4/100
    assert box_iou(a, b)[0] == pytest.approx([1.0, 1 / 3, 0.0, 0.25, 0.04])
    assert box_iou(b[1], a).shape == (1, 1)


def test_class_oracle_picks_the_most_confident_region_of_the_class():
    soft = np.array([[0.1, 0.6, 0.3],   # top class 1, p=0.6
                     [0.0, 0.8, 0.2],   # top class 1, p=0.8: the pick for class 1
                     [0.1, 0.4, 0.5],   # top class 2 (class 1 at 0.4 does not count: not its top class)
                     [0.7, 0.2, 0.1]])  # background
    assert class_oracle_pick(soft, 1) == 1
    assert class_oracle_pick(soft, 2) == 2
    assert class_oracle_pick(soft, 0) == 3
    assert class_oracle_pick(soft[[0, 3]], 2) == -1  # no region of that class
