"""pipeline.mini_world: determinism, the real file layouts, and text that agrees with the scenes.

A small world (a few hundred images) is generated once per module. Checks read the files back
the way the real formats are read (json / jsonl / TSV / pickle) and re-derive answers and labels
from scenes.json with parsers written here, independent of the generator's templates.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections import Counter, defaultdict
from dataclasses import fields
from pathlib import Path

import pytest
from PIL import Image

from pipeline.params.parser import load_raw
from pipeline.params.world import SourcesConfig
from helpers.mini_world import small_config
from pipeline.common.runinfo import tree_digest
from pipeline.mini_world import generate
from pipeline.mini_world.flickr30k import PREMISES_PER_IMAGE
from pipeline.mini_world.nlvr2 import STATEMENTS_PER_PAIR
from pipeline.mini_world.vcr import QUESTIONS_PER_IMAGE

pytestmark = pytest.mark.stage  # runs a pipeline stage or trains a model (not in `make test-unit`)

COLOURS = ("red", "green", "blue", "yellow", "purple")
SHAPES = ("circle", "square", "triangle", "diamond", "star", "cross")
NUMBERS = {w: i for i, w in enumerate(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight"))}
PLURAL = {"circles": "circle", "squares": "square", "triangles": "triangle", "diamonds": "diamond", "stars": "star",
          "crosses": "cross", "circle": "circle", "square": "square", "triangle": "triangle", "diamond": "diamond",
          "star": "star", "cross": "cross"}
PARAMS = Path(__file__).resolve().parents[3] / "params.yaml"


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mini") / "world"
    generate(small_config(out), 1234, progress=False)
    return out


@pytest.fixture(scope="module")
def scenes(world_dir) -> dict:
    return json.loads((world_dir / "scenes.json").read_text())


@pytest.fixture(scope="module")
def planted(world_dir) -> dict:
    return json.loads((world_dir / "planted.json").read_text())


def _defect_lines(planted: dict, file: str) -> set[int]:
    return {d["locator"] for d in planted["defects"] if d["file"] == file and d["locator_kind"] == "line"}


def _jsonl(world_dir: Path, rel: str, planted: dict) -> list[dict]:
    bad = _defect_lines(planted, rel)
    rows = []
    for lineno, line in enumerate((world_dir / rel).read_bytes().splitlines(), start=1):
        if lineno in bad:
            continue
        rows.append(json.loads(line))
    return rows


def _count(objs: list[dict], shape=None, colour=None) -> int:
    return sum(1 for o in objs if (shape is None or o["shape"] == shape) and (colour is None or o["colour"] == colour))


# ---------------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_tree_and_other_seed_differs(world_dir, tmp_path):
    again = tmp_path / "again"
    generate(small_config(again), 1234, progress=False)
    assert tree_digest(again) == tree_digest(world_dir)
    # the seed matters (checked on a tiny world to stay fast)
    tiny = dict(image_size=64, n_coco=60, n_vg_only=10, n_flickr30k=40, n_cc=20, n_sbu=20, n_vcr=10, n_nlvr2_pairs=20,
                n_refcoco_images=20, n_planted_each=2)
    digests = set()
    for seed in (1, 2):
        generate(small_config(tmp_path / f"seed{seed}", **tiny), seed, progress=False)
        digests.add(tree_digest(tmp_path / f"seed{seed}"))
    assert len(digests) == 2


# ---------------------------------------------------------------------------------- layout + formats


def test_every_source_path_of_params_exists(world_dir):
    sources = load_raw(PARAMS)["sources"]
    prefix = load_raw(PARAMS)["mini_world"]["out_dir"].rstrip("/") + "/"
    # the keys that name files (sources.download and keys such as variant, image_layout do not)
    path_keys = {(s.name, f.name) for s in fields(SourcesConfig) for f in fields(s.default_factory)
                 if f.metadata.get("must_exist")}
    paths = [v for name, section in sources.items() for k, v in section.items() if (name, k) in path_keys]
    assert len(paths) >= 30
    for p in paths:
        assert p.startswith(prefix), p
        assert (world_dir / p[len(prefix):]).exists(), p


def test_json_files_parse_with_real_fields(world_dir, planted):
    cap = json.loads((world_dir / "coco/annotations/captions_train2014.json").read_text())
    assert {"images", "annotations", "info", "licenses"} <= set(cap)
    assert {"id", "file_name", "coco_url", "flickr_url", "width", "height"} <= set(cap["images"][0])
    inst = json.loads((world_dir / "coco/annotations/instances_val2014.json").read_text())
    assert len(inst["categories"]) == 30
    assert all(c["name"].split()[1] == c["supercategory"] for c in inst["categories"])
    karpathy = json.loads((world_dir / "coco/karpathy/dataset_coco.json").read_text())
    assert Counter(im["split"] for im in karpathy["images"]).keys() == {"train", "restval", "val", "test"}
    for im in karpathy["images"]:
        assert im["filepath"] in ("train2014", "val2014")
        assert (world_dir / "coco/images" / im["filepath"] / im["filename"]).name.startswith(f"COCO_{im['filepath']}_")
    f30k = json.loads((world_dir / "flickr30k/dataset_flickr30k.json").read_text())
    assert Counter(im["split"] for im in f30k["images"]).keys() == {"train", "val", "test"}
    assert all(re.fullmatch(r"\d+\.jpg", im["filename"]) for im in f30k["images"])
    vg = json.loads((world_dir / "vg/image_data.json").read_text())
    assert {"image_id", "coco_id", "flickr_id", "url", "width", "height"} == set(vg[0])
    assert any(r["coco_id"] for r in vg) and any(r["coco_id"] is None for r in vg)
    qs = json.loads((world_dir / "vqa/v2_OpenEnded_mscoco_test2015_questions.json").read_text())["questions"]
    for q in qs:  # VQA test questions are on COCO test2015 images, which have no captions
        assert (world_dir / f"coco/images/test2015/COCO_test2015_{q['image_id']:012d}.jpg").exists()
    assert not (world_dir / "vqa/v2_mscoco_test2015_annotations.json").exists()


def test_jsonl_tsv_and_parallel_text_files(world_dir, planted):
    for rel in ("vcr/train.jsonl", "nlvr2/train.json", "snli_ve/snli_ve_train.jsonl"):
        bad = _defect_lines(planted, rel)
        assert bad, f"{rel} carries planted defects"
        for lineno, line in enumerate((world_dir / rel).read_bytes().splitlines(), start=1):
            reasons = {d["reason"] for d in planted["defects"] if d["file"] == rel and d["locator"] == lineno}
            if "malformed_row" in reasons:
                with pytest.raises(json.JSONDecodeError):
                    json.loads(line)
            else:
                assert isinstance(json.loads(line), dict)
    for rel in ("cc/Train_GCC-training.tsv", "cc/Validation_GCC-1.1.0-Validation.tsv"):
        bad = _defect_lines(planted, rel)
        for lineno, line in enumerate((world_dir / rel).read_bytes().splitlines(), start=1):
            if lineno not in bad:
                caption, url = line.decode("utf-8").split("\t")
                assert caption and url.lower().startswith("http")
    urls = (world_dir / "sbu/SBU_captioned_photo_dataset_urls.txt").read_bytes().splitlines()
    caps = (world_dir / "sbu/SBU_captioned_photo_dataset_captions.txt").read_bytes().splitlines()
    assert len(urls) == len(caps) > 30


class _PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):  # noqa: D401
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def test_refs_pickle_is_plain_containers(world_dir):
    refs = _PlainOnly(io.BytesIO((world_dir / "refcoco+/refs(unc).p").read_bytes())).load()
    assert isinstance(refs, list) and all(type(r) is dict for r in refs)
    assert {r["split"] for r in refs} == {"train", "val", "testA", "testB"}
    inst = json.loads((world_dir / "refcoco+/instances.json").read_text())
    ann_ids = {a["id"] for a in inst["annotations"]}
    assert all(r["ann_id"] in ann_ids for r in refs if "ann_id" in r)
    # a RefCOCO+ image belongs to one split only
    splits = {}
    for r in refs:
        assert splits.setdefault(r["image_id"], r["split"]) == r["split"]


def test_images_decode_at_their_scene_size(world_dir, scenes):
    assert len(scenes) > 300
    for i, (key, sc) in enumerate(sorted(scenes.items())):
        if i % 7:  # every 7th image keeps the test fast
            continue
        with Image.open(world_dir / sc["path"]) as im:
            im.load()
            assert im.size == (sc["width"], sc["height"]), key
        assert sc["path"].endswith(".png") == key.startswith("nlvr2/")
        for o in sc["objects"]:
            x1, y1, x2, y2 = o["box"]
            assert 0 <= x1 < x2 <= sc["width"] and 0 <= y1 < y2 <= sc["height"]


def test_coco_instances_are_the_scene_objects(world_dir, scenes):
    inst = json.loads((world_dir / "coco/annotations/instances_train2014.json").read_text())
    names = {c["id"]: c["name"] for c in inst["categories"]}
    by_image = {}
    for a in inst["annotations"]:
        x, y, w, h = a["bbox"]
        by_image.setdefault(a["image_id"], []).append((names[a["category_id"]], [x, y, x + w, y + h]))
    assert by_image
    for image_id, anns in by_image.items():
        sc = scenes.get(f"coco/{image_id}")
        if sc is None:  # a planted broken image
            continue
        assert sorted(anns) == sorted((f"{o['colour']} {o['shape']}", o["box"]) for o in sc["objects"])


# ---------------------------------------------------------------------------------- text vs scenes


def test_vqa_answers_follow_from_the_scene(world_dir, scenes, planted):
    """Train and val annotations as released, test ones from the stand-in evaluation server."""
    for subtype, folder in (("train2014", "vqa"), ("val2014", "vqa"), ("test2015", "vqa/eval_server")):
        rel = f"vqa/v2_OpenEnded_mscoco_{subtype}_questions.json"
        qs = json.loads((world_dir / rel).read_text())["questions"]
        anns = json.loads((world_dir / f"{folder}/v2_mscoco_{subtype}_annotations.json").read_text())["annotations"]
        by_qid = {a["question_id"]: a for a in anns}
        assert len(by_qid) == len(anns) and {a["image_id"] for a in anns} <= {q["image_id"] for q in qs}
        bad = {d["locator"] for d in planted["defects"] if d["file"] == rel}
        assert len(bad) == (2 if subtype == "train2014" else 0)
        checked = Counter()
        for idx, q in enumerate(qs):
            if idx in bad:
                continue
            a = by_qid[q["question_id"]]
            assert len(a["answers"]) == 10
            objs = scenes[f"coco/{q['image_id']}"]["objects"]
            text, mc = q["question"], a["multiple_choice_answer"]
            if m := re.fullmatch(r"How many (\w+) shapes are there\?", text):
                assert int(mc) == _count(objs, colour=m.group(1)), text
            elif m := re.fullmatch(r"How many (\w+) are there\?", text):
                assert int(mc) == _count(objs, shape=PLURAL[m.group(1)]), text
            elif text == "How many shapes are in the picture?":
                assert int(mc) == len(objs)
            elif m := re.fullmatch(r"What color is the (\w+)\?", text):
                assert [o["colour"] for o in objs if o["shape"] == m.group(1)] == [mc]
            elif m := re.fullmatch(r"Is there an? (\w+) (\w+)\?", text):
                assert mc == ("yes" if _count(objs, colour=m.group(1), shape=m.group(2)) else "no")
            else:
                assert re.fullmatch(r"Is the \w+ (to the left of|to the right of|above|below) the \w+\?", text)
                continue
            checked[a["answer_type"]] += 1
            agree = sum(x["answer"] == mc for x in a["answers"])
            assert agree >= 6
        if subtype == "test2015":  # every test question has its answers there
            assert len(anns) == len(qs) and sum(checked.values()) > len(qs) / 2
        else:
            assert checked["number"] > 10 and checked["yes/no"] > 10 and checked["other"] > 3
    # annotators mostly agree, but not always
    all_agree = [len({x["answer"] for x in a["answers"]}) == 1 for a in anns]
    assert 0.2 < sum(all_agree) / len(all_agree) < 0.9


def _phrase_objects(text: str) -> list[tuple[str, str]]:
    """Every "<colour> <shape>" mentioned in ``text``."""
    return re.findall(rf"\b({'|'.join(COLOURS)}) ({'|'.join(SHAPES)})", text.lower())


def test_captions_and_regions_mention_only_what_is_there(world_dir, scenes):
    karpathy = json.loads((world_dir / "coco/karpathy/dataset_coco.json").read_text())
    seen = 0
    for im in karpathy["images"]:
        sc = scenes.get(f"coco/{im['cocoid']}")
        if sc is None:
            continue
        present = {(o["colour"], o["shape"]) for o in sc["objects"]}
        for s in im["sentences"]:
            assert set(_phrase_objects(s["raw"])) <= present, s["raw"]
            if m := re.match(r"(\w+) shapes on a", s["raw"].lower()):
                assert NUMBERS[m.group(1)] == len(sc["objects"])
            seen += 1
    assert seen > 400
    regions = json.loads((world_dir / "vg/region_descriptions.json").read_text())
    for img in regions:
        sc = scenes.get(f"vg/{img['id']}")
        if sc is None:
            continue
        boxes = {(o["colour"], o["shape"], tuple(o["box"])) for o in sc["objects"]}
        for r in img["regions"]:
            found = _phrase_objects(r.get("phrase", ""))
            if len(found) == 1:  # a single-object phrase is that object's box
                box = (r["x"], r["y"], r["x"] + r["width"], r["y"] + r["height"])
                assert (*found[0], box) in boxes, r


def test_nlvr2_labels_follow_from_the_pair(world_dir, scenes, planted):
    total = Counter()
    for fsplit in ("train", "dev", "test1"):
        for row in _jsonl(world_dir, f"nlvr2/{fsplit}.json", planted):
            if "sentence" not in row or row["label"] not in ("True", "False"):
                continue
            stem = row["identifier"].rsplit("-", 1)[0]
            left = scenes[f"nlvr2/{stem}-img0"]["objects"]
            right = scenes[f"nlvr2/{stem}-img1"]["objects"]
            assert _nlvr2_truth(row["sentence"], left, right) == (row["label"] == "True"), row["sentence"]
            total[row["label"]] += 1
    assert min(total.values()) / sum(total.values()) > 0.3


def _nlvr2_truth(s: str, a: list[dict], b: list[dict]) -> bool:
    if m := re.fullmatch(r"The (left|right) image contains an? (\w+) (\w+)\.", s):
        return _count(a if m.group(1) == "left" else b, colour=m.group(2), shape=m.group(3)) > 0
    if m := re.fullmatch(r"Both images contain at least one (\w+)\.", s):
        return _count(a, shape=m.group(1)) > 0 and _count(b, shape=m.group(1)) > 0
    if m := re.fullmatch(r"There (?:is|are) exactly (\w+) (\w+) in total\.", s):
        shape = PLURAL[m.group(2)]
        return _count(a, shape=shape) + _count(b, shape=shape) == NUMBERS[m.group(1)]
    if s == "The left image has more shapes than the right image.":
        return len(a) > len(b)
    if m := re.fullmatch(r"Exactly one image contains (\w+) shapes\.", s):
        return (_count(a, colour=m.group(1)) > 0) != (_count(b, colour=m.group(1)) > 0)
    if m := re.fullmatch(r"There are more (\w+) shapes in the right image than in the left image\.", s):
        return _count(b, colour=m.group(1)) > _count(a, colour=m.group(1))
    raise AssertionError(f"unexpected statement {s!r}")


def test_snli_ve_labels_follow_from_the_image(world_dir, scenes, planted):
    labels = Counter()
    for split in ("train", "dev", "test"):
        for row in _jsonl(world_dir, f"snli_ve/snli_ve_{split}.jsonl", planted):
            if "sentence2" not in row or row["gold_label"] == "-":
                continue
            objs = scenes[f"flickr30k/{row['Flikr30kID'][:-4]}"]["objects"]
            h, label = row["sentence2"], row["gold_label"]
            labels[label] += 1
            if m := re.fullmatch(r"There is an? (\w+) (\w+)\.", h):
                assert (_count(objs, colour=m.group(1), shape=m.group(2)) > 0) == (label == "entailment"), h
            elif m := re.fullmatch(r"There (?:is|are) (\w+) shapes? in the picture\.", h):
                assert (NUMBERS[m.group(1)] == len(objs)) == (label == "entailment"), h
            elif m := re.fullmatch(r"The (\w+) is (\w+)\.", h):
                assert ([o["colour"] for o in objs if o["shape"] == m.group(1)][0] == m.group(2)) == (
                    label == "entailment"), h
            elif re.fullmatch(r"The \w+ \w+ is (to the left of|to the right of|above|below) the \w+ \w+\.", h):
                assert label in ("entailment", "contradiction")
            else:
                assert label == "neutral", h
    assert labels["entailment"] == labels["neutral"] == labels["contradiction"] > 30


def _area(o: dict) -> int:
    return (o["box"][2] - o["box"][0]) * (o["box"][3] - o["box"][1])


def _referents(words: list[str], objs: list[dict]) -> list[dict]:
    """The objects a RefCOCO+ expression can mean, read from the scene alone."""
    if "same" in words:  # "<shape> the same colour as the <shape>" / "<colour> one the same shape as the <colour> one"
        head, anchor_words = words[: words.index("same") - 1], words[words.index("as") + 2:]
        attr = words[words.index("same") + 1]
        anchors = [o for o in objs if all(o["shape"] == w or o["colour"] == w for w in anchor_words if w != "one")]
        assert len(anchors) == 1, words
        want = {"shape": head[0]} if head[0] in SHAPES else {"colour": head[0]}
        want[attr] = anchors[0][attr]
        return [o for o in objs if all(o[k] == v for k, v in want.items())]
    colour = next((w for w in words if w in COLOURS), None)
    shape = next((w for w in words if w in SHAPES), None)
    cands = [o for o in objs if (colour is None or o["colour"] == colour) and (shape is None or o["shape"] == shape)]
    if words[0] in ("biggest", "smallest"):  # of all that share the shape (or colour), clearly
        ranked = sorted(cands, key=_area, reverse=words[0] == "biggest")
        assert len(ranked) > 1, words
        first, second = _area(ranked[0]), _area(ranked[1])
        assert max(first, second) > 1.3 * min(first, second), words
        return ranked[:1]
    if len(cands) > 1:  # "bigger/smaller" decide between two of a kind
        pick = max if words[0] in ("bigger", "large") else min
        assert len(cands) == 2 and words[0] in ("bigger", "large", "smaller", "small"), words
        cands = [pick(cands, key=_area)]
    return cands


def _check_refcoco_expressions(world_dir: Path, scenes: dict) -> Counter:
    """Every expression means its target and nothing else; returns the count per first word."""
    refs = pickle.loads((world_dir / "refcoco+/refs(unc).p").read_bytes())
    anns = {a["id"]: a for a in json.loads((world_dir / "refcoco+/instances.json").read_text())["annotations"]}
    first_words = Counter()
    for r in refs:
        if "ann_id" not in r:
            continue
        objs = scenes[f"coco/{r['image_id']}"]["objects"]
        x, y, w, h = anns[r["ann_id"]]["bbox"]
        target = next(o for o in objs if o["box"] == [x, y, x + w, y + h])
        for s in r["sentences"]:
            words = s["sent"].split()
            if not words:
                continue
            assert not {"left", "right", "top", "bottom", "above", "below"} & set(words)  # RefCOCO+: no location
            assert _referents(words, objs) == [target], (s["sent"], r["ref_id"])
            first_words["same" if "same" in words else words[0]] += 1
    return first_words


def test_refcoco_expressions_pick_out_their_object(world_dir, scenes):
    first_words = _check_refcoco_expressions(world_dir, scenes)
    assert sum(first_words.values()) > 50
    assert not {"biggest", "smallest", "same"} & set(first_words)  # the default names, it does not compare


def test_comparing_refcoco_expressions_pick_out_their_object(tmp_path):
    out = tmp_path / "world"
    generate(small_config(out, refcoco_expressions="comparing"), 1234, progress=False)
    first_words = _check_refcoco_expressions(out, json.loads((out / "scenes.json").read_text()))
    compared = first_words["biggest"] + first_words["smallest"] + first_words["same"]
    assert first_words["same"] > 0 and compared > 0.15 * sum(first_words.values()), first_words


def _relation(a: dict, b: dict) -> str:
    ax, ay = (a["box"][0] + a["box"][2]) / 2, (a["box"][1] + a["box"][3]) / 2
    bx, by = (b["box"][0] + b["box"][2]) / 2, (b["box"][1] + b["box"][3]) / 2
    if abs(ax - bx) >= abs(ay - by):
        return "to the left of" if ax < bx else "to the right of"
    return "above" if ay < by else "below"


def test_vcr_right_choices_agree_with_the_boxes(world_dir, scenes, planted):
    """Train and val labels as released; test labels only in the stand-in leaderboard's file."""
    test = _jsonl(world_dir, "vcr/test.jsonl", planted)
    labels = {r["annot_id"]: r for r in _jsonl(world_dir, "vcr/eval_server/test_labels.jsonl", planted)}
    assert test and sorted(labels) == sorted(r["annot_id"] for r in test)
    assert not any("answer_label" in r or "rationale_label" in r for r in test)
    assert all(set(r) == {"annot_id", "answer_label", "rationale_label"} for r in labels.values())
    test = [r | labels[r["annot_id"]] for r in test]
    rows = _jsonl(world_dir, "vcr/train.jsonl", planted) + _jsonl(world_dir, "vcr/val.jsonl", planted) + test
    kinds = Counter()
    for row in rows:
        if "answer_choices" not in row:
            continue
        meta = json.loads((world_dir / "vcr/vcr1images" / row["metadata_fn"]).read_text())
        assert meta["names"] == row["objects"] and len(meta["boxes"]) == len(row["objects"])
        assert len(row["answer_choices"]) == len(row["rationale_choices"]) == 4
        if f"vcr/{row['img_fn']}" not in scenes:  # the planted missing image
            assert not (world_dir / "vcr/vcr1images" / row["img_fn"]).exists()
            continue
        objs = scenes[f"vcr/{row['img_fn']}"]["objects"]
        assert [o["box"] for o in objs] == [b[:4] for b in meta["boxes"]]
        right = row["answer_choices"][row["answer_label"]]
        why = row["rationale_choices"][row["rationale_label"]]
        if row["question"][:2] == ["What", "color"]:
            i = row["question"][3][0]
            assert right[0] == [i] and objs[i]["colour"] == right[2]
            assert objs[i]["shape"] == row["objects"][i]
            assert why[1] == [i] and why[-3:-1] == [objs[i]["colour"], objs[i]["shape"]]
            kinds["colour"] += 1
        else:
            i, j = row["question"][2][0], row["question"][5][0]
            assert " ".join(right[1:-2]) == "is " + _relation(objs[i], objs[j]), (right, objs[i], objs[j])
            # "Because [i] is a <shape> <relation> [j] .": the answer's relation and [i]'s shape
            assert why[1] == [i] and why[-2] == [j] and why[4] == objs[i]["shape"], (why, objs[i])
            assert " ".join(why[5:-2]) == _relation(objs[i], objs[j])
            kinds["relation"] += 1
        wrong = [c for k, c in enumerate(row["answer_choices"]) if k != row["answer_label"]]
        assert right not in wrong
        assert why not in [c for k, c in enumerate(row["rationale_choices"]) if k != row["rationale_label"]]
    assert kinds["colour"] > 5 and kinds["relation"] > 5



def test_eval_images_carry_several_texts(world_dir, planted):
    """Bigger eval splits at no extra images: NLVR2 pairs, VCR images and SNLI-VE images carry several texts each."""
    sentences = defaultdict(list)
    for row in _jsonl(world_dir, "nlvr2/dev.json", planted) + _jsonl(world_dir, "nlvr2/test1.json", planted):
        sentences[row["identifier"].rsplit("-", 1)[0]].append(row["sentence"])
    assert sentences and all(len(set(s)) == len(s) == STATEMENTS_PER_PAIR for s in sentences.values())
    questions = defaultdict(list)
    for row in _jsonl(world_dir, "vcr/val.jsonl", planted):
        questions[row["img_fn"]].append(json.dumps(row["question"]))
    assert questions and all(len(set(q)) == len(q) <= QUESTIONS_PER_IMAGE for q in questions.values())
    assert sum(len(q) == QUESTIONS_PER_IMAGE for q in questions.values()) > len(questions) / 2
    premises = defaultdict(set)
    for row in _jsonl(world_dir, "snli_ve/snli_ve_test.jsonl", planted):
        premises[row["Flikr30kID"]].add(row["captionID"])
    assert premises and {len(p) for p in premises.values()} == {PREMISES_PER_IMAGE}
