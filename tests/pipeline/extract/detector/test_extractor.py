"""Batched extraction with a small random detector: shapes, dtypes, the keep rule, given boxes."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.scene_kit import scene_images
from pipeline.extract.detector.extractor import RegionExtractor, normalized_boxes


def test_detected_mode_shapes_dtypes_and_keep_rule(mini_detector):
    images, _ = scene_images(3)
    out = RegionExtractor(mini_detector, batch_size=2).extract(images)
    assert len(out) == 3
    for img, r in zip(images, out):
        n = len(r.boxes)
        assert 10 <= n <= 100
        assert r.features.shape == (n, 512) and r.features.dtype == np.float32
        assert r.boxes.shape == (n, 4) and r.boxes.dtype == np.float32
        assert r.conf.shape == (n,) and r.soft_labels.shape == (n, 7)
        assert r.image_hw == img.shape[:2]
        assert np.all(np.diff(r.conf) <= 0), "regions come most confident first"
        np.testing.assert_allclose(r.soft_labels.sum(axis=1), 1.0, atol=1e-5)
        assert (r.boxes[:, 0::2] >= 0).all() and (r.boxes[:, 0::2] <= img.shape[1]).all()
        assert (r.boxes[:, 1::2] >= 0).all() and (r.boxes[:, 1::2] <= img.shape[0]).all()
        assert r.attributes is None and r.norm_bb.shape == (n, 7)
        # conf counts only foreground classes (background is column 0 of soft_labels)
        assert (r.conf <= r.soft_labels[:, 1:].max(axis=1) + 1e-6).all()


def test_more_confident_regions_than_min_are_all_kept(mini_detector):
    images, _ = scene_images(1)
    r = RegionExtractor(mini_detector, conf_th=0.0, min_boxes=10, max_boxes=100).extract(images)[0]
    assert len(r.boxes) == 100 or len(r.boxes) == mini_detector.cfg.MODEL.RPN.POST_NMS_TOPK_TEST
    r = RegionExtractor(mini_detector, conf_th=0.0, min_boxes=2, max_boxes=7).extract(images)[0]
    assert len(r.boxes) == 7


def test_given_boxes_come_back_exactly(mini_detector):
    images, objects = scene_images(3)
    boxes = [np.array([o["box"] for o in objs], dtype=np.float32) for objs in objects]
    boxes[1] = np.zeros((0, 4), dtype=np.float32)  # an image without boxes is allowed
    boxes[2] = np.array([[-5, -5, 30, 30], [10, 12, 70, 64]], dtype=np.float32)  # partly outside: pooled clipped
    out = RegionExtractor(mini_detector, batch_size=3).extract(images, boxes)
    for given, r in zip(boxes, out):
        np.testing.assert_array_equal(r.boxes, given)
        assert r.features.shape == (len(given), 512) and r.soft_labels.shape == (len(given), 7)
        assert r.conf.shape == (len(given),)
        np.testing.assert_allclose(r.conf, r.soft_labels[:, 1:].max(axis=1), rtol=1e-6)


def test_a_region_feature_depends_only_on_its_box(mini_detector):
    """Pooling is per box: the same box given twice in one image gets the same feature."""
    images, _ = scene_images(1)
    box = np.array([[8, 8, 40, 40], [8, 8, 40, 40]], dtype=np.float32)
    r = RegionExtractor(mini_detector).extract(images, [box])[0]
    np.testing.assert_array_equal(r.features[0], r.features[1])


def test_batching_keeps_order_and_does_not_change_results(mini_detector):
    images, _ = scene_images(4)
    wide = np.concatenate([images[3], images[3][:, :32]], axis=1)  # 64 x 96: batched on its own
    inputs = [images[0], wide, images[1], images[2]]
    one = RegionExtractor(mini_detector, batch_size=1).extract(inputs)
    many = RegionExtractor(mini_detector, batch_size=3).extract(inputs)
    assert [r.image_hw for r in many] == [(64, 64), (64, 96), (64, 64), (64, 64)]
    for a, b in zip(many, one):  # same regions up to float summation order
        np.testing.assert_allclose(a.features, b.features, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-2)


def test_norm_bb_is_position_over_image_size():
    boxes = np.array([[10, 20, 50, 80]], dtype=np.float32)
    got = normalized_boxes(boxes, height=100, width=200)
    w, h = 40 / 200, 60 / 100
    np.testing.assert_allclose(got, [[0.05, 0.2, 0.25, 0.8, w, h, w * h]], rtol=1e-6)


def test_given_boxes_must_match_images(mini_detector):
    images, _ = scene_images(2)
    with pytest.raises(ValueError, match="one box array per image"):
        RegionExtractor(mini_detector).extract(images, [np.zeros((0, 4))])


def test_the_extractor_runs_a_folded_copy_and_leaves_the_detector_as_it_was(mini_detector):
    """Folded batch norms give the features of the detector itself (float rounding apart), and the
    detector keeps its norms (training may go on with it)."""
    import torch
    from detectron2.structures import Boxes

    images, objects = scene_images(2, seed=5)
    extractor = RegionExtractor(mini_detector)
    assert extractor.model is not mini_detector.model
    assert mini_detector.model.roi_heads.res5[0].conv1.norm is not None
    assert extractor.model.roi_heads.res5[0].conv1.norm is None
    assert extractor.model.roi_heads.pooler.level_poolers[0].bin_stride == 2
    assert mini_detector.model.roi_heads.pooler.level_poolers[0].bin_stride == 1
    boxes = [np.array([o["box"] for o in objs], dtype=np.float32) for objs in objects]
    folded = extractor.extract(images, boxes)
    model = mini_detector.model.eval()
    with torch.inference_mode():
        for img, given, r in zip(images, boxes, folded):
            x, scale = extractor.to_input(img)
            features = model.backbone(x[None])
            pooled = model.roi_heads.pooled_features(features, [Boxes(torch.from_numpy(given * scale))])
            np.testing.assert_allclose(r.features, pooled.numpy(), rtol=1e-4, atol=1e-4)


def test_amp_autocasts_on_the_cpu_too(mini_detector):
    import torch

    images, _ = scene_images(1)
    box = [np.array([[8, 8, 40, 40]], dtype=np.float32)]
    fp32 = RegionExtractor(mini_detector).extract(images, box)[0]
    bf16 = RegionExtractor(mini_detector, amp=torch.bfloat16).extract(images, box)[0]
    assert bf16.features.dtype == np.float32  # returned in fp32 whatever the forward ran in
    assert not np.array_equal(fp32.features, bf16.features)
    np.testing.assert_allclose(bf16.features, fp32.features, rtol=0.1, atol=0.1 * np.abs(fp32.features).max())
