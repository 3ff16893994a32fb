"""VQA v2: questions and annotations (10 answers each) on COCO train2014/val2014 images, and a
test2015 questions file on the COCO test2015 images (no annotations, as released).

The test answers exist too, in the val format, but apart: ``vqa/eval_server/`` stands in for the
evaluation server that holds real VQA test answers (``sources.vqa.annotations_test``), so the
pipeline can score the test split here and must do without it on real data."""

from __future__ import annotations

from collections import Counter

import numpy as np

from pipeline.mini_world.task_text import vqa_answers, vqa_question
from pipeline.mini_world.world import World

SUBTYPE = {"train": "train2014", "val": "val2014", "test": "test2015"}  # split -> file name part
EVAL_SERVER = "vqa/eval_server"  # the test answers, outside the released files


def questions_file(split: str) -> str:
    return f"vqa/v2_OpenEnded_mscoco_{SUBTYPE[split]}_questions.json"


def annotations_file(split: str) -> str:
    """The split's answers: test's lie with the stand-in evaluation server, apart from the release."""
    return f"{EVAL_SERVER if split == 'test' else 'vqa'}/v2_mscoco_{SUBTYPE[split]}_annotations.json"


def _questions_doc(subtype: str, questions: list[dict]) -> dict:
    return {"data_subtype": subtype, "data_type": "mscoco", "info": {"description": "mini world VQA v2",
            "version": "2.0", "year": 2017}, "license": {"name": "Mini World License", "url": "https://example.org"},
            "questions": questions, "task_type": "Open-Ended"}


def _annotation(rng: np.random.Generator, item, image_id: int, qid: int) -> dict:
    answers = vqa_answers(rng, item)
    counts = Counter(answers)
    best = max(counts.values())
    # the most common answer; ties go to the true one if it is among them, else alphabetical
    mc = item.answer if counts[item.answer] == best else sorted(a for a, c in counts.items() if c == best)[0]
    return {"answer_type": item.answer_type, "answers": [
        {"answer": a, "answer_confidence": "yes" if a == item.answer else "maybe", "answer_id": k + 1}
        for k, a in enumerate(answers)], "image_id": image_id, "multiple_choice_answer": mc,
        "question_id": qid, "question_type": item.question_type}


def write_image_questions(world: World, rng: np.random.Generator, key: str, split: str, questions: list[dict],
                          annotations: list[dict]) -> None:
    """Up to ``vqa_questions_per_image`` different questions on COCO image ``key`` (with their 10
    answers each), appended to ``questions`` and ``annotations``."""
    image_id = int(key.split("/")[1])
    scene = world.images[key].scene
    seen: set[str] = set()
    for k in range(world.cfg.vqa_questions_per_image):
        item = vqa_question(rng, scene)
        if item.question in seen:
            continue
        seen.add(item.question)
        qid = image_id * 1000 + k
        questions.append({"image_id": image_id, "question": item.question, "question_id": qid})
        annotations.append(_annotation(rng, item, image_id, qid))
    world.use(key, "vqa", split)


def write_vqa(world: World) -> None:
    rng = world.rng("vqa")
    coco = world.info["coco"]
    per_split: dict[str, list[str]] = {"train": [], "val": [], "test": coco["test2015_keys"]}
    for key in coco["keys"]:
        if key not in world.reserved:
            per_split["train" if coco["coco_split"][key] == "train2014" else "val"].append(key)
    for split, keys in per_split.items():
        questions, annotations = [], []
        for key in keys:
            write_image_questions(world, rng, key, split, questions, annotations)
        subtype = SUBTYPE[split]
        if split == "train":
            _plant_defects(world, rng, questions)
        world.write_json(questions_file(split), _questions_doc(subtype, questions))
        world.write_json(annotations_file(split), {
            "annotations": annotations, "data_subtype": subtype, "data_type": "mscoco",
            "info": {"description": "mini world VQA v2", "version": "2.0", "year": 2017},
            "license": {"name": "Mini World License", "url": "https://example.org"}})
        world.counts[f"vqa_{split}_questions"] = len(questions)


def _plant_defects(world: World, rng: np.random.Generator, questions: list[dict]) -> None:
    """A duplicated question_id (the later copy is the bad one) and a question without its text."""
    fname = "vqa/v2_OpenEnded_mscoco_train2014_questions.json"
    first = int(rng.integers(len(questions) // 2))
    victim = questions[first]
    dup = {"image_id": victim["image_id"], "question": "Is this a duplicated question?",
           "question_id": victim["question_id"]}
    nofield = {"image_id": victim["image_id"], "question_id": victim["image_id"] * 1000 + 999}
    for q in (dup, nofield):
        questions.insert(int(rng.integers(first + 1, len(questions) + 1)), q)
    world.defect("vqa", fname, next(i for i, q in enumerate(questions) if q is dup), "question_index", "duplicate_id",
                 f"question_id {victim['question_id']} appears twice")
    world.defect("vqa", fname, next(i for i, q in enumerate(questions) if q is nofield), "question_index",
                 "missing_field", "no 'question'")
