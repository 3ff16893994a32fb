"""``mini_world.refcoco_unseen_kinds``: colour-shape kinds that RefCOCO+'s train split never refers to.

Two small worlds, with and without unseen kinds, are compared file by file: only the train refs
may move, so the pretraining corpus, the images and every val and test expression stay as they were.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from helpers.mini_world import small_config
from pipeline.common.runinfo import file_digest
from pipeline.mini_world import generate
from pipeline.mini_world.refcoco import INSTANCES, REFS, unseen_kinds
from pipeline.mini_world.scenes import CATEGORIES, COLOURS, SHAPES

pytestmark = pytest.mark.stage  # generates two worlds (a few seconds each)

N_UNSEEN = 6
# RefCOCO+'s extra val and test images (eval_extension) too: their refs are written after the train refs
EXTRA = dict(n_refcoco_val_extra=4, n_refcoco_test_extra=4)


def test_unseen_kinds_spread_over_colours_and_shapes():
    assert unseen_kinds(0) == frozenset()
    six = unseen_kinds(6)
    assert sorted(shape for _, shape in six) == sorted(SHAPES)  # one kind of each shape
    assert {colour for colour, _ in six} == set(COLOURS)  # every colour loses at least one kind
    assert unseen_kinds(30) == frozenset(CATEGORIES)  # the order runs through every kind once
    assert unseen_kinds(12) > six  # a larger n keeps the smaller n's kinds


def _refs(world: Path) -> list[dict]:
    return [r for r in pickle.loads((world / REFS).read_bytes()) if "ann_id" in r]


def _kind(ref: dict) -> tuple[str, str]:
    return CATEGORIES[ref["category_id"] - 1]


def _eval_refs(world: Path) -> list[tuple]:
    """Each val / testA / testB ref by content (its ids count on from the train refs before it)."""
    return [(r["split"], r["image_id"], r["ann_id"], tuple(s["sent"] for s in r["sentences"]))
            for r in _refs(world) if r["split"] != "train"]


def _digests(world: Path) -> dict[str, str]:
    return {str(p.relative_to(world)): file_digest(p) for p in sorted(world.rglob("*")) if p.is_file()}


def test_unseen_kinds_leave_the_train_targets_only(tmp_path):
    seen_all, held = tmp_path / "all", tmp_path / "held"
    generate(small_config(seen_all, refcoco_unseen_kinds=0, **EXTRA), 1234, progress=False)
    generate(small_config(held, refcoco_unseen_kinds=N_UNSEEN, **EXTRA), 1234, progress=False)
    unseen = unseen_kinds(N_UNSEEN)

    train_all = [_kind(r) for r in _refs(seen_all) if r["split"] == "train"]
    train_held = [_kind(r) for r in _refs(held) if r["split"] == "train"]
    assert any(k in unseen for k in train_all)  # a world with none unseen refers to them: the switch does something
    assert train_held and not any(k in unseen for k in train_held)

    eval_refs = _eval_refs(held)
    assert eval_refs == _eval_refs(seen_all)
    assert any(_kind(r) in unseen for r in _refs(held) if r["split"] != "train")  # test still asks for them
    assert {split for split, *_ in eval_refs} == {"val", "testA", "testB"}

    # RefCOCO+'s refs and its instances file (the images its refs use) are all that may differ, and
    # the ref ids that planted.json gives RefCOCO+'s two planted defects (they follow the train refs)
    before, after = _digests(seen_all), _digests(held)
    assert before.keys() == after.keys()
    assert {path for path in before if before[path] != after[path]} <= {REFS, INSTANCES, "planted.json"}
    assert _planted_but_ref_ids(seen_all) == _planted_but_ref_ids(held)


def _planted_but_ref_ids(world: Path) -> dict:
    planted = json.loads((world / "planted.json").read_text())
    planted["defects"] = [d | {"locator": None} if d["locator_kind"] == "ref_id" else d for d in planted["defects"]]
    return planted
