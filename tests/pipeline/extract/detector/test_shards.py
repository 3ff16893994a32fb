"""Shard files: the docs/design.md §8 layout, byte-deterministic, readable by the safetensors library."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors import safe_open

from pipeline.extract.detector.extractor import Regions
from pipeline.extract.detector.shards import encode_safetensors, encode_shard, read_shard


def _regions(n: int, seed: int, hw=(30, 40)) -> Regions:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 20, size=(n, 2)).astype(np.float32)
    soft = rng.random((n, 5)).astype(np.float32)
    return Regions(features=rng.normal(size=(n, 8)).astype(np.float32),
                   boxes=np.concatenate([xy, xy + 5], axis=1), conf=rng.random(n).astype(np.float32),
                   soft_labels=soft / soft.sum(1, keepdims=True), attributes=None, image_hw=hw)


def test_round_trip_layout_and_dtypes(tmp_path):
    regions = [_regions(3, 0), _regions(0, 1), _regions(2, 2, hw=(50, 20))]
    path = tmp_path / "shard-00000.safetensors"
    path.write_bytes(encode_shard(["a", "b", "c"], regions, feature_dim=8, num_classes=5))
    shard = read_shard(path)
    a = shard.arrays
    assert shard.image_ids == ["a", "b", "c"] and shard.box_ids is None
    assert a["offsets"].tolist() == [0, 3, 3, 5] and a["offsets"].dtype == np.int64
    assert a["image_hw"].tolist() == [[30, 40], [30, 40], [50, 20]] and a["image_hw"].dtype == np.int32
    expected = {"features": (np.float16, (5, 8)), "boxes": (np.float32, (5, 4)), "norm_bb": (np.float16, (5, 7)),
                "conf": (np.float16, (5,)), "soft_labels": (np.float16, (5, 5))}
    for name, (dtype, shape) in expected.items():
        assert a[name].dtype == dtype and a[name].shape == shape, name
    np.testing.assert_array_equal(shard.image(2)["boxes"], regions[2].boxes)
    np.testing.assert_allclose(shard.image(0)["features"], regions[0].features, atol=2e-3)
    np.testing.assert_allclose(shard.image(2)["norm_bb"], regions[2].norm_bb, atol=1e-3)
    assert shard.image(1)["conf"].shape == (0,)


def test_bytes_are_deterministic_and_metadata_sorted(tmp_path):
    regions = [_regions(4, 0), _regions(1, 1)]
    one = encode_shard(["x", "y"], regions, feature_dim=8, num_classes=5, box_ids=[[9, 8, 7, 6], [1]])
    two = encode_shard(["x", "y"], regions, feature_dim=8, num_classes=5, box_ids=[[9, 8, 7, 6], [1]])
    assert one == two
    size = struct.unpack("<Q", one[:8])[0]
    assert (8 + size) % 8 == 0
    header = json.loads(one[8:8 + size])
    assert list(header["__metadata__"]) == ["box_ids", "image_ids"]
    path = tmp_path / "s.safetensors"
    path.write_bytes(one)
    with safe_open(str(path), framework="np") as fh:  # the reference reader
        assert json.loads(fh.metadata()["box_ids"]) == [[9, 8, 7, 6], [1]]
        assert fh.get_tensor("offsets").tolist() == [0, 4, 5]


def test_empty_shard_keeps_widths(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(encode_shard([], [], feature_dim=2048, num_classes=1601))
    a = read_shard(path).arrays
    assert a["features"].shape == (0, 2048) and a["soft_labels"].shape == (0, 1601) and a["offsets"].tolist() == [0]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="2 image ids for 1 region sets"):
        encode_shard(["a", "b"], [_regions(1, 0)], feature_dim=8, num_classes=5)
    with pytest.raises(ValueError, match="one id per region"):
        encode_shard(["a"], [_regions(2, 0)], feature_dim=8, num_classes=5, box_ids=[[1]])
    with pytest.raises(TypeError, match="dtype"):
        encode_safetensors({"x": np.zeros(2, dtype=np.uint8)}, {})
