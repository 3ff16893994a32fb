"""Stage ``train_detector``: a few iterations on scenes rendered here, the saved detector loads and
extracts; the held-out scoring against hand-made regions."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from helpers.scene_kit import CATEGORIES, write_coco_world

from pipeline.extract.detector.build import load_detector
from pipeline.extract.detector.extractor import RegionExtractor, Regions
from pipeline.extract.train_detector import (SceneImage, box_iou, class_table, load_scenes, refcoco_eval_images,
                                             run, score_regions)
from pipeline.common.image_io import decode_image
from pipeline.params.parser import load_params

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

ROOT = Path(__file__).resolve().parents[3]


def write_refs(path: Path, splits: dict[str, str]) -> Path:
    """A RefCOCO+ ``refs(unc).p`` with one ref per ``{"coco/<id>": split}``, plus a ref without its image id."""
    refs = [{"ref_id": k, "image_id": int(key.split("/")[1]), "split": split, "sentences": []}
            for k, (key, split) in enumerate(splits.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(refs + [{"ref_id": len(refs), "split": "testA"}], protocol=2))
    return path


def test_short_training_run_saves_a_usable_detector(tmp_path):
    world = tmp_path / "mini"
    scenes = write_coco_world(world, n_images=8, size=64)
    keys = sorted(scenes)
    # RefCOCO+ is scored on the detector's boxes: its val / test images are not trained on
    refs = write_refs(world / "refcoco+" / "refs(unc).p", {keys[0]: "testA", keys[1]: "train", keys[2]: "val"})
    params = load_params(ROOT / "params.yaml", [
        f"paths.data={tmp_path / 'data'}", f"mini_world.out_dir={world}", "mini_world.image_size=64",
        "extract.train.max_iters=3", "extract.train.ims_per_batch=2", "extract.train.holdout_images=2",
        "extract.train.max_minutes=0", f"sources.refcoco.refs={refs}"], check_paths=False)
    metrics = run(params)
    out = tmp_path / "data" / "models" / "detector"
    assert {p.name for p in out.iterdir()} >= {"model_final.pth", "config.yaml", "metrics.json", "_run.json"}
    record = json.loads((out / "_run.json").read_text())
    assert record["counts"]["iterations"] == 3 and record["counts"]["train_images"] == 4
    assert record["counts"]["holdout_images"] == 2 and record["counts"]["excluded_refcoco_eval_images"] == 2
    excluded = refcoco_eval_images(refs)
    assert excluded == {keys[0], keys[2]}
    train_set, held_set, _ = load_scenes(world, holdout=2, seed=params.seed, exclude=frozenset(excluded))
    assert not excluded & {s.key for s in train_set + held_set} and keys[1] in {s.key for s in train_set + held_set}
    held_objects = sum(len(s["objects"]) for k, s in scenes.items() if k in {sc.key for sc in held_set})
    assert record["quality"]["objects"] == held_objects
    for key in ("recall", "shape_acc", "class_acc"):
        assert 0.0 <= record["quality"][key] <= 1.0 and record["quality"][key] == metrics["quality"][key]
    written = json.loads((out / "metrics.json").read_text())
    assert written["quality"] == record["quality"]
    # wall times live in _run.json only: metrics.json is an output two runs must write identically
    assert "train_seconds" in record["training"] and not {"train_seconds", "seconds_per_iter"} & set(written["training"])

    detector = load_detector("mini", out / "model_final.pth")
    present = {o["category_id"] for sc in scenes.values() for o in sc["objects"]}
    assert detector.class_names == [f"{colour} {shape}" for cid, colour, shape in CATEGORIES if cid in present]
    image = decode_image(world / next(iter(scenes.values()))["path"])
    regions = RegionExtractor(detector).extract([image])[0]
    assert regions.features.shape[1] == 512 and regions.soft_labels.shape[1] == detector.num_classes


def test_holdout_split_is_seeded_and_disjoint(tmp_path):
    write_coco_world(tmp_path, n_images=10, size=48)
    train_a, held_a, table = load_scenes(tmp_path, holdout=3, seed=7)
    train_b, held_b, _ = load_scenes(tmp_path, holdout=3, seed=7)
    assert [s.key for s in held_a] == [s.key for s in held_b] and len(held_a) == 3 and len(train_a) == 7
    assert not {s.key for s in held_a} & {s.key for s in train_a}
    assert [cid for cid, _, _ in table] == sorted(cid for cid, _, _ in table)
    with pytest.raises(ValueError, match="need more than holdout_images"):
        load_scenes(tmp_path, holdout=10, seed=7)


def test_class_table_rejects_an_ambiguous_category():
    scenes = {"coco/1": {"objects": [{"category_id": 3, "colour": "red", "shape": "circle"}]},
              "coco/2": {"objects": [{"category_id": 3, "colour": "blue", "shape": "circle"}]}}
    with pytest.raises(ValueError, match="category 3 means two things"):
        class_table(scenes)


def _regions(boxes, top_labels, num_classes=4):
    soft = np.full((len(boxes), num_classes + 1), 0.01, np.float32)
    soft[np.arange(len(boxes)), top_labels] = 0.9
    return Regions(features=np.zeros((len(boxes), 8), np.float32), boxes=np.array(boxes, np.float32),
                   conf=np.ones(len(boxes), np.float32), soft_labels=soft, attributes=None, image_hw=(100, 100))


def test_scoring_counts_recall_shape_and_class():
    shapes = ["circle", "square", "circle", "square"]  # classes: red circle, red square, blue circle, blue square
    scene = SceneImage(key="coco/1", path=Path("x"), boxes=np.array([[0, 0, 20, 20], [50, 50, 90, 90], [0, 60, 30, 90]],
                                                                   np.float32),
                       classes=np.array([0, 1, 3]), shapes=["circle", "square", "square"])
    regions = _regions(
        [[1, 1, 21, 21],      # object 0, IoU 0.82: label 3 (blue circle) -> right shape, wrong class
         [50, 50, 90, 90],    # object 1, exact: label 2 (red square) -> right shape and class
         [52, 52, 88, 88],    # also object 1 but less overlap: ignored
         [40, 0, 60, 20]],    # nothing
        top_labels=[3, 2, 1, 4])
    got = score_regions([scene], [regions], shapes)
    # object 2 ([0, 60, 30, 90]) is not covered
    assert got["objects"] == 3 and got["recall"] == round(2 / 3, 4)
    assert got["shape_acc"] == round(2 / 3, 4) and got["class_acc"] == round(1 / 3, 4)
    background = _regions([[0, 0, 20, 20]], top_labels=[0])
    assert score_regions([scene], [background], shapes)["shape_acc"] == 0.0


def test_box_iou_reference_values():
    a = np.array([[0, 0, 10, 10]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], np.float32)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 50 / 150, 0.0]], rtol=1e-6)
