"""``python -m pipeline report split-size``: test groups from dev intervals, and RefCOCO+'s test-like
dev items (the mini world's testA / testB shape halves)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from pipeline.training.paired import groups_for_half_width, paired_gain
from pipeline.mini_world.coco import categories
from pipeline.mini_world.refcoco import TEST_A_SHAPES
from pipeline.report.cli import main
from pipeline.report.split_size import restrict, split_sizes, items_like_test

METRIC = "val/det_accuracy"
# a category id of each shape (the mini world's COCO categories)
CATEGORY_OF = {c["supercategory"]: c["id"] for c in categories()}


def _record(ids, groups, scores):
    return {"ids": list(ids), "groups": list(groups), "scores": [float(s) for s in scores]}


def _val_items(n_images: int, refs_per_image: int, seed: int):
    """Item ids, groups, target shapes and both starts' 0/1 scores of a synthetic val split."""
    rng = np.random.default_rng(seed)
    shapes = sorted(CATEGORY_OF)
    ids, groups, shape_of = [], [], {}
    for image in range(n_images):
        for k in range(refs_per_image):
            item = f"val:refcoco:{image * refs_per_image + k}"
            ids.append(item)
            groups.append(f"coco/{1000 + 7 * image}")
            shape_of[item] = shapes[int(rng.integers(len(shapes)))]
    pre = _record(ids, groups, rng.random(len(ids)) < 0.85)
    scr = _record(ids, groups, rng.random(len(ids)) < 0.80)
    return pre, scr, shape_of


def test_restrict_keeps_the_chosen_items_in_their_order():
    rec = _record(["a", "b", "c", "d"], ["g1", "g1", "g2", "g3"], [1, 0, 1, 1])
    assert restrict(rec, {"d", "b"}) == {"ids": ["b", "d"], "groups": ["g1", "g3"], "scores": [0.0, 1.0]}


def test_items_like_test_alternate_over_images_in_the_order_of_their_ids():
    # ids 9 < 10 < 100: numeric order, not the strings' (which would put coco/10 and coco/100 first)
    groups = ["coco/100", "coco/100", "coco/9", "coco/9", "coco/10", "coco/10"]
    ids = [f"val:refcoco:{k}" for k in range(6)]
    a_shape, b_shape = sorted(TEST_A_SHAPES)[0], sorted(set(CATEGORY_OF) - TEST_A_SHAPES)[0]
    shape_of = dict(zip(ids, [a_shape, b_shape] * 3))
    rec = _record(ids, groups, [1] * 6)
    # testA first: image 9 is testA (keeps its testA-shape ref), 10 testB, 100 testA
    assert items_like_test(rec, shape_of, "testA") == {"val:refcoco:2", "val:refcoco:5", "val:refcoco:0"}
    assert items_like_test(rec, shape_of, "testB") == {"val:refcoco:3", "val:refcoco:4", "val:refcoco:1"}


def test_split_sizes_scale_each_dev_interval_to_the_target():
    pre, scr, shape_of = _val_items(60, 6, seed=0)
    rows = split_sizes({"the run": {"pretrained": {METRIC: pre}, "scratch": {METRIC: scr}}}, METRIC, target=2.0,
                       shapes=shape_of)
    assert [r["items"] for r in rows] == ["all", "test-like, testA first", "test-like, testB first"]
    assert rows[0]["interval"] == paired_gain(pre, scr)
    assert rows[0]["test_groups"] == groups_for_half_width(paired_gain(pre, scr), 2.0)
    for r, first in zip(rows[1:], ("testA", "testB")):
        keep = items_like_test(pre, shape_of, first)
        assert r["interval"]["items"] == len(keep) < len(pre["ids"])
        assert r["test_groups"] == groups_for_half_width(paired_gain(restrict(pre, keep), restrict(scr, keep)), 2.0)
    # fewer items an image, wider intervals: the test-like subsets ask for more groups than all of val
    assert min(r["test_groups"] for r in rows[1:]) > rows[0]["test_groups"]


def _write_run(data: Path, runs: dict[str, tuple[dict, dict]], shape_of: dict[str, str]) -> None:
    (data / "metrics").mkdir(parents=True)
    (data / "metrics" / "refcoco_plus.json").write_text(json.dumps({"summary": {"testA+testB/det_accuracy": {}}}))
    for label, (pre, scr) in runs.items():
        where = data / "models" if label == "run" else data / "seeds" / "refcoco_plus" / label / "models"
        (where / "refcoco_plus").mkdir(parents=True)
        scores = {"pretrained": {METRIC: pre}, "scratch": {METRIC: scr}}
        (where / "refcoco_plus" / "item_scores.json").write_text(json.dumps(scores))
    (data / "manifests").mkdir()
    (data / "raw" / "mini").mkdir(parents=True)
    rows = [{"example_id": item.split(":", 1)[1], "split": "val", "category_id": CATEGORY_OF[shape]}
            for item, shape in shape_of.items()]
    pq.write_table(pa.Table.from_pylist(rows), data / "manifests" / "refcoco.parquet")


def test_the_report_gives_the_largest_size_over_the_run_and_its_seeds(tmp_path):
    pre, scr, shape_of = _val_items(40, 6, seed=1)
    pre2, scr2, _ = _val_items(40, 6, seed=2)
    scr2 = {**scr2, "ids": pre["ids"], "groups": pre["groups"]}
    pre2 = {**pre2, "ids": pre["ids"], "groups": pre["groups"]}
    _write_run(tmp_path / "data", {"run": (pre, scr), "seed2": (pre2, scr2)}, shape_of)
    out = io.StringIO()
    assert main(["split-size", "refcoco_plus", "--dir", str(tmp_path / "data")],
                console=Console(file=out, width=200)) == 0
    text = out.getvalue()
    rows = split_sizes({"run": {"pretrained": {METRIC: pre}, "scratch": {METRIC: scr}},
                        "seed 2": {"pretrained": {METRIC: pre2}, "scratch": {METRIC: scr2}}}, METRIC, target=2.0,
                       shapes=shape_of)
    assert re.search(r"largest: (\d+) test groups", text).group(1) == str(max(r["test_groups"] for r in rows))
    assert text.count("seed 2") == 3 and text.count("the run") == 3


def test_the_report_names_what_is_missing(tmp_path):
    out = io.StringIO()
    assert main(["split-size", "nope", "--dir", str(tmp_path)], console=Console(file=out, width=200)) == 1
    assert "unknown task 'nope'" in out.getvalue()
    out = io.StringIO()
    assert main(["split-size", "vqa", "--dir", str(tmp_path)], console=Console(file=out, width=200)) == 1
    assert "metrics/vqa.json not found" in out.getvalue()
