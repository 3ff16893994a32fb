"""The caffe-converted checkpoint layout: a random R101-C4 saved in it loads back to identical outputs."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from helpers.scene_kit import scene_images
from pipeline.extract.detector.build import Detector, build_model, calibrate_norms, load_detector
from pipeline.extract.detector.checkpoint import CheckpointError, load_weights, read_state, save_caffe_layout
from pipeline.extract.detector.extractor import RegionExtractor

TEST_SIZE = (96, 160)  # small test scale keeps the R101 forward passes short on CPU


@pytest.fixture(scope="module")
def r101():
    """A random bottom-up-attention R101-C4 (12 proposals instead of 300) with calibrated norms."""
    torch.manual_seed(0)
    model, cfg = build_model("butd_r101", overrides=("MODEL.RPN.POST_NMS_TOPK_TEST", 12))
    detector = Detector(model=model, cfg=cfg, preset="butd_r101", class_names=[f"c{i}" for i in range(1600)],
                        attribute_names=[], weights=None)
    image = scene_images(1, size=96, seed=3)[0][0]
    calibrate_norms(model, RegionExtractor(detector, test_size=TEST_SIZE).to_input(image)[0][None])
    return detector


def test_r101_detected_mode_outputs(r101):
    image = scene_images(1, size=96, seed=4)[0][0]
    r = RegionExtractor(r101, test_size=TEST_SIZE).extract([image])[0]
    n = len(r.boxes)
    assert 10 <= n <= 12  # at least min_boxes, at most the proposals there are
    assert r.features.shape == (n, 2048) and r.soft_labels.shape == (n, 1601) and r.attributes.shape == (n, 401)
    np.testing.assert_allclose(r.soft_labels.sum(1), 1.0, atol=1e-4)
    np.testing.assert_allclose(r.attributes.sum(1), 1.0, atol=1e-4)


@pytest.mark.slow  # a 260 MB pickle written and read back, a second R101 built
def test_caffe_layout_round_trip_gives_identical_outputs(r101, tmp_path):
    path = tmp_path / "faster_rcnn_from_caffe_attr.pkl"
    save_caffe_layout(r101.model, path, author="test")
    state, meta = read_state(path)
    assert meta["__author__"] == "test"
    assert "roi_heads.box_predictor.cls_embedding.weight" in state
    assert "backbone.res4.22.conv3.norm.running_var" in state
    assert not any(k.endswith("num_batches_tracked") for k in state)

    (tmp_path / "objects_vocab.txt").write_text("".join(f"thing{i}\n" for i in range(1600)))
    loaded = load_detector("butd_r101", path)  # the real preset: 300 proposals, strict load
    assert loaded.class_names[:2] == ["thing0", "thing1"] and len(loaded.class_names) == 1600
    assert loaded.attribute_names[0] == "vg_attribute_0000" and len(loaded.attribute_names) == 400
    images, objects = scene_images(1, size=96, seed=5)
    boxes = [np.array([o["box"] for o in objects[0]], dtype=np.float32)]
    before = RegionExtractor(r101, test_size=TEST_SIZE).extract(images, boxes)[0]
    after = RegionExtractor(loaded, test_size=TEST_SIZE).extract(images, boxes)[0]
    np.testing.assert_array_equal(before.features, after.features)
    np.testing.assert_array_equal(before.soft_labels, after.soft_labels)
    np.testing.assert_array_equal(before.attributes, after.attributes)
    x = RegionExtractor(r101, test_size=TEST_SIZE).to_input(images[0])[0][None]
    with torch.no_grad():
        a, b = r101.model.backbone(x)["res4"], loaded.model.backbone(x)["res4"]
        assert torch.equal(a, b)
        ra, rb = r101.model.proposal_generator.rpn_head([a]), loaded.model.proposal_generator.rpn_head([b])
    assert all(torch.equal(u, v) for u, v in zip(ra[0] + ra[1], rb[0] + rb[1]))


def test_vocabulary_with_the_wrong_count_is_refused(tmp_path):
    path = tmp_path / "weights.pkl"
    path.write_bytes(b"not read")
    (tmp_path / "objects_vocab.txt").write_text("too\nfew\n")
    with pytest.raises(CheckpointError, match="expected 1600 names, found 2"):
        load_detector("butd_r101", path)


@pytest.fixture
def mini_model():
    torch.manual_seed(0)
    return build_model("mini", num_classes=6)[0]


def _rewrite(path, edit):
    with open(path, "rb") as fh:
        obj = pickle.load(fh)
    edit(obj["model"])
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.pop("roi_heads.res5.0.conv1.weight"), "1 missing: roi_heads.res5.0.conv1.weight"),
    (lambda m: m.__setitem__("roi_heads.extra.weight", np.zeros(3, np.float32)), "1 unexpected: roi_heads.extra"),
    (lambda m: m.__setitem__("roi_heads.box_predictor.cls_score.bias", np.zeros(5, np.float32)), "wrong shape"),
])
def test_loading_is_strict(mini_model, tmp_path, edit, message):
    path = tmp_path / "bad.pkl"
    save_caffe_layout(mini_model, path, author="test")
    _rewrite(path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_weights(build_model("mini", num_classes=6)[0], path)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


def test_pickle_cannot_run_code(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": {"x": _Exploit()}}))
    with pytest.raises(CheckpointError, match="not allowed"):
        read_state(path)
