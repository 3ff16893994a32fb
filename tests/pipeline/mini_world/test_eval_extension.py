"""pipeline.mini_world.eval_extension: extra VQA, RefCOCO+, VCR, NLVR2 and SNLI-VE test items and RefCOCO+ val
items move nothing written before them, and are eval items of their tasks (RefCOCO+'s: eval images that
decontamination must remove)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers.mini_world import ingest_and_decontaminate, small_config
from pipeline.mini_world import generate
from pipeline.mini_world.nlvr2 import STATEMENTS_PER_PAIR
from pipeline.mini_world.coco import TEST2015_INFO
from pipeline.mini_world.flickr30k import PREMISES_PER_IMAGE, SNLI_VE_TEST
from pipeline.mini_world.refcoco import INSTANCES, REFS, TEST_A_SHAPES
from pipeline.mini_world.eval_extension import COCO_TRAIN, KARPATHY
from pipeline.mini_world.vcr import QUESTIONS_PER_IMAGE, TEST_LABELS
from pipeline.mini_world.vqa import annotations_file, questions_file

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

LINE_FILES = ("vcr/test.jsonl", TEST_LABELS, "nlvr2/test1.json", SNLI_VE_TEST)  # grown at their end
# JSON files whose lists grow at their end
JSON_FILES = (TEST2015_INFO, questions_file("test"), annotations_file("test"), *COCO_TRAIN.values(), KARPATHY,
              INSTANCES)


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("extension")
    generate(small_config(root / "plain"), 1234, progress=False)
    generate(small_config(root / "grown", n_vqa_test_extra=5, n_refcoco_test_extra=4, n_vcr_test_extra=4,
                          n_nlvr2_test_extra_pairs=3, n_snli_ve_test_extra=2, n_refcoco_val_extra=3), 1234,
             progress=False)
    # the same val items without RefCOCO+'s test ones: re-sizing test (sized from dev) does not move dev
    generate(small_config(root / "val_only", n_vqa_test_extra=5, n_refcoco_val_extra=3), 1234, progress=False)
    return root / "plain", root / "grown", root / "val_only"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != "_run.json"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_every_file_written_before_the_extension_stays_byte_for_byte(worlds):
    plain, grown = map(_files, worlds[:2])
    new = set(grown) - set(plain)
    assert set(plain) <= set(grown)
    assert {k for k in plain if plain[k] != grown[k]} == {*LINE_FILES, *JSON_FILES, REFS, "scenes.json",
                                                          "planted.json"}
    for name in LINE_FILES:
        assert grown[name].startswith(plain[name]) and len(grown[name]) > len(plain[name])
    for name in JSON_FILES:
        before, after = json.loads(plain[name]), json.loads(grown[name])
        grown_lists = [k for k, v in before.items() if isinstance(v, list) and v and before[k] != after[k]]
        assert grown_lists, name
        for key in grown_lists:
            assert after[key][:len(before[key])] == before[key] and len(after[key]) > len(before[key])
        assert {k: v for k, v in after.items() if k not in grown_lists} == \
            {k: v for k, v in before.items() if k not in grown_lists}
    assert all(n.startswith(("vcr/vcr1images/", "nlvr2/images/test1/", "coco/images/test2015/",
                             "coco/images/train2014/", "flickr30k/flickr30k-images/")) for n in new)
    assert len([n for n in new if n.startswith("flickr30k/")]) == 2
    assert len([n for n in new if n.startswith("coco/images/test2015/")]) == 5
    assert len([n for n in new if n.startswith("coco/images/train2014/")]) == 4 + 3
    assert len([n for n in new if n.endswith(".jpg") and n.startswith("vcr/")]) == 4
    assert len([n for n in new if n.endswith(".png")]) == 6
    before, after = json.loads(plain["planted.json"]), json.loads(grown["planted.json"])
    added = [o for o in after["overlaps"] if o not in before["overlaps"]]
    assert {k: v for k, v in after.items() if k != "overlaps"} == {k: v for k, v in before.items() if k != "overlaps"}
    assert len(after["overlaps"]) == len(before["overlaps"]) + 4 + 3  # only RefCOCO+'s COCO images, to be removed
    assert {(o["dataset"], o["reason"]) for o in added} == {("coco", "eval_split")}


def test_the_extra_items_are_test_items_with_labels_held_by_the_leaderboard(worlds):
    plain, grown, _ = worlds
    old, new = _jsonl(plain / "vcr/test.jsonl"), _jsonl(grown / "vcr/test.jsonl")
    added = new[len(old):]
    assert 4 <= len(added) <= 4 * QUESTIONS_PER_IMAGE
    assert [r["annot_id"] for r in new] == [f"test-{k}" for k in range(len(new))]  # one numbering, no clash
    assert all("answer_label" not in r and "rationale_label" not in r for r in added)
    labels = _jsonl(grown / TEST_LABELS)
    assert [x["annot_id"] for x in labels] == [r["annot_id"] for r in new]
    assert len({r["img_fn"] for r in added}) == 4 and not {r["img_fn"] for r in added} & {r["img_fn"] for r in old}

    old_pairs, new_pairs = _jsonl(plain / "nlvr2/test1.json"), _jsonl(grown / "nlvr2/test1.json")
    added_pairs = {r["identifier"].rsplit("-", 2)[0] for r in new_pairs[len(old_pairs):]}
    assert len(added_pairs) == 3 and len(new_pairs) - len(old_pairs) <= 3 * STATEMENTS_PER_PAIR
    assert not added_pairs & {r["identifier"].rsplit("-", 2)[0] for r in old_pairs}
    assert all(r["label"] in ("True", "False") for r in new_pairs)
    scenes = json.loads((grown / "scenes.json").read_text())
    for pair in added_pairs:  # every image a statement is about exists, with its scene graph
        for side in (0, 1):
            key = f"nlvr2/{pair}-0-img{side}"
            assert key in scenes and (grown / scenes[key]["path"]).exists()


def test_the_extra_snli_ve_photos_are_test_items_outside_retrievals_gallery(worlds):
    plain, grown, _ = worlds
    old, new = _jsonl(plain / SNLI_VE_TEST), _jsonl(grown / SNLI_VE_TEST)
    added = new[len(old):]
    photos = {r["Flikr30kID"] for r in added}
    assert len(photos) == 2 and len(added) == 2 * PREMISES_PER_IMAGE * 3
    assert not photos & {r["Flikr30kID"] for r in old}
    assert len({r["pairID"] for r in new}) == len(new)
    assert all(r["gold_label"] in ("entailment", "neutral", "contradiction") for r in added)
    karpathy = json.loads((grown / "flickr30k/dataset_flickr30k.json").read_text())["images"]
    assert not photos & {im["filename"] for im in karpathy}  # retrieval's gallery and training set stay
    assert all((grown / "flickr30k/flickr30k-images" / p).exists() for p in photos)


def test_the_extra_vqa_images_have_new_ids_and_answered_questions(worlds):
    plain, grown, _ = worlds
    old = {im["id"] for im in json.loads((plain / TEST2015_INFO).read_text())["images"]}
    images = json.loads((grown / TEST2015_INFO).read_text())["images"]
    added = {im["id"] for im in images} - old
    assert len(added) == 5 and len(images) == len(old) + 5
    scenes = json.loads((plain / "scenes.json").read_text())
    every_coco = {int(k.split("/")[1]) for k in scenes if k.startswith("coco/")}
    assert not added & every_coco  # no id of any COCO image of the world, train, val or test
    questions = json.loads((grown / questions_file("test")).read_text())["questions"]
    answers = json.loads((grown / annotations_file("test")).read_text())["annotations"]
    assert [q["question_id"] for q in questions] == [a["question_id"] for a in answers]
    assert len({q["question_id"] for q in questions}) == len(questions)
    assert {q["image_id"] for q in questions} == {im["id"] for im in images}
    assert all(len(a["answers"]) == 10 for a in answers)


def _refs(world: Path) -> list[dict]:
    return pickle.loads((world / REFS).read_bytes())


def test_the_extra_refcoco_images_are_val_images_then_test_images_of_both_halves(worlds):
    plain, grown, val_only = worlds
    old, refs = _refs(plain), _refs(grown)
    assert refs[:len(old)] == old
    # the val images come before the test ones, and are those of a world without extra test images
    assert refs[:len(_refs(val_only))] == _refs(val_only) and len(_refs(val_only)) > len(old)
    assert [r["ref_id"] for r in refs] == list(range(len(refs)))
    sent_ids = [s["sent_id"] for r in refs for s in r["sentences"]]
    assert sent_ids == list(range(len(sent_ids)))
    added = refs[len(old):]
    by_split = {split: {r["image_id"] for r in added if r["split"] == split} for split in ("testA", "testB", "val")}
    assert {r["split"] for r in added} == set(by_split)
    assert [len(by_split[s]) for s in ("testA", "testB", "val")] == [2, 2, 3]
    images = set().union(*by_split.values())
    assert len(images) == 7 and not images & {r["image_id"] for r in old}
    assert [r["split"] for r in added] == sorted((r["split"] for r in added), key=lambda s: s != "val")
    instances = json.loads((grown / INSTANCES).read_text())["annotations"]
    for r in added:
        category = next(a["category_id"] for a in instances if a["id"] == r["ann_id"])
        assert category == r["category_id"]
    scenes = json.loads((grown / "scenes.json").read_text())
    for r in added:  # testA's targets are the first shapes, testB's the others, as in the world's own refs
        shapes = {o["shape"] for o in scenes[f"coco/{r['image_id']}"]["objects"]}
        if r["split"] != "val":
            assert shapes & TEST_A_SHAPES if r["split"] == "testA" else shapes - TEST_A_SHAPES
    karpathy = json.loads((grown / KARPATHY).read_text())["images"]
    assert [im["imgid"] for im in karpathy] == list(range(len(karpathy)))
    assert {im["cocoid"] for im in karpathy if im["split"] == "train"} >= images


@pytest.mark.slow
def test_pretraining_data_is_the_same_with_and_without_them(worlds, tmp_path):
    """Through the real ingest and decontaminate stages: the cleaned pretraining manifests of both
    worlds hold the same rows (RefCOCO+'s extra COCO images are removed as eval images)."""
    plain, grown = (ingest_and_decontaminate(world, tmp_path / world.name) for world in worlds[:2])

    def rows(data: Path, world: Path, dataset: str) -> list[dict]:  # image paths relative to their world
        table = pq.read_table(data / "clean" / f"{dataset}.parquet").to_pylist()
        return [r | {"image_path": str(Path(r["image_path"]).relative_to(world))} for r in table]

    for dataset in ("coco", "vg", "cc", "sbu"):
        assert rows(grown, worlds[1], dataset) == rows(plain, worlds[0], dataset), dataset
    report = json.loads((grown / "reports" / "cleaning" / "coco.json").read_text())
    refcoco_extra = {r["image_id"] for r in _refs(worlds[1])} - {r["image_id"] for r in _refs(worlds[0])}
    removed = {e["image_id"]: e["reason"] for e in report["removed"]}
    assert {str(i) for i in refcoco_extra} <= set(removed)
    assert {removed[str(i)] for i in refcoco_extra} == {"eval_split"}
